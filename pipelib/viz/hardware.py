"""Figures of the machine measured (chapter 01): the roofline, and read bandwidth by working set.

Drawn from measurements of `pipelib.hardware`: `Roofline`s and `MeasuredOp`s, the curve of
`read_bandwidth_curve` and the cache sizes of `machine_info`. Never imports torch.

Introduced in chapter 01.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from pipelib.costmodel import KiB, MiB


def roofline_figure(roofs, ops=(), title: str = "Roofline", imin: float = 1 / 16,
                    imax: float = 4096.0):
    """Log-log roofline: one line per `Roofline`, one marker per `MeasuredOp`."""
    colors = ["#4C78A8", "#F58518", "#54A24B", "#B279A2"]
    fig = go.Figure()
    xs = [imin * 2 ** (i / 4) for i in range(int(4 * math.log2(imax / imin)) + 1)]
    for i, r in enumerate(roofs):
        fig.add_trace(go.Scatter(
            x=xs, y=[r.attainable(x) for x in xs], mode="lines", name=r.name,
            line=dict(color=colors[i % len(colors)], width=3 if i == 0 else 2,
                      dash="solid" if i == 0 else "dot"),
            hovertemplate="I=%{x:.3g} FLOP/B: %{y:.3s}FLOP/s<extra>" + r.name + "</extra>"))
    if ops:
        fig.add_trace(go.Scatter(
            x=[o.intensity for o in ops], y=[o.achieved for o in ops], mode="markers+text",
            name="measured operations", text=[o.name for o in ops], textposition="top center",
            marker=dict(size=10, color="#E45756", symbol="diamond"),
            hovertemplate="%{text}<br>I=%{x:.3g} FLOP/B<br>%{y:.3s}FLOP/s<extra></extra>"))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title="FLOP/s", exponentformat="SI")
    fig.update_layout(title=title, template="plotly_white", height=520,
                      legend=dict(orientation="h", y=-0.2))
    return fig


def bandwidth_figure(curve, caches=(), title: str = "Read bandwidth by working-set size"):
    """Bandwidth against working-set size (`read_bandwidth_curve`), with the cache sizes marked."""
    fig = go.Figure(go.Scatter(
        x=[s for s, _ in curve], y=[b / 1e9 for _, b in curve], mode="lines+markers",
        name="measured", hovertemplate="%{x:.3s}B: %{y:.1f} GB/s<extra></extra>"))
    for level, kind, size in caches:
        if kind != "Instruction":
            fig.add_vline(x=size, line=dict(dash="dot", color="gray"),
                          annotation_text=f"L{level} {size // KiB} KiB" if size < MiB
                          else f"L{level} {size // MiB} MiB")
    fig.update_xaxes(type="log", title="working set (bytes)", exponentformat="SI")
    fig.update_yaxes(title="GB/s", rangemode="tozero")
    fig.update_layout(title=title, template="plotly_white", height=420, showlegend=False)
    return fig
