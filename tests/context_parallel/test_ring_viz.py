"""Chapter 17's overlap figure: on its log x axis the crossover's line and its label sit at c*
(plotly takes a log axis' annotation x as log10, a shape's as data), and no axis runs away."""
import math

from pipelib.viz.ring import overlap_figure

ROWS = [{"shard_len": c, "hidden": h, "step_over_compute": s}
        for c, h, s in ((16, 0.3, 31.5), (64, 0.5, 2.5), (148, 0.93, 1.05), (1024, 1.0, 1.0))]


def test_overlap_figure_marks_the_crossover_where_it_is():
    fig = overlap_figure(ROWS, 146.6)
    assert fig.layout.xaxis.type == "log"
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == 146.6
    (label,) = fig.layout.annotations
    assert math.isclose(label.x, math.log10(146.6)) and "147" in label.text
    assert list(fig.layout.xaxis.tickvals) == [16, 32, 64, 128, 256, 512, 1024]
    assert fig.layout.yaxis2.type == "log" and 1 in fig.layout.yaxis2.tickvals
