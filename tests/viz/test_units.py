"""Time axes say their unit honestly: seconds measured, or abstract units (unit costs, "units of
F"), and a "play" slider stops at round times whose labels stay apart at the figure's width."""
import re

import pytest

from pipelib.pipeline.schedules import GENERATORS
from pipelib.pipeline.simulate import Costs, simulate
from pipelib.trace import Event, Kind, Trace
from pipelib.viz.display import Units, nice_cuts, plain_number, time_title, time_unit
from pipelib.viz.timeline import memory_figure, sweep_figure, timeline_figure

UNIT_COSTS = Costs(F=1.0, B=2.0, I=1.0, W=1.0)  # every op in units of one forward, as chapter 13


def one_f_one_b(p=4, m=8):
    return simulate(GENERATORS["1f1b"](p, m), UNIT_COSTS)


def test_time_unit_names_abstract_units_with_scale_one_or_the_one_given():
    assert time_unit(33.0, "units of F") == ("F", 1.0)
    assert time_unit(0.033, Units("F", 1e3)) == ("F", 1e3)
    assert time_unit(0.033) == ("ms", 1e3) and time_unit(33.0, "s") == ("s", 1.0)  # clocks as before
    assert time_title("F") == "time (units of F)" and time_title("ms") == "time (ms)"
    assert time_title("µs") == "time (µs)" and time_title("s") == "time (s)"
    with pytest.raises(ValueError, match="'units of X'"):
        time_unit(1.0, "seconds")
    with pytest.raises(ValueError, match="unit='units of '"):
        time_unit(1.0, "units of ")


def test_unit_cost_timeline_says_units_of_f_in_axis_title_and_slider():
    sim = one_f_one_b()
    fig = timeline_figure(sim.events, "1F1B", unit="units of F")
    assert fig.layout.xaxis.title.text == "time (units of F)"
    assert "step 33.0 F</sub>" in fig.layout.title.text and " s " not in fig.layout.title.text
    assert fig.layout.xaxis.range[1] == pytest.approx(33 * 1.02)  # scale 1: the costs themselves
    slider = fig.layout.sliders[0]
    assert slider.currentvalue.suffix == " F"
    hover = fig.data[0].hovertemplate
    assert " F, lasts " in hover and " s, lasts" not in hover


def test_measured_timelines_keep_their_clock_unit():
    evs = [Event(0, Kind.COMPUTE, "F", 0, 0.0025, stage=0, microbatch=0)]
    fig = timeline_figure(Trace(evs, world_size=1))
    assert fig.layout.xaxis.title.text == "time (ms)" and "step 2.50 ms" in fig.layout.title.text
    assert fig.layout.sliders[0].currentvalue.suffix == " ms"


def test_sweep_and_memory_figures_take_abstract_units_too():
    sim = one_f_one_b()
    sweep = sweep_figure({"8": sim.events}, "1F1B", param="m", unit="units of F")
    assert sweep.layout.xaxis.title.text == "time (units of F)"
    assert "step 33.0 F</sub>" in sweep.frames[0].layout.title.text
    memory = memory_figure(Trace([Event(0, Kind.COMPUTE, "F", 0, 2e-3, memory=2**20)], world_size=1),
                           unit=Units("F", 1e3))
    assert memory.layout.xaxis.title.text == "time (units of F)" and list(memory.data[0].x) == [0, 2]
    assert "%{x} F:" in memory.data[0].hovertemplate


def label_width(labels) -> int:
    """What the labels need side by side: ~7 px a character and a gap, as plotly lays them out."""
    return len(labels) * (7 * max(len(x) for x in labels) + 14)


def test_play_slider_labels_are_round_and_fit_the_figure():
    sim = one_f_one_b()
    fig = timeline_figure(sim.events, "1F1B", unit="units of F")
    labels = [s.label for s in fig.layout.sliders[0].steps]
    assert label_width(labels) <= 560, labels  # 24 labels like "1.38" need ~1000 px
    assert labels == [str(2 * k) for k in range(1, 17)] + ["33"]  # every 2 F, then the whole step
    assert len(fig.frames) == len(labels)
    last = [x for bar in fig.frames[-1].data for x in bar.x]
    assert sorted(last) == sorted(x for bar in fig.data for x in bar.x)  # the last frame: all of it


@pytest.mark.parametrize("span", [33.0, 2.0, 0.0275, 51.0, 3.3e-4, 7.0, 1000.0, 99.0, 1.0, 123456.0])
def test_nice_cuts_are_round_steps_that_cover_the_span_and_fit(span):
    cuts = nice_cuts(span)
    step = cuts[0]
    assert all(c == pytest.approx(step * (i + 1)) for i, c in enumerate(cuts[:-1]))
    mantissa = float(f"{step:e}".split("e")[0])
    assert mantissa in (1, 2, 5), step
    assert cuts[-1] == pytest.approx(span, rel=1e-3)  # the last stop: the whole step
    assert 0 < cuts[-1] - (cuts[-2] if len(cuts) > 1 else 0) <= step * (1 + 1e-9)
    labels = [plain_number(c) for c in cuts]
    assert label_width(labels) <= 560 and len(cuts) <= 24
    assert not any(re.search("e[-+]", x) for x in labels), labels


def test_plain_number():
    assert [plain_number(x) for x in (2, 2.0, 2.5, 5e-05, 0.1 + 0.2)] == ["2", "2", "2.5", "0.00005", "0.3"]
