"""Pure: chapter 09's figures, drawn from Events and numbers."""
from pipelib.trace import Event, Kind, Trace
from pipelib.viz.tensor_parallel import tp_collectives_figure, tp_link_share_figure, tp_memory_figure, tp_split_figure


def test_split_figure_colours_each_entry_by_its_rank():
    fig = tp_split_figure(4, 6, 2)
    col, row = fig.data
    assert [r[0] for r in col.z] == [0, 0, 1, 1]        # column-parallel: output rows
    assert row.z[0] == [0, 0, 0, 1, 1, 1]               # row-parallel: input columns


def test_collectives_figure_has_one_bar_per_call_and_marks_the_backward():
    evs = [Event(0, Kind.COLLECTIVE, "all_reduce: blocks.0.mlp.c_proj g forward", 0, 1, bytes=4096),
           Event(0, Kind.COLLECTIVE, "all_gather: blocks.0.attn all-gather forward", 1, 2, bytes=2048),
           Event(0, Kind.COLLECTIVE, "all_reduce: blocks.0.mlp.c_fc f backward", 2, 3, bytes=4096),
           Event(1, Kind.COLLECTIVE, "all_reduce: other rank", 0, 1, bytes=1)]
    fig = tp_collectives_figure(Trace(evs), rank=0)
    assert [b.y[0] for b in fig.data] == [4.0, 2.0, 4.0]
    assert [b.showlegend for b in fig.data] == [True, True, False]
    assert fig.layout.shapes[0].x0 == 1.5


def test_link_and_memory_figures():
    fig = tp_link_share_figure([{"link": "a", "t": 2, "share": 0.1, "ms": 1.0},
                                {"link": "a", "t": 8, "share": 0.2, "ms": 2.0}])
    assert [list(b.y) for b in fig.data] == [[10.0], [20.0]]
    assert fig.layout.shapes[0].y0 == 100 and fig.layout.yaxis.type == "log"   # the line "as long as the forward"
    assert fig.layout.annotations[-1].y == 2                                    # log10(100): annotations use log units
    fig = tp_memory_figure([{"setting": "t=1", "measured": 2048, "counted": 2048}])
    assert [list(b.y) for b in fig.data] == [[2.0], [2.0]]
