"""Chapter 16's figures: the dispatch matrix read from SEND events inside a dispatch's
COLLECTIVE event; the figures draw what they are given."""
import pytest

from pipelib.trace import Event, Kind, Trace
from pipelib.viz.experts import dispatch_matrices, drop_rate_figure, load_figure, traffic_figure

LABEL = "all_to_all_uneven: moe 0 dispatch"


def _call(rank, start, sends, row=32):
    """A dispatch on `rank` at `start` sending {peer: rows}, and an unrelated send after it."""
    evs = [Event(rank, Kind.COLLECTIVE, LABEL, start, start + 1.0)]
    evs += [Event(rank, Kind.SEND, f"all_to_all_uneven all-to-all step {i} chunk {p}", start + 0.1 * (i + 1),
                  start + 0.1 * (i + 1), bytes=rows * row, peer=p) for i, (p, rows) in enumerate(sends.items())]
    evs.append(Event(rank, Kind.SEND, "all_to_all all-to-all step 0 chunk 1", start + 1.5, start + 1.5,
                     bytes=8, peer=1 - rank))
    # the combine that starts the moment the dispatch ends: its sends are not the dispatch's
    evs.append(Event(rank, Kind.SEND, "all_to_all_uneven all-to-all step 0 chunk 1", start + 1.0, start + 1.0,
                     bytes=64, peer=1 - rank))
    return evs


def test_dispatch_matrices_from_sends_inside_each_call():
    trace = Trace(_call(0, 0.0, {1: 3}) + _call(1, 0.0, {0: 0}) + _call(0, 2.0, {1: 5}) + _call(1, 2.0, {0: 2}),
                  world_size=2)
    assert dispatch_matrices(trace, LABEL, 32) == [[[0, 3], [0, 0]], [[0, 5], [2, 0]]]
    assert dispatch_matrices(trace, LABEL, 32, own=[[4, 1], [0, 7]]) == [[[4, 3], [0, 1]], [[0, 5], [2, 7]]]
    with pytest.raises(ValueError, match=r"96 bytes from rank 0 to 1 are not whole rows of 64 bytes"):
        dispatch_matrices(trace, LABEL, 64)


def test_figures_draw_what_they_are_given():
    fig = traffic_figure([[[0, 3], [1, 0]], [[2, 5], [2, 0]]])
    assert len(fig.frames) == 2 and [list(r) for r in fig.data[0].z] == [[2, 5], [2, 0]]
    assert [t.name for t in load_figure({"none": [1.5, 4.0], "bias": [1.5, 2.0]}).data] == ["none", "bias"]
    assert list(drop_rate_figure([0.5, 1.0], {"none": [0.5, 0.25]}).data[0].y) == [50.0, 25.0]
    with pytest.raises(ValueError, match="no steps"):
        traffic_figure([])
