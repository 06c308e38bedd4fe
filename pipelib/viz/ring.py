"""Figures of chapter 17 (ring attention, context parallelism), drawn from measurements.

- `work_figure`: compute time per rank under causal masking, one group of bars per layout
  (contiguous, zigzag, striped), each named with its max/mean, from a `Trace`;
- `overlap_figure`: as the shard length grows, the share of transfer time hidden behind compute
  and the step time over compute alone, with the predicted crossover shard length;
- `context_figure`: the longest context that fits against the number of ranks, measured points
  on the model's line;
- `variants_figure`: ring, all-gather and Ulysses side by side: bytes sent, peak memory and step
  time per rank.

Who sends which K/V block to whom, step by step, is `pipelib.viz.comm.collective_animation`
(the ring's messages are labelled like a collective's). The pure layer: plotly and
`pipelib.trace` only. Introduced in chapter 17.
"""
from __future__ import annotations

import math
from types import MappingProxyType

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipelib.trace import Trace
from pipelib.viz.display import short_number, time_unit
from pipelib.viz.timeline import PALETTE

_LOOK = MappingProxyType(dict(template="plotly_white", margin=dict(l=10, r=10, t=70, b=40),
             legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom")))


def work_figure(traces: dict[str, Trace], title: str = "Causal work per rank") -> go.Figure:
    """Compute time of each rank (busy time on the timeline), one bar group per layout."""
    span = max(max(t.busy(r) for r in range(t.world_size)) for t in traces.values())
    unit, scale = time_unit(span)
    fig = go.Figure()
    for i, (name, tr) in enumerate(traces.items()):
        busy = [tr.busy(r) for r in range(tr.world_size)]
        ratio = max(busy) * len(busy) / sum(busy)
        fig.add_trace(go.Bar(x=[f"rank {r}" for r in range(len(busy))], y=[b * scale for b in busy],
                             name=f"{name} (max/mean {ratio:.3f})", marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(title=title, barmode="group", yaxis_title=f"compute ({unit})", height=360, **_LOOK)
    return fig


def overlap_figure(rows: list[dict], crossover: float, title: str = "Transfer hidden behind compute") -> go.Figure:
    """rows: {"shard_len", "hidden" (0..1), "step_over_compute"} per measured shard length."""
    xs = [r["shard_len"] for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=xs, y=[100 * r["hidden"] for r in rows], mode="lines+markers",
                             name="transfer hidden (%)", marker_color=PALETTE[0]), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[r["step_over_compute"] for r in rows], mode="lines+markers",
                             name="step / compute alone", marker_color=PALETTE[3]), secondary_y=True)
    fig.add_vline(x=crossover, line_dash="dash", line_color="#888888")
    # on a log axis a shape takes data values but an annotation takes log10 of them
    fig.add_annotation(x=math.log10(crossover), y=0.5, xref="x", yref="paper", showarrow=False, xanchor="left",
                       text=f" predicted crossover<br> c* = {short_number(crossover)}", align="left")
    powers = [2**k for k in range(31) if min(xs) / 1.5 <= 2**k <= max(xs) * 1.5]
    fig.update_xaxes(type="log", title="shard length c = S / n (rows per rank)", tickvals=powers,
                     ticktext=[str(t) for t in powers])
    fig.update_yaxes(title_text="transfer hidden (%)", range=[0, 105], secondary_y=False)
    ratios = [r["step_over_compute"] for r in rows]
    ticks = [t for t in (1, 1.5, 2, 3, 5, 10, 20, 50, 100, 200) if min(ratios) / 1.5 <= t <= max(ratios) * 1.5]
    fig.update_yaxes(title_text="step time / compute time (log)", type="log", showgrid=False, tickvals=ticks,
                     ticktext=[f"{t:g}" for t in ticks], secondary_y=True)
    fig.update_layout(title=title, height=380, **{**_LOOK, "margin": dict(l=10, r=10, t=90, b=40)})
    return fig


def context_figure(measured: dict[int, int], model: dict[int, int],
                   title: str = "Longest context that fits") -> go.Figure:
    """Longest sequence per number of ranks: the model's line and the live runs' points."""
    fig = go.Figure()
    ks = sorted(model)
    fig.add_trace(go.Scatter(x=ks, y=[model[k] for k in ks], mode="lines", name="per-rank model × n",
                             line=dict(color=PALETTE[0], dash="dash")))
    mk = sorted(measured)
    fig.add_trace(go.Scatter(x=mk, y=[measured[k] for k in mk], mode="markers", name="measured on the cluster",
                             marker=dict(size=11, color=PALETTE[1])))
    fig.update_layout(title=title, xaxis_title="ranks n", yaxis_title="sequence length S", height=360, **_LOOK)
    return fig


def variants_figure(rows: dict[str, dict], title: str = "Ring, all-gather and Ulysses on the same inputs") -> go.Figure:
    """rows: variant -> {"bytes", "peak_memory", "time"} (per rank). Three panels."""
    names = list(rows)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("bytes sent per rank (KiB)", "peak memory per rank (KiB)",
                                                        "step time"))
    tmax = max(r["time"] for r in rows.values())
    unit, scale = time_unit(tmax)
    for col, (key, f) in enumerate((("bytes", 1 / 1024), ("peak_memory", 1 / 1024), ("time", scale)), 1):
        fig.add_trace(go.Bar(x=names, y=[rows[n][key] * f for n in names], showlegend=False,
                             marker_color=[PALETTE[i % len(PALETTE)] for i in range(len(names))]), row=1, col=col)
    fig.update_yaxes(title_text=unit, row=1, col=3)
    fig.update_layout(title=title, height=340, **_LOOK)
    return fig
