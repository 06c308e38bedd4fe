"""Figures are drawn from events, deterministic, and render through the display bundle."""
import json

import pytest

from pipelib.trace import Event, Kind, Trace
from pipelib.viz.display import figure_bundle
from pipelib.viz.timeline import LABEL_COLORS, memory_figure, speedup_figure, sweep_figure, timeline_figure


def _trace(offset=0.0):
    evs = [Event(0, Kind.COMPUTE, "F", offset + 0, offset + 1, stage=0, microbatch=0, memory=100),
           Event(1, Kind.RECV_WAIT, "act", offset + 0, offset + 1, peer=0),
           Event(1, Kind.COMPUTE, "F", offset + 1, offset + 2, stage=1, microbatch=0, memory=2**20)]
    return Trace(evs, world_size=2)


def test_timeline_rows_show_idle_share_and_animate():
    fig = timeline_figure(_trace(), frames=4, unit="s")
    names = {y for bar in fig.data for y in bar.y}
    assert names == {"rank 0 · idle 50%", "rank 1 · idle 50%"}
    assert len(fig.frames) == 4
    # the first frame shows only what happened by t = span/4
    widths = [x for bar in fig.frames[0].data for x in bar.x]
    assert max(widths) == 0.5
    assert "bubble 50.0%" in fig.layout.title.text


def test_wall_clock_trace_is_drawn_from_its_first_event():
    fig = timeline_figure(_trace(offset=1e6), animate=False, unit="s")
    assert min(b for bar in fig.data for b in bar.base) == 0.0


def test_memory_figure_steps_per_rank():
    fig = memory_figure(_trace(), unit="s")
    assert [t.name for t in fig.data] == ["rank 0", "rank 1"]
    assert list(fig.data[1].y) == [0.0, 1.0]


def test_bundle_is_deterministic_and_has_html_and_plotly_json():
    a = figure_bundle(timeline_figure(_trace()))
    b = figure_bundle(timeline_figure(_trace()))
    assert a == b
    assert set(a) == {"application/vnd.plotly.v1+json", "text/html", "text/plain"}
    div = a["text/html"].split('id="', 1)[1].split('"', 1)[0]
    assert div.startswith("fig-") and "cdn" not in a["text/html"].lower()
    json.dumps(a["application/vnd.plotly.v1+json"])
    other = figure_bundle(speedup_figure({"m": ([1, 2], [1, 1.8])}, {"law": ([1, 2], [1, 1.9])}))
    assert other["text/html"].split('id="', 1)[1].split('"', 1)[0] != div


def test_overlay_draws_two_row_groups_on_one_time_axis():
    measured, predicted = _trace(offset=5.0), _trace()
    fig = timeline_figure(measured, frames=2, unit="s", overlay=predicted)
    order = list(fig.layout.yaxis.categoryarray)[::-1]  # top to bottom
    assert order == ["measured · rank 0 · idle 50%", "measured · rank 1 · idle 50%",
                     "predicted · rank 0 · idle 50%", "predicted · rank 1 · idle 50%"]
    assert "bubble measured 50.0% · predicted 50.0%" in fig.layout.title.text
    assert min(b for bar in fig.data for b in bar.base) == 0.0  # each from its own first event
    legend = [bar.name for bar in fig.data if bar.showlegend is not False]
    assert sorted(legend) == ["F", "recv-wait"]  # one legend entry per kind, not per group
    assert all(len(f.data) == len(fig.data) for f in fig.frames)


def test_sweep_figure_keeps_the_same_traces_in_every_frame():
    only_f = Trace([Event(0, Kind.COMPUTE, "F", 0, 1, stage=0, microbatch=0)], world_size=1)
    fig = sweep_figure({"1": only_f, "2": _trace()}, "t", param="p", unit="s")
    assert [f.name for f in fig.frames] == ["1", "2"]
    assert [len(f.data) for f in fig.frames] == [2, 2]  # F and recv-wait, empty where absent
    assert list(fig.frames[0].data[1].x) == []
    assert "p = 1: bubble 0.0%" in fig.frames[0].layout.title.text
    assert "p = 2: bubble 50.0%" in fig.frames[1].layout.title.text
    assert list(fig.layout.yaxis.categoryarray) == ["rank 1", "rank 0"]
    assert fig.layout.xaxis.range[1] == pytest.approx(2 * 1.02)
    with pytest.raises(ValueError, match="at least one trace"):
        sweep_figure({})


def test_memory_figure_units():
    fig = memory_figure(_trace(), unit="s", per=2**10, yaxis_title="KiB")
    assert list(fig.data[1].y) == [0.0, 1024.0] and fig.layout.yaxis.title.text == "KiB"


# ----------------------------------------------------------------------------- readability
def test_time_unit_is_chosen_from_the_span():
    from pipelib.viz.display import short_number, time_unit

    assert time_unit(33.0) == ("s", 1.0) and time_unit(0.033) == ("ms", 1e3)
    assert time_unit(5e-5) == ("µs", 1e6) and time_unit(33.0, "ms") == ("ms", 1e3)
    assert time_unit(1.0, "us") == ("µs", 1e6)
    with pytest.raises(ValueError, match="unit='min'"):
        time_unit(1.0, "min")
    assert [short_number(v) for v in (33.0, 0.125, 33_000.0, 0.0)] == ["33.0", "0.125", "33,000", "0"]


@pytest.mark.parametrize("seconds,unit", [(33.0, "s"), (0.033, "ms"), (3.3e-5, "µs")])
def test_every_time_axis_reads_in_a_unit_fit_for_the_span(seconds, unit):
    evs = [Event(r, Kind.COMPUTE, "F", r * seconds / 2, (r + 1) * seconds / 2, stage=r, microbatch=0, memory=2**20)
           for r in range(2)]
    t = Trace(evs, 2)
    for fig in (timeline_figure(t, "t"), sweep_figure({"a": t}, "t", param="x"), memory_figure(t)):
        assert fig.layout.xaxis.title.text == f"time ({unit})", fig.layout.title.text
        assert "e+" not in fig.layout.title.text and "e-" not in fig.layout.title.text
        assert 1 <= fig.layout.xaxis.range[1] <= 1000 if fig.layout.xaxis.range else True
    assert f"step 33.0 {unit}" in timeline_figure(t, "t").layout.title.text


def test_bars_name_their_microbatch_inside_and_everything_in_the_hover():
    fig = timeline_figure(_trace(), animate=False, unit="s")
    f = [b for b in fig.data if b.name == "F"][0]
    assert f.textposition == "inside" and f.insidetextanchor == "middle" and f.textangle == 0
    assert fig.layout.uniformtext.mode == "hide" and fig.layout.uniformtext.minsize >= 8
    cols = f.hovertemplate
    for word in ("%{y}", "stage", "microbatch", " s,", "lasts"):
        assert word in cols, (word, cols)
    assert f.texttemplate == "%{customdata[4]}"                    # the microbatch number
    assert [list(c) for c in f.customdata] == [[0, 1, 1, 0, 0], [1, 2, 1, 1, 0]]  # start, end, duration, stage, mb
    wait = [b for b in fig.data if b.name == "recv-wait"][0]
    assert wait.textposition == "none" and "peer" in wait.hovertemplate


def test_animation_frames_carry_only_the_widths():
    fig = timeline_figure(_trace(), frames=4, unit="s")
    for frame in fig.frames:
        assert list(frame.traces) == list(range(len(fig.data)))
        assert all(set(d.to_plotly_json()) == {"x", "type"} for d in frame.data)
    assert [list(d.x) for d in fig.frames[-1].data] == [list(b.x) for b in fig.data]  # last frame = the figure


def test_times_are_rounded_to_what_the_axis_shows():
    t = Trace([Event(0, Kind.COMPUTE, "F", 0.1 + 0.2, 0.1 + 0.2 + 1 / 3, microbatch=0)], 1)
    bar = timeline_figure(t, animate=False, unit="s").data[0]
    assert list(bar.base) == [0] and list(bar.x) == [0.33333]      # 5 significant digits of the span


def test_legend_lists_forward_before_backward():
    evs = [Event(0, Kind.COMPUTE, op, i, i + 1, microbatch=0) for i, op in enumerate("FBW")]
    fig = timeline_figure(Trace(evs, 1), animate=False)
    assert [b.name for b in fig.data] == ["F", "B", "W"]


def test_compute_labels_never_share_a_swatch_and_idle_is_named():
    """A data-parallel step's "forward"/"backward" look like F/B, other compute labels get their
    own palette colours, the optimizer is not the collectives' colour, and the subtitle can call
    the idle share what it is (chapter 08: compute idle, collectives drawn)."""
    evs = [Event(r, Kind.COMPUTE, lab, s, s + 1e-3) for r in range(2)
           for lab, s in (("forward", 0.0), ("backward", 2e-3), ("optimizer", 4e-3), ("embed", 6e-3), ("head", 8e-3))]
    evs += [Event(r, Kind.COLLECTIVE, "all_gather", 1e-3, 2e-3, bytes=8) for r in range(2)]
    fig = timeline_figure(Trace(evs, 2), "ZeRO-3", kinds=(Kind.COMPUTE, Kind.COLLECTIVE), idle_name="compute idle")
    colors = {bar.name: bar.marker.color for bar in fig.data}
    assert len(set(colors.values())) == len(colors), colors
    assert colors["forward"] == LABEL_COLORS["F"] and colors["backward"] == LABEL_COLORS["B"]
    title = fig.layout.title.text
    assert "compute idle" in title and "bubble" not in title and "collective bars" in title
