"""Chapter 18's lost-rank figure: a run is one colour in both panels, named once in the legend."""
from pipelib.viz.faults import lost_rank_figure


def test_each_run_keeps_its_colour_in_both_panels():
    losses = {"uninterrupted": [4.2, 4.1, 4.0, 3.9], "restart": [4.2, 4.1, 4.0, 3.9], "torchft": [4.2, 4.1, 4.05, 4.0]}
    ranks = {"restart": [4, 4, 2, 2], "torchft": [2, 2, 1, 1]}
    fig = lost_rank_figure(losses, ranks, lost_after=2)
    colours = {}
    for trace in fig.data:
        colours.setdefault(trace.name, set()).add(trace.line.color)
    assert set(colours) == set(losses)
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({c.pop() for c in colours.values()}) == len(losses)      # and runs differ from each other
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(shown) == sorted(losses)                                 # each run named once
