"""Figures of activation recomputation (chapter 14): memory over compute, and the trade-off.

- `recompute_memory_figure`: saved-activation bytes held after every op of one training step,
  one line per policy, against the matmul FLOPs done so far (`pipelib.recompute.measure.OpClock`
  samples): memory rises through the forward and falls through the backward; a recomputing
  policy's line is lower and longer (its rerun forwards), with a bump at each rerun;
- `tradeoff_figure`: one point per policy (and per k): peak saved-activation bytes against the
  extra compute, measured, with the formula's prediction as open circles.

Pure layer: plotly only; the inputs are plain numbers.
"""
from __future__ import annotations

import plotly.graph_objects as go

from pipelib.viz.timeline import PALETTE

MIB = 2**20


def recompute_memory_figure(samples: dict, title: str = "Saved activations over one step",
                            per: float = MIB) -> go.Figure:
    """`samples`: {label: [(flops so far, bytes held, phase), ...]} (OpClock.samples)."""
    fig = go.Figure()
    for i, (label, rows) in enumerate(samples.items()):
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(
            x=[round(f / 1e6, 4) for f, _, _ in rows], y=[round(b / per, 4) for _, b, _ in rows],
            mode="lines", line_shape="hv", name=label, line=dict(color=color),
            hovertemplate=f"{label} · %{{x}} MFLOP done: %{{y}} MiB held<extra></extra>"))
        ends = [f for f, _, phase in rows if phase == "forward"]
        if ends:
            fig.add_vline(x=round(max(ends) / 1e6, 4), line=dict(color=color, dash="dot", width=1))
    fig.update_layout(title=title, xaxis_title="matmul MFLOP done (forward, then backward; "
                      "dotted: end of the forward)", yaxis_title="saved activations (MiB)",
                      template="plotly_white", height=360, margin=dict(l=10, r=10, t=50, b=10))
    return fig


def tradeoff_figure(points: list[dict], title: str = "Peak memory against extra compute",
                    per: float = MIB) -> go.Figure:
    """`points`: dicts with label, extra (fraction of the step's FLOPs), peak and predicted
    (bytes). A filled marker per measurement, an open circle for its prediction."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[round(100 * p["extra"], 3) for p in points], y=[round(p["peak"] / per, 4) for p in points],
        mode="markers+text", text=[p["label"] for p in points], textposition="top right",
        name="measured", marker=dict(size=10, color=PALETTE[0]),
        hovertemplate="%{text}: +%{x}% FLOPs, peak %{y} MiB<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[round(100 * p["extra"], 3) for p in points],
        y=[round(p["predicted"] / per, 4) for p in points], mode="markers", name="formula",
        marker=dict(size=16, color="rgba(0,0,0,0)", line=dict(color=PALETTE[1], width=2)),
        hovertemplate="formula: %{y} MiB<extra></extra>"))
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=title, xaxis_title="extra FLOPs (% of a step without recomputation)",
                      yaxis_title="peak saved activations (MiB)", template="plotly_white",
                      height=380, margin=dict(l=10, r=10, t=50, b=10))
    return fig
