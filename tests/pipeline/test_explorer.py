"""The schedule explorer: pure predictions against the closed forms, the widget driven like a
reader (sliders, dropdown, button), and measured on the cluster equal to predicted."""
import re

import pytest

from pipelib.pipeline.explorer import Setting, explorer, explorer_figures, explorer_sweep, predict, summary_html
from pipelib.pipeline.schedules import GENERATORS, REGISTRY
from pipelib.pipeline.simulate import bubble_closed_form
from pipelib.trace import Event, Kind, Trace

PLOTLY = "application/vnd.plotly.v1+json"


def rows(explorer_widget, k=0) -> set:
    """The row names of the k-th figure in the widget's Output area."""
    spec = explorer_widget.output.outputs[k]["data"][PLOTLY]
    return {y for bar in spec["data"] for y in bar.get("y", [])}


def titles(explorer_widget) -> list[str]:
    return [o["data"][PLOTLY]["layout"]["title"]["text"] for o in explorer_widget.output.outputs]


# ----------------------------------------------------------------------------- pure
@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("naive", 3, 2, 1),
                                        ("interleaved_1f1b", 4, 8, 2), ("interleaved_1f1b", 2, 4, 3),
                                        ("zb_h1", 4, 8, 1), ("zbv", 4, 8, 2)])
def test_predicted_bubble_equals_the_closed_form_and_the_summary_says_so(name, p, m, v):
    st = Setting(name, p, m, num_chunks=v)
    r = predict(st)
    want = bubble_closed_form(name, p, m, v, costs=r.costs)
    assert r.bubble == pytest.approx(want, abs=1e-9)
    assert f"bubble <b>{r.bubble:.1%}</b> (closed form {want:.1%}" in summary_html(st, r)


def test_cost_ratios_and_equal_work_per_rank_whatever_the_chunks():
    c = Setting(b_ratio=3.0, w_share=0.25, p2p_ratio=0.5).costs(1)
    assert (c.F, c.B, c.I, c.W, c.message()) == pytest.approx((1e-3, 3e-3, 2.25e-3, 0.75e-3, 0.5e-3))
    assert Setting().costs(2).F == pytest.approx(0.5e-3)  # one of two chunks: half a stage
    for name in GENERATORS:
        r = predict(Setting(name, 4, 8))
        busy = r.events.busy(0)
        assert busy == pytest.approx(8 * 3e-3), f"{name}: rank 0 computes m (F + B)"


def test_split_share_moves_the_zb_h1_bubble_as_its_formula_says():
    even, late_w = predict(Setting("zb_h1", 4, 8)), predict(Setting("zb_h1", 4, 8, w_share=0.25))
    assert late_w.bubble > even.bubble  # I = 1.5 F > W: idle (p-1)(F+I-W) grows
    assert late_w.bubble == pytest.approx(bubble_closed_form("zb_h1", 4, 8, costs=late_w.costs))


def test_figures_are_pure_animated_and_drawn_from_the_simulation():
    timeline, memory = explorer_figures("1f1b", 4, 8)
    assert len(timeline.frames) > 1 and "bubble 27.3%" in timeline.layout.title.text
    assert [max(t.y) for t in memory.data] == [4, 3, 2, 1]  # 1F1B holds p - rank microbatches
    _, memory = explorer_figures("interleaved_1f1b", 4, 8, num_chunks=2)
    r = predict(Setting("interleaved_1f1b", 4, 8))
    assert [max(t.y) for t in memory.data] == [n / 2 for n in r.peak_inflight]
    with pytest.raises(ValueError, match="m >= 8"):
        explorer_figures("dualpipe_v", 4, 4)


def test_sweep_has_one_frame_per_value_and_titles_from_the_simulation():
    fig = explorer_sweep("m", [4, 8, 16], schedule="gpipe", p=4)
    assert [f.name for f in fig.frames] == ["4", "8", "16"]
    for f, m in zip(fig.frames, [4, 8, 16]):
        assert f"bubble {100 * 3 / (m + 3):.1f}%" in f.layout.title.text
    assert [s.label for s in fig.layout.sliders[0].steps] == ["4", "8", "16"]
    by_schedule = explorer_sweep("schedule", ["gpipe", "zbv"], p=4, m=8)
    assert [f.layout.title.text.split("<br>")[0] for f in by_schedule.frames] == [
        "Schedules, simulated"] * 2  # not the default schedule's name
    assert "schedule = zbv" in by_schedule.frames[1].layout.title.text
    with pytest.raises(ValueError, match="param='k'"):
        explorer_sweep("k", [1])


def test_trace_matches_its_prediction():
    a = Trace([Event(0, Kind.COMPUTE, "F", 0, 1, stage=0, microbatch=0),
               Event(1, Kind.COMPUTE, "F", 1, 2, stage=1, microbatch=0)])
    b = Trace([Event(0, Kind.COMPUTE, "F", 10, 11, stage=0, microbatch=0),
               Event(1, Kind.COMPUTE, "F", 11, 12.5, stage=1, microbatch=0)])
    assert a.matches(b, align=True) == pytest.approx(0.5)  # each counted from its first op
    assert a.matches(b) == pytest.approx(10.5) and a.matches(a, tol=0) == 0
    with pytest.raises(AssertionError, match=r"rank 1 ran another order: event 0 is compute 'F' "
                                             r"stage 1 microbatch 0 \[1, 2\] here but missing"):
        a.matches(Trace(a.events[:1]))
    other = Trace([a.events[0], Event(1, Kind.COMPUTE, "B", 1, 2, stage=1, microbatch=0)])
    with pytest.raises(AssertionError, match=r"event 0 is compute 'F' .* but compute 'B'"):
        a.matches(other)
    with pytest.raises(AssertionError, match=r"rank 1's compute 'F' stage 1 microbatch 0 .* is 0.5 s "
                                             r"away from its prediction \(tolerance 1e-09 s\)"):
        a.matches(b, tol=1e-9, align=True)
    sends = Trace([Event(0, Kind.SEND, "act", 0, 0.5, stage=0, microbatch=0)])
    assert a.matches(Trace(a.events + sends.events)) == 0  # compute only, by default


# ----------------------------------------------------------------------------- the widget
def test_widget_redraws_on_every_control():
    e = explorer(schedule="1f1b", p=4, m=8)
    assert "<b>1f1b</b>" in e.summary.value and "bubble <b>27.3%</b>" in e.summary.value
    assert len(e.output.outputs) == 2 and "rank 3 · idle 27%" in rows(e)
    assert e.button.disabled and e.last_redraw_s is not None
    e.controls["p"].value = 6
    assert "p=6" in e.summary.value and any(r.startswith("rank 5") for r in rows(e))
    e.controls["m"].value = 16
    assert f"bubble <b>{5 / 21:.1%}</b>" in e.summary.value
    e.controls["b_ratio"].value = 3.0
    assert f"bubble <b>{5 / 21:.1%}</b>" in e.summary.value  # fill and drain scale with B too
    free = e.result.bubble
    e.controls["p2p_ratio"].value = 0.5
    assert e.result.bubble > free and f"{e.result.bubble:.1%}" in e.summary.value
    assert f"bubble {100 * e.result.bubble:.1f}%" in titles(e)[0]


def test_controls_that_do_not_apply_are_disabled():
    e = explorer()
    for name, info in REGISTRY.items():
        e.controls["schedule"].value = name
        assert e.controls["num_chunks"].disabled == (not info.chunked), name
        assert e.controls["w_share"].disabled == (not info.split_backward), name
    e.controls["schedule"].value = "interleaved_1f1b"
    e.controls["num_chunks"].value = 3
    assert "v=3" in e.summary.value


def test_an_invalid_setting_shows_the_error_instead_of_raising():
    e = explorer(schedule="dualpipe_v", p=4, m=8)
    assert "<b>dualpipe_v</b>" in e.summary.value
    e.controls["m"].value = 4
    assert "<pre" in e.summary.value and "use m &gt;= 8" in e.summary.value
    assert e.output.outputs == () and e.result is None and e.button.disabled
    e.controls["m"].value = 8
    assert "<b>dualpipe_v</b>" in e.summary.value and len(e.output.outputs) == 2
    with pytest.raises(ValueError, match="unknown schedule '2f2b'; choose one of"):
        explorer(schedule="2f2b")


def test_an_alias_selects_its_schedule():
    e = explorer(schedule="zero_bubble_h1")
    assert e.controls["schedule"].value == "zb_h1" and "<b>zb_h1</b>" in e.summary.value
    assert not e.controls["w_share"].disabled


class FakeCluster:
    """Enough of a Cluster for the button's logic; it fails if asked to run anything."""

    def __init__(self, world_size):
        self.world_size = world_size
        self.spec = type("Spec", (), {"profile": "toy-gpu"})()

    def reset(self):
        raise RuntimeError("engines are down")


def test_button_needs_a_cluster_with_enough_ranks_and_reports_failures():
    e = explorer(FakeCluster(2), schedule="1f1b", p=4, m=8)
    assert e.button.disabled and "needs 4 ranks; the cluster has 2" in e.report.value
    e.controls["p"].value = 2
    assert not e.button.disabled and e.report.value == ""
    e.button.click()
    assert "RuntimeError: engines are down" in e.report.value and e.measurement is None
    assert not e.button.disabled and len(e.output.outputs) == 2  # the prediction stays


class StoppedCluster(FakeCluster):
    """A cluster whose last cell stopped it: the button starts it before measuring."""

    def __init__(self, world_size):
        super().__init__(world_size)
        self.running, self.starts = False, 0

    def start(self):
        self.running, self.starts = True, self.starts + 1
        return self


def test_button_starts_a_stopped_cluster_first():
    c = StoppedCluster(4)
    e = explorer(c, schedule="1f1b", p=4, m=8)
    assert not e.button.disabled  # a stopped cluster is still a cluster to run on
    e.button.click()
    assert c.starts == 1 and c.running
    assert "RuntimeError: engines are down" in e.report.value  # it went on to measure
    assert "stopped" not in e.report.value


def _step(text: str) -> str:
    """The "step X U" of a summary line or a figure title."""
    return re.search(r"step (\S+ \S+?)(?:<| ·)", text).group(1)


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2), ("gpipe", 1)])
def test_summary_and_figures_say_the_same_step_in_units_of_f(name, v):
    e = explorer(schedule=name, p=4, m=8, num_chunks=v)
    step = _step(e.summary.value)
    assert step == _step(titles(e)[0]) and step.endswith(" F"), (e.summary.value, titles(e)[0])
    assert float(step.split()[0]) == pytest.approx(e.result.makespan / 1e-3, abs=0.05)  # F = 1 ms
    for out in e.output.outputs:  # the timeline and the memory: one unit
        assert out["data"][PLOTLY]["layout"]["xaxis"]["title"]["text"] == "time (units of F)"
    sweep = explorer_sweep("schedule", ["gpipe", "zbv"], p=4, m=8)
    assert sweep.layout.xaxis.title.text == "time (units of F)"
    gpipe = predict(Setting("gpipe", 4, 8))
    assert f"step {gpipe.makespan / 1e-3:.1f} F" in sweep.frames[0].layout.title.text


def test_the_v_slider_shows_the_v_used_when_it_does_not_apply():
    e = explorer(schedule="1f1b", p=4, m=8, num_chunks=3)
    v = e.controls["num_chunks"]
    assert (v.value, v.disabled) == (1, True) and "v=1" in e.summary.value
    e.controls["schedule"].value = "zbv"  # a V: two stages per rank, fixed
    assert (v.value, v.disabled) == (2, True) and "v=2" in e.summary.value
    e.controls["schedule"].value = "interleaved_1f1b"  # the reader's v comes back
    assert (v.value, v.disabled) == (3, False) and "v=3" in e.summary.value
    v.value = 4
    e.controls["schedule"].value = "gpipe"
    assert (v.value, v.disabled) == (1, True)
    e.controls["schedule"].value = "interleaved_1f1b"
    assert v.value == 4 and "v=4" in e.summary.value


# ----------------------------------------------------------------------------- the cluster
def _warm():
    """A first pipeline step on fresh engines pays one-off costs: backward with a given output
    gradient (every stage but the last) makes torch import sympy, seconds on loaded cores, on
    every rank at once, which can pass the cluster's 8 s timeout. Pay them here, no peer waiting."""
    import torch

    y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    torch.autograd.backward(y, torch.ones_like(y))


@pytest.fixture(scope="module")
def warm_cluster(cluster4):
    cluster4.run(_warm, timeout=120)
    return cluster4


@pytest.mark.cluster
@pytest.mark.parametrize("name,p,m,p2p", [("1f1b", 4, 8, 0.0), ("zbv", 2, 4, 0.5),
                                          ("interleaved_1f1b", 4, 8, 0.25)])
def test_run_on_cluster_overlays_a_measurement_equal_to_the_prediction(warm_cluster, name, p, m, p2p):
    e = explorer(warm_cluster, schedule=name, p=p, m=m, p2p_ratio=p2p)
    assert not e.button.disabled
    e.button.click()
    ms = e.measurement
    assert ms is not None, e.report.value
    assert ms.max_diff < 1e-9, e.report.value  # virtual clock: the executor ran the prediction
    assert f"{ms.max_diff:.3g} s" in e.report.value
    assert ms.measured.filter(kind=Kind.COMPUTE).bubble_fraction() >= 0
    if p2p > 0:  # F was chosen so one message on the cluster's link is p2p F: same bubble
        assert ms.predicted.bubble == pytest.approx(e.result.bubble, abs=1e-9)
    names = rows(e)
    assert {f"measured · rank {r}" for r in range(p)} <= {n.split(" · idle")[0] for n in names}
    assert {f"predicted · rank {r}" for r in range(p)} <= {n.split(" · idle")[0] for n in names}
    assert all(b > 0 for b in ms.peak_activation_bytes)
    clock = e.output.outputs[0]["data"][PLOTLY]["layout"]["xaxis"]["title"]["text"]
    assert clock in {"time (s)", "time (ms)", "time (µs)"}  # measured: a clock's unit, not F
    e.controls["m"].value = 2 * m  # any change goes back to the prediction alone
    assert e.measurement is None and e.report.value == ""
    assert not any(n.startswith("measured") for n in rows(e))
