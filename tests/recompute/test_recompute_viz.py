"""Chapter 14's figures, from a real measured step: plotly's own JSON, a stable id (a re-run
gives the same bytes), one line per policy and a prediction circle per point."""
import plotly.graph_objects as go

from pipelib.model import GPTConfig
from pipelib.recompute.measure import measure_policy
from pipelib.viz.display import figure_bundle
from pipelib.viz.recompute import recompute_memory_figure, tradeoff_figure

CFG = GPTConfig(n_layer=2, block_size=16)


def test_memory_figure_has_one_line_per_policy_ending_at_the_step_flops():
    runs = {p: measure_policy(CFG, p, batch=2) for p in ("none", "full")}
    fig = recompute_memory_figure({p: r.samples for p, r in runs.items()})
    lines = [t for t in fig.data if isinstance(t, go.Scatter)]
    assert [t.name for t in lines] == ["none", "full"]
    assert lines[1].x[-1] == round(runs["full"].flops / 1e6, 4) > lines[0].x[-1]
    assert figure_bundle(fig) == figure_bundle(recompute_memory_figure(
        {p: r.samples for p, r in runs.items()}))


def test_tradeoff_figure_draws_measured_and_predicted():
    pts = [{"label": "none", "extra": 0.0, "peak": 3 * 2**20, "predicted": 3 * 2**20},
           {"label": "full", "extra": 0.3, "peak": 2**20, "predicted": 2**20}]
    fig = tradeoff_figure(pts)
    assert [t.name for t in fig.data] == ["measured", "formula"]
    assert list(fig.data[0].y) == [3.0, 1.0] and list(fig.data[0].x) == [0.0, 30.0]
    assert "text/html" in figure_bundle(fig)
