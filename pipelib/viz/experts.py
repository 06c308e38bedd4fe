"""Figures of chapter 16 (mixture of experts), drawn from the trace and from routing counts.

- `dispatch_matrices(trace, label, row_bytes)`: per step, the matrix of tokens each rank sent to
  each other rank in one dispatch, read from the SEND events inside that dispatch's COLLECTIVE
  event (a rank keeps its own tokens: the diagonal comes from `own`, when given);
- `traffic_figure(matrices)`: who sends how many tokens to whom, one heatmap per step, animated
  over training;
- `load_figure(curves)`: the max/mean load per expert over a training run, one line per
  balancing method (none, the Switch loss, DeepSeek-V3's bias);
- `drop_rate_figure(factors, rates)`: the share of choices dropped against the capacity factor,
  one line per drop policy.

The pure layer: plotly and `pipelib.trace`, no torch. Chapter 16.
"""
from __future__ import annotations

import plotly.graph_objects as go

from types import MappingProxyType

from pipelib.trace import Kind, Trace
from pipelib.viz.display import play_controls

# the book's look, as the other chapters' figures (viz.timeline, viz.ddp): white, thin margins,
# the width the page gives (no fixed width), the legend above the plot, out of the lines' way
_LOOK = MappingProxyType(dict(template="plotly_white", margin=dict(l=10, r=10, t=90, b=40), height=420,
                              legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0)))


def dispatch_matrices(trace: Trace, label: str, row_bytes: int, own=None) -> list[list[list[int]]]:
    """One n x n matrix per call of the collective labelled `label` (in order on every rank):
    m[src][dst] = tokens src sent dst, its SEND bytes over `row_bytes`. `own[step][rank]`, when
    given, fills the diagonal (rows a rank keeps send no message)."""
    n = trace.world_size or (max(e.rank for e in trace) + 1)
    calls = {r: sorted((e for e in trace if e.rank == r and e.kind == Kind.COLLECTIVE and e.label == label),
                       key=lambda e: e.start) for r in range(n)}
    steps = min((len(c) for c in calls.values()), default=0)
    name = label.split(":")[0]
    out = [[[0] * n for _ in range(n)] for _ in range(steps)]
    for r, events in calls.items():
        sends = sorted((e for e in trace if e.rank == r and e.kind == Kind.SEND and e.label.startswith(name + " ")),
                       key=lambda e: e.start)
        for step, call in enumerate(events[:steps]):
            for e in sends:
                if call.start <= e.start < call.end and e.peer is not None:  # the next call may start at its end
                    if e.bytes % row_bytes:
                        raise ValueError(f"dispatch_matrices: {e.bytes} bytes from rank {r} to {e.peer} are not "
                                         f"whole rows of {row_bytes} bytes; pass the bytes of one token's row")
                    out[step][r][e.peer] += e.bytes // row_bytes
            if own is not None:
                out[step][r][r] = own[step][r]
    return out


def _heatmap(m, zmax):
    n = len(m)
    return go.Heatmap(z=m, x=list(range(n)), y=list(range(n)), zmin=0, zmax=zmax, colorscale="Blues",
                      text=[[str(v) for v in row] for row in m], texttemplate="%{text}",
                      hovertemplate="rank %{y} sends rank %{x}: %{z} tokens<extra></extra>")


def traffic_figure(matrices, title: str = "Tokens dispatched: who sends how many to whom") -> go.Figure:
    """A heatmap per step (rows: senders, columns: receivers), animated over the steps; the
    figure shows the last step until "play" is pressed."""
    if not matrices:
        raise ValueError("traffic_figure: no steps; pass one n x n matrix per step (dispatch_matrices)")
    zmax = max(max(max(row) for row in m) for m in matrices) or 1
    fig = go.Figure(data=[_heatmap(matrices[-1], zmax)])
    names = [f"step {i}" for i in range(len(matrices))]
    fig.frames = [go.Frame(data=[_heatmap(m, zmax)], name=name) for m, name in zip(matrices, names)]
    n = len(matrices[0])
    fig.update_layout(title=title, template="plotly_white", height=500, margin=dict(l=10, r=10, t=110, b=120),
                      xaxis=dict(title="to rank", tickvals=list(range(n)), side="top"),
                      yaxis=dict(title="from rank", tickvals=list(range(n)), autorange="reversed"))
    play_controls(fig, names, [str(i) for i in range(len(matrices))], prefix="step ", y=-0.02)
    return fig


def load_figure(curves: dict, title: str = "Load imbalance over training (max / mean tokens per expert)"
                ) -> go.Figure:
    """One line per method: {name: [max/mean per step]}; 1.0 is a perfectly even load."""
    fig = go.Figure()
    for name, ys in curves.items():
        fig.add_trace(go.Scatter(x=list(range(len(ys))), y=list(ys), mode="lines+markers", name=name))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="even", annotation_position="bottom right")
    fig.update_layout(title=title, xaxis_title="optimizer step", yaxis_title="max / mean load", **_LOOK)
    return fig


def drop_rate_figure(factors, rates: dict, title: str = "Choices dropped against the capacity factor"
                     ) -> go.Figure:
    """One line per drop policy: {policy: [share dropped at each factor]}."""
    fig = go.Figure()
    for name, ys in rates.items():
        fig.add_trace(go.Scatter(x=list(factors), y=[100 * y for y in ys], mode="lines+markers", name=name))
    fig.update_layout(title=title, xaxis_title="capacity factor f (C = ceil(f S k / E))",
                      yaxis_title="choices dropped (%)", **_LOOK)
    return fig
