"""The schedule explorer: pick a schedule, p, m, v and cost ratios; see its timeline and memory.

Chapter 12 introduces it (GPipe, 1F1B, interleaved) and chapter 13 uses it again (ZB-H1, ZB-V,
DualPipeV). Three layers, each usable alone:

- `Setting` -> `predict` -> `summary_html` / `explorer_figures`: pure. `simulate` plays the
  schedule; nothing is drawn by hand. `explorer_sweep` turns one parameter's values into plotly
  frames, so the static book (where no widget callback runs) still gets the slider.
- `measure(cluster, setting)`: one training step of the same schedule on the cluster, with
  every op given the modelled duration the prediction used, set beside `simulate`.
- `Explorer` (what `explorer(...)` returns), an ipywidgets VBox wiring sliders to the above.

Time is counted in forwards: F is one unit (1 ms simulated, "F" in the summary and figures:
`f_units`), B = b_ratio F, and schedules that split the backward (Qi et al. 2023) run
I = (1 - w_share) B then W = w_share B. A message takes p2p_ratio F. A stage split into v chunks
(interleaved, V placements) costs 1/v per chunk (`Costs.scaled`), so every schedule does the
same work per rank and the timelines compare.
"""
from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, replace

import ipywidgets as widgets

from pipelib.checks import check_number
from pipelib.pipeline.schedules import REGISTRY, Schedule, make_schedule, schedule_info
from pipelib.pipeline.simulate import Costs, SimResult, bubble_closed_form, simulate
from pipelib.trace import Kind, Trace
from pipelib.viz.display import Units, figure_bundle, short_number
from pipelib.viz.timeline import memory_figure, sweep_figure, timeline_figure

__all__ = ["Setting", "predict", "summary_html", "explorer_figures", "explorer_sweep",
           "measure", "Measurement", "Explorer", "explorer"]

F_SECONDS = 1e-3  # one forward, in the predicted figures


@dataclass(frozen=True)
class Setting:
    """Everything the explorer's controls set: a schedule by name, sizes and cost ratios."""

    schedule: str = "1f1b"
    p: int = 4
    m: int = 8
    num_chunks: int = 2      # v, for chunked schedules (`ScheduleInfo.chunked`); V ones have 2
    b_ratio: float = 2.0     # B / F
    w_share: float = 0.5     # W / B when the backward is split into I then W
    p2p_ratio: float = 0.0   # one message / F

    def build(self) -> Schedule:
        """The schedule, from its generator; a ValueError names what to change."""
        return make_schedule(self.schedule, self.p, self.m, self.num_chunks)

    def costs(self, v: int, f: float = F_SECONDS, *, p2p=None, message_bytes: int = 0) -> Costs:
        """Seconds per op of one chunk (a stage's cost / v); activation_bytes=1 counts them."""
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                 for x in (self.b_ratio, self.w_share, self.p2p_ratio))
        if not (ok and self.b_ratio >= 0 and 0 <= self.w_share <= 1 and self.p2p_ratio >= 0):
            raise ValueError(f"need finite b_ratio >= 0, 0 <= w_share <= 1, p2p_ratio >= 0; got "
                             f"b_ratio={self.b_ratio!r}, w_share={self.w_share!r}, p2p_ratio={self.p2p_ratio!r}")
        check_number(f, "f", positive=True, context="Setting.costs", hint="seconds of one forward")
        b = self.b_ratio * f
        c = Costs(F=f, B=b, I=(1 - self.w_share) * b, W=self.w_share * b,
                  p2p=self.p2p_ratio * f if p2p is None else p2p, message_bytes=message_bytes)
        return replace(c.scaled(1 / v), activation_bytes=1)


def predict(setting: Setting, f: float = F_SECONDS) -> SimResult:
    """Simulate the setting (pure, milliseconds): timeline, bubble, activations held per rank."""
    s = setting.build()
    return simulate(s, setting.costs(s.num_chunks, f))


def closed_form(setting: Setting, result: SimResult) -> tuple[float | None, str]:
    """The bubble's formula (`bubble_closed_form`, free messages) or None and why there is none."""
    try:
        v = result.schedule.num_chunks
        return bubble_closed_form(setting.schedule, setting.p, setting.m, v, costs=result.costs), ""
    except ValueError as e:
        return None, str(e)


def f_units(result: SimResult) -> Units:
    """The predicted figures' time unit: one stage's forward F (v chunks of result.costs.F)."""
    return Units("F", 1 / (result.costs.F * result.schedule.num_chunks))


def summary_html(setting: Setting, result: SimResult) -> str:
    """One line: the bubble simulated and from its formula, the step, peak activations per rank."""
    v, unit = result.schedule.num_chunks, f_units(result)  # the timeline's title writes the same
    form, why = closed_form(setting, result)
    form_txt = (f"closed form {form:.1%} (free messages)" if form is not None else
                f'<span title="{html.escape(why)}">no closed form here</span>')
    peaks = ", ".join(f"{n / v:g}" for n in result.peak_inflight)
    return (f"<b>{setting.schedule}</b> · p={setting.p}, m={setting.m}, v={v} · step "
            f"{short_number(result.makespan * unit.scale)} {unit.name} · bubble "
            f"<b>{result.bubble:.1%}</b> ({form_txt}) · peak activations per rank [{peaks}] microbatches of a stage")


def _figures(setting: Setting, result: SimResult, animate: bool):
    v, unit = result.schedule.num_chunks, f_units(result)
    head = f"{setting.schedule}, p={setting.p}, m={setting.m}" + (f", v={v}" if v > 1 else "")
    timeline = timeline_figure(result.events, f"{head}, simulated", animate=animate, unit=unit)
    memory = memory_figure(result.events, f"Activations held per rank, {head}", unit, per=v,
                           yaxis_title="microbatches of a stage")
    return timeline, memory


def explorer_figures(schedule: str = "1f1b", p: int = 4, m: int = 8, num_chunks: int = 2,
                     b_ratio: float = 2.0, w_share: float = 0.5, p2p_ratio: float = 0.0, *,
                     animate: bool = True):
    """(timeline, memory) figures of one setting; the timeline plays with plotly's frames."""
    setting = Setting(schedule, p, m, num_chunks, b_ratio, w_share, p2p_ratio)
    return _figures(setting, predict(setting), animate)


def explorer_sweep(param: str, values, **setting):
    """One simulated timeline per value of `param` (a Setting field), switched by a plotly slider."""
    if param not in Setting.__dataclass_fields__:
        raise ValueError(f"param={param!r}; choose one of {list(Setting.__dataclass_fields__)}")
    traces = {str(x): predict(Setting(**{**setting, param: x})).events for x in values}
    # a sweep over schedules names each in its frame's heading; every setting's F is F_SECONDS
    name = "Schedules" if param == "schedule" else setting.get("schedule", Setting.schedule)
    return sweep_figure(traces, f"{name}, simulated", param=param, unit=Units("F", 1 / F_SECONDS))


# ----------------------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class Measurement:
    """One step measured on the cluster beside `simulate` of the same schedule and costs."""

    setting: Setting
    measured: Trace
    predicted: SimResult
    max_diff: float                     # seconds, over every compute event's start and end
    peak_activation_bytes: tuple[int, ...]
    message_seconds: float              # one message on the cluster's link

    def figures(self):
        f = timeline_figure(self.measured, f"{self.setting.schedule} on the cluster", animate=False,
                            overlay=self.predicted.events, groups=("measured", "predicted"))
        mem = memory_figure(self.measured, "Measured memory per rank (parameters + activations)")
        return f, mem


def measure(cluster, setting: Setting, model_config=None, rows: int = 2) -> Measurement:
    """Run one step of the setting's schedule on `cluster` and simulate it with the same costs.

    Every op gets its modelled duration (`execute(costs=...)`); messages take the cluster's link
    time for their bytes (rows x hidden float32). F is chosen so one message is p2p_ratio F, as
    in the prediction (1 ms if p2p_ratio is 0: a real link is never free). On a simulated
    device with the virtual clock, measured and predicted coincide (max_diff ~ 0).
    """
    from pipelib.costmodel import get_profile
    from pipelib.model import MLPConfig
    from pipelib.pipeline.step import run_train_step

    s = setting.build()
    if cluster.world_size < s.num_ranks:
        raise ValueError(f"{setting.schedule} with p={setting.p} needs {s.num_ranks} ranks; the "
                         f"cluster has {cluster.world_size}: lower p")
    config = model_config or MLPConfig(in_features=16, hidden=16, out_features=10,
                                       num_layers=s.num_stages)
    nbytes = rows * config.hidden * 4
    link = get_profile(cluster.spec.profile).message_time
    f = link(nbytes) / setting.p2p_ratio if setting.p2p_ratio > 0 else F_SECONDS
    costs = setting.costs(s.num_chunks, f, p2p=link, message_bytes=nbytes)
    predicted = simulate(s, costs)
    cluster.reset()
    out = run_train_step(cluster, s, model_config=config, costs=costs,
                         batch_size=rows * s.num_microbatches)
    n = s.num_ranks  # ranks beyond the schedule's (p=2 on 4 engines) ran nothing
    measured = Trace([e for e in cluster.trace() if e.rank < n], world_size=n)
    peaks = tuple(r.stats["peak_activation_bytes"] for r in out[:n])
    # the same ops in the same order on every rank (else an AssertionError names the first other)
    return Measurement(setting, measured, predicted, measured.matches(predicted.events, align=True),
                       peaks, link(nbytes))


# ----------------------------------------------------------------------------- the widget
class Explorer(widgets.VBox):
    """Controls, a summary line, a "Run on cluster" button and the figures (an Output area).

    Every change re-simulates and redraws (`redraw`, timed in `last_redraw_s`); the button runs
    `measure`, draws measured above predicted, and starts a stopped cluster first (a chapter's
    last cell stops it). The figures go into the Output as `show`'s bundle: no kernel needed.
    """

    def __init__(self, cluster=None, setting: Setting = Setting(), *, max_p: int = 8, max_m: int = 32):
        # an unknown name raises the ValueError naming the schedules; an alias shows its name
        st = replace(setting, schedule=schedule_info(setting.schedule).name)
        self.cluster, self.result, self.measurement, self.last_redraw_s = cluster, None, None, None
        self._chosen_v, self._syncing = st.num_chunks, False
        def slider(kind, value, lo, hi, step, label):
            return kind(value=value, min=lo, max=max(hi, value), step=step, description=label,
                        style={"description_width": "initial"}, continuous_update=False)

        self.controls = dict(
            schedule=widgets.Dropdown(options=list(REGISTRY), value=st.schedule, description="schedule"),
            p=slider(widgets.IntSlider, st.p, 1, max_p, 1, "p (ranks)"),
            m=slider(widgets.IntSlider, st.m, 1, max_m, 1, "m (microbatches)"),
            num_chunks=slider(widgets.IntSlider, st.num_chunks, 1, 4, 1, "v (chunks)"),
            b_ratio=slider(widgets.FloatSlider, st.b_ratio, 0.5, 4, 0.25, "B/F"),
            w_share=slider(widgets.FloatSlider, st.w_share, 0, 1, 0.05, "W share of B"),
            p2p_ratio=slider(widgets.FloatSlider, st.p2p_ratio, 0, 2, 0.05, "p2p/F"),
        )
        for w in self.controls.values():
            w.observe(lambda _: None if self._syncing else self.redraw(), names="value")
        self.summary, self.report, self.output = widgets.HTML(), widgets.HTML(), widgets.Output()
        self.button = widgets.Button(description="Run on cluster", icon="play")
        self.button.on_click(lambda _: self.run_on_cluster())
        c = list(self.controls.values())
        super().__init__([widgets.HBox(c[:4]), widgets.HBox(c[4:]), self.summary,
                          widgets.HBox([self.button, self.report]), self.output])
        self.redraw()

    @property
    def setting(self) -> Setting:
        return Setting(**{k: w.value for k, w in self.controls.items()})

    def _runnable(self) -> bool:
        return (self.cluster is not None and self.result is not None
                and self.cluster.world_size >= self.result.schedule.num_ranks)

    def _show(self, *figs) -> None:
        self.output.outputs = tuple({"output_type": "display_data", "data": figure_bundle(f),
                                     "metadata": {}} for f in figs)

    def _sync_chunks(self, info) -> None:
        """Others than chunked schedules show, disabled, the v they use (1, or 2 for a V)."""
        w, fixed = self.controls["num_chunks"], info.stages_per_rank
        self._chosen_v = w.value if not w.disabled else self._chosen_v  # back with a chunked one
        self._syncing = True  # no redraw from inside redraw
        w.value, w.disabled = (self._chosen_v if fixed is None else fixed), fixed is not None
        self._syncing = False

    def redraw(self) -> None:
        t0, info = time.perf_counter(), schedule_info(self.controls["schedule"].value)
        self._sync_chunks(info)
        st = self.setting
        self.controls["w_share"].disabled = not info.split_backward
        self.measurement, self.report.value = None, ""
        try:
            self.result = predict(st)
        except ValueError as e:
            self.result = None
            self.summary.value = f'<pre style="color:#b00020">{html.escape(str(e))}</pre>'
            self.output.outputs = ()
        else:
            self.summary.value = summary_html(st, self.result)
            self._show(*_figures(st, self.result, animate=False))
        self.button.disabled = not self._runnable()
        if self.cluster is not None and self.result is not None and self.button.disabled:
            self.report.value = (f"needs {self.result.schedule.num_ranks} ranks; the cluster "
                                 f"has {self.cluster.world_size}")
        self.last_redraw_s = time.perf_counter() - t0

    def run_on_cluster(self) -> Measurement | None:
        if not self._runnable():
            return None
        self.button.disabled, self.report.value = True, "running one step on the cluster..."
        try:
            if not getattr(self.cluster, "running", True):
                # stopped (a chapter's last cell stops it, and Run All gets there): start it again
                self.report.value = "the cluster was stopped: starting it (about 10 s)..."
                self.cluster.start()
                self.report.value = "running one step on the cluster..."
            self.measurement = ms = measure(self.cluster, self.setting)
        except Exception as e:  # noqa: BLE001 - a failed run is reported in the widget
            msg = html.escape(f"{type(e).__name__}: {e}")
            self.report.value = f'<span style="color:#b00020">{msg}</span>'
            return None
        finally:
            self.button.disabled = False
        f = ms.predicted.costs.F * ms.predicted.schedule.num_chunks
        self.report.value = (
            f"measured step {1e3 * ms.measured.span:.4g} ms, predicted "
            f"{1e3 * ms.predicted.makespan:.4g} ms; max |measured - predicted| over "
            f"{len(ms.measured.filter(kind=Kind.COMPUTE))} ops: {ms.max_diff:.3g} s "
            f"(F = {1e3 * f:.4g} ms, one message {1e6 * ms.message_seconds:.4g} us); peak "
            f"activation bytes per rank {list(ms.peak_activation_bytes)}")
        self._show(*ms.figures())
        return ms


def explorer(cluster=None, schedule: str = "1f1b", p: int = 4, m: int = 8, num_chunks: int = 2,
             b_ratio: float = 2.0, w_share: float = 0.5, p2p_ratio: float = 0.0, **kw) -> Explorer:
    """The schedule explorer widget (chapters 12 and 13); `cluster` enables "Run on cluster".
    The setting is checked first: a slider would clamp a bad value without a word."""
    setting = Setting(schedule, p, m, num_chunks, b_ratio, w_share, p2p_ratio)
    setting.costs(setting.build().num_chunks)  # a ValueError naming the value, before any widget
    return Explorer(cluster, setting, **kw)
