"""Figures of chapter 09: a matrix split by rank, every collective of a TP step read from the
trace, and the communication share of a forward on different links.

Drawn from `pipelib.trace` Events (COLLECTIVE events labelled by `pipelib.tensor_parallel.ops`,
``"<collective>: <layer> <operator> forward|backward"``) and from plain numbers. Never imports
torch or the runtime (the pure layer).

Introduced in chapter 09.
"""
from __future__ import annotations

from types import MappingProxyType

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipelib.trace import Kind, Trace

RANK_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2", "#72B7B2", "#FF9DA6", "#9D755D")
COLLECTIVE_COLORS = MappingProxyType({"all_reduce": "#4C78A8", "reduce_scatter": "#F58518", "all_gather": "#54A24B"})


def tp_split_figure(rows: int, cols: int, t: int, title: str = "Who holds which weights") -> go.Figure:
    """Two (rows x cols) weight matrices (torch's (out, in) layout) coloured by the rank that
    holds each entry: column-parallel (split by output rows) and row-parallel (split by input
    columns)."""
    col_owner = [[r * t // rows for _ in range(cols)] for r in range(rows)]
    row_owner = [[c * t // cols for c in range(cols)] for _ in range(rows)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "column-parallel A (out x in):<br>rank r keeps out rows",
        "row-parallel B (out x in):<br>rank r keeps in columns"))
    scale = [[i / max(t - 1, 1), RANK_COLORS[i % len(RANK_COLORS)]] for i in range(t)]
    for k, owner in enumerate((col_owner, row_owner)):
        fig.add_trace(go.Heatmap(z=owner, text=[[f"rank {v}" for v in row] for row in owner],
                                 texttemplate="%{text}",
                                 colorscale=scale if t > 1 else [[0, RANK_COLORS[0]], [1, RANK_COLORS[0]]],
                                 showscale=False, zmin=0, zmax=max(t - 1, 1), xgap=2, ygap=2,
                                 hovertemplate="row %{y}, column %{x}: %{text}<extra></extra>"), 1, k + 1)
    fig.update_yaxes(autorange="reversed", title="output feature")
    fig.update_xaxes(title="input feature")
    fig.update_layout(title=title, template="plotly_white", height=360)
    return fig


def tp_collectives_figure(trace: Trace, rank: int = 0, title: str = "Every collective of one TP step") -> go.Figure:
    """One bar per COLLECTIVE event of `rank`, in order, its height the bytes this rank sent,
    coloured by collective; hover names the layer and operator (f, g, or the sequence-parallel
    pair). Forward calls left of the dashed line, backward right of it."""
    calls = [e for e in trace.events if e.rank == rank and e.kind == Kind.COLLECTIVE]
    fig = go.Figure()
    names = []
    for i, e in enumerate(calls):
        name, _, what = e.label.partition(": ")
        names.append(name)
        fig.add_trace(go.Bar(x=[i], y=[e.bytes / 1024], marker_color=COLLECTIVE_COLORS.get(name, "#999"),
                             name=name, legendgroup=name, showlegend=name not in names[:-1],
                             hovertext=[f"{what or name}<br>{e.bytes} bytes"], hoverinfo="text"))
    first_back = next((i for i, e in enumerate(calls) if "backward" in e.label), None)
    if first_back is not None:
        fig.add_vline(x=first_back - 0.5, line_dash="dash", line_color="#555")
        for text, anchor in (("\u2190 forward ", "right"), (" backward \u2192", "left")):
            fig.add_annotation(x=first_back - 0.5, y=1.04, yref="paper", text=text, showarrow=False,
                               xanchor=anchor, yanchor="bottom")
    fig.update_xaxes(title=f"collective call on rank {rank}, in order")
    fig.update_yaxes(title="KiB sent by this rank")
    fig.update_layout(title=title, template="plotly_white", height=380, bargap=0.15,
                      legend=dict(orientation="h", y=-0.25))
    return fig


def tp_link_share_figure(rows: list[dict], title: str = "Share of a forward spent in TP all-reduces") -> go.Figure:
    """Bars of `share` (communication time / forward time) per link, one group per t. Each row:
    {"link": name, "t": degree, "share": fraction, "ms": milliseconds}."""
    fig = go.Figure()
    for i, t in enumerate(sorted({r["t"] for r in rows})):
        sel = [r for r in rows if r["t"] == t]
        fig.add_trace(go.Bar(x=[r["link"] for r in sel], y=[100 * r["share"] for r in sel], name=f"t = {t}",
                             marker_color=RANK_COLORS[i % len(RANK_COLORS)],
                             text=[f"{100 * r['share']:.3g}%" for r in sel], textposition="outside",
                             hovertext=[f"{r['ms']:.3g} ms of all-reduces" for r in sel], hoverinfo="text+y"))
    ticks = [v * 10 ** e for e in range(-2, 5) for v in (1, 2, 5)]
    fig.update_yaxes(type="log", title="all-reduce time, % of the forward (log scale)",
                     tickvals=ticks, ticktext=[f"{v:g}%" for v in ticks])
    fig.add_hline(y=100, line_dash="dot", line_color="#555")
    fig.add_annotation(x=0, xref="paper", xanchor="left", y=2, yanchor="bottom", showarrow=False,
                       text="as long as the forward")  # annotations on a log axis take log10(100)
    fig.update_layout(title=title, template="plotly_white", height=400, barmode="group",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def tp_memory_figure(rows: list[dict], title: str = "Activations kept for backward, per rank") -> go.Figure:
    """Bars of saved-activation bytes per setting, measured beside counted. Each row:
    {"setting": "t=2 TP", "measured": bytes, "counted": bytes or None}."""
    fig = go.Figure()
    x = [r["setting"] for r in rows]
    fig.add_trace(go.Bar(x=x, y=[r["measured"] / 1024 for r in rows], name="measured (memory tracker)",
                         marker_color=RANK_COLORS[0],
                         text=[f"{r['measured'] / 1024:.1f}" for r in rows], textposition="outside"))
    if any(r.get("counted") is not None for r in rows):
        fig.add_trace(go.Bar(x=x, y=[(r.get("counted") or 0) / 1024 for r in rows], name="counted (formula)",
                             marker_color=RANK_COLORS[1]))
    fig.update_yaxes(title="KiB saved for backward")
    fig.update_layout(title=title, template="plotly_white", height=380, barmode="group",
                      legend=dict(orientation="h", y=-0.2))
    return fig
