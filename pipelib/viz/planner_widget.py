"""The planner as a widget (chapter 15): pick a model, a GPU, a number of GPUs and a global batch;
see the ranking and each plan's itemised step.

    ui = planner_widget()            # in JupyterLab: dropdowns and sliders; every change re-plans
    ui.best[0]                       # the fastest feasible plan (a `Candidate`), as `search` ranks it

Every change calls `pipelib.planner.search.search` (thousands of plans in under a second) and
redraws `plans_figure` with the best ones and `explain` of the first. In the static book, where no
kernel runs the callbacks, `plans_explorer_figure`'s menu does the same over fixed scenarios.
"""
from __future__ import annotations

from types import MappingProxyType

import ipywidgets as widgets

from pipelib.costmodel import LINKS, PROFILES
from pipelib.planner.search import explain, search
from pipelib.planner.spec import GPT3_175B, LLAMA3_70B, Machine
from pipelib.viz.display import figure_bundle
from pipelib.viz.mesh import plans_figure

MODELS = MappingProxyType({m.name: m for m in (GPT3_175B, LLAMA3_70B)})
GPUS = ("a100", "h100")


class PlannerWidget(widgets.VBox):
    """Controls, the best plan explained, and the ranking's itemised bars."""

    def __init__(self, model: str = GPT3_175B.name, gpu: str = "a100", n_devices: int = 1024,
                 global_batch: int = 1536, top: int = 8):
        if model not in MODELS or gpu not in GPUS:
            raise ValueError(f"planner_widget: model={model!r}, gpu={gpu!r}; use a model of {list(MODELS)} "
                             f"and a gpu of {list(GPUS)}")
        self.top, self.best = top, []
        self.controls = dict(
            model=widgets.Dropdown(options=list(MODELS), value=model, description="model"),
            gpu=widgets.Dropdown(options=list(GPUS), value=gpu, description="GPU"),
            n_devices=widgets.SelectionSlider(options=[2 ** k for k in range(3, 15)], value=n_devices,
                                              description="GPUs", continuous_update=False),
            global_batch=widgets.IntText(value=global_batch, description="global batch"))
        for w in self.controls.values():
            w.observe(lambda _: self.redraw(), names="value")
        self.summary, self.output = widgets.HTML(), widgets.Output()
        super().__init__([widgets.HBox(list(self.controls.values())), self.summary, self.output])
        self.redraw()

    def redraw(self) -> None:
        c = {k: w.value for k, w in self.controls.items()}
        machine = Machine(PROFILES[c["gpu"]], gpus_per_node=8, inter_node=LINKS["ib-ndr"])
        try:
            self.best = search(MODELS[c["model"]], machine, c["n_devices"], c["global_batch"])[:self.top]
        except ValueError as e:  # said in the widget, not raised into a callback nobody reads
            self.best, why = [], f": {e}"
        else:
            why = ""
        self.summary.value = ("<pre>" + explain(self.best[0]) + "</pre>") if self.best else (
            f"<b>no plan fits</b> {c['model']} on {c['n_devices']} {c['gpu']} GPUs with a global batch of "
            f"{c['global_batch']}{why}")
        self.output.outputs = ({"output_type": "display_data", "data": figure_bundle(plans_figure(self.best)),
                                "metadata": {}},) if self.best else ()   # works with or without a kernel


def planner_widget(**kw) -> PlannerWidget:
    """The widget, drawn with the first choice made (`PlannerWidget`'s keywords)."""
    return PlannerWidget(**kw)
