"""The planner behind widgets (`pipelib.viz.planner_widget`): each control re-plans, the first
plan shown is `search`'s first, and a batch the GPUs cannot share is said in the widget."""
import pytest

from pipelib.costmodel import LINKS, PROFILES
from pipelib.planner.search import search
from pipelib.planner.spec import LLAMA3_70B, Machine
from pipelib.viz.planner_widget import PlannerWidget


def test_every_change_replans_as_search_ranks():
    ui = PlannerWidget(n_devices=64, global_batch=128, top=3)
    ui.controls["model"].value = LLAMA3_70B.name
    ui.controls["gpu"].value = "h100"
    want = search(LLAMA3_70B, Machine(PROFILES["h100"], 8, LINKS["ib-ndr"]), 64, 128)[:3]
    assert [c.layout for c in ui.best] == [c.layout for c in want]
    assert f"dp={want[0].layout.dp} tp={want[0].layout.tp}" in ui.summary.value
    assert len(ui.output.outputs) == 1                                   # the bars of the 3 plans


def test_a_batch_the_gpus_cannot_share_is_said_not_raised():
    ui = PlannerWidget(n_devices=64, global_batch=128)
    ui.controls["global_batch"].value = 7
    assert ui.best == [] and "no plan fits" in ui.summary.value and ui.output.outputs == ()
    with pytest.raises(ValueError, match="use a model of"):
        PlannerWidget(model="GPT-5")
