"""Figures of chapter 07 (data parallelism): bucket sizes, communication efficiency, 1 vs 2 ranks.

The DDP step's own timeline is `pipelib.viz.timeline.timeline_figure` with COLLECTIVE events
shown (``kinds=("compute", "collective", "recv-wait")``): the all-reduces are the thin bars on
each rank's row, under the backward bars they overlap. Every figure here takes rows the cluster
timed (simulated on the virtual clock, or measured on real devices) and predictions from
`pipelib.data_parallel.efficiency`, never numbers typed by hand.

Pure: plotly only, no torch.distributed, no runtime. Introduced in chapter 07.
"""
from __future__ import annotations

import math
from types import MappingProxyType

import plotly.graph_objects as go

from pipelib.trace import Kind, Trace
from pipelib.viz.display import time_unit
from pipelib.viz.timeline import timeline_figure

COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2")
MODEL_COLORS = ("#222222", "#7f7f7f")
# the legend under the plot: above it, a legend that wraps to two rows on a narrow page (the
# book's column) runs into the title
BASE = MappingProxyType(dict(template="plotly_white", margin=dict(l=10, r=10, t=60, b=40),
                             legend=dict(orientation="h", x=0, xanchor="left", y=-0.2, yanchor="top")))


def bucket_sweep_figure(rows: list[dict], series: dict[str, str], title: str = "Step time vs bucket size",
                        predicted: dict[str, str] | None = None) -> go.Figure:
    """Step time against bucket size (log x): one line per `series` {column: legend name} of
    `rows` (dicts with "bucket_bytes", "buckets" and the columns, in seconds); `predicted`
    columns drawn dashed. Hover names the number of buckets."""
    cols = list(series) + list(predicted or {})
    unit, scale = time_unit(max(r[c] for r in rows for c in cols))
    fig = go.Figure()
    x = [r["bucket_bytes"] for r in rows]
    hover = [f"{r['buckets']} bucket{'s' if r['buckets'] != 1 else ''}" for r in rows]
    for i, (col, name) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=x, y=[r[col] * scale for r in rows], mode="markers+lines", name=name,
                                 text=hover, line=dict(color=COLORS[i % len(COLORS)]),
                                 hovertemplate=f"{name}<br>%{{x}} B, %{{text}}: %{{y:.4g}} {unit}<extra></extra>"))
    for i, (col, name) in enumerate((predicted or {}).items()):
        # dark and thin: a model equal to its measurement must still show on top of it
        fig.add_trace(go.Scatter(x=x, y=[r[col] * scale for r in rows], mode="lines", name=name,
                                 line=dict(color=MODEL_COLORS[i % len(MODEL_COLORS)], dash="dash", width=1.5),
                                 hovertemplate=f"{name}<br>%{{x}} B: %{{y:.4g}} {unit}<extra></extra>"))
    fig.update_xaxes(type="log", title_text="bucket size (bytes)")
    fig.update_yaxes(title_text=f"step time ({unit})", rangemode="tozero")
    fig.update_layout(title=title, height=400, **BASE)
    return fig


def efficiency_figure(measured: dict, predicted: dict, title: str = "Communication efficiency vs model size",
                      bands: dict | None = None, timed: str = "simulated") -> go.Figure:
    """compute / (compute + comm) against parameters (log x): `measured` {name: (params,
    efficiencies)} as markers labelled `timed` (the virtual clock's: "simulated"), `predicted`
    {name: (params, efficiencies)} as lines of the same colour (same names, in the same order),
    `bands` {label: (low, high)} shaded efficiency ranges."""
    fig = go.Figure()
    for label, (lo, hi) in (bands or {}).items():
        fig.add_hrect(y0=lo, y1=hi, fillcolor="#cccccc", opacity=0.25, line_width=0, layer="below",
                      annotation_text=label, annotation_position="top left")
    for i, (name, (x, y)) in enumerate(predicted.items()):
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{name} (model)", legendgroup=name,
                                 line=dict(color=COLORS[i % len(COLORS)], dash="dash"),
                                 hovertemplate=f"{name} model<br>%{{x:.3s}} parameters: %{{y:.3f}}<extra></extra>"))
    for i, (name, (x, y)) in enumerate(measured.items()):
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=f"{name} ({timed})", legendgroup=name,
                                 marker=dict(size=10, color=COLORS[i % len(COLORS)]),
                                 hovertemplate=f"{name} {timed}<br>%{{x:.3s}} parameters: %{{y:.3f}}<extra></extra>"))
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(title_text="compute / (compute + comm)", range=[0, 1.02])
    fig.update_layout(title=title, height=420, **BASE)
    return fig


def ranks_figure(params, ratios: dict, title: str = "2 ranks against 1, same global batch",
                 crossover: float | None = None) -> go.Figure:
    """Step time on 2 ranks / step time on 1 rank against parameters (log x), one line per
    `ratios` {name: values}; above 1 two ranks are slower. `crossover`: a dotted line at that
    many parameters."""
    fig = go.Figure()
    fig.add_hline(y=1.0, line=dict(color="grey", dash="dot"), annotation_text="2 ranks = 1 rank",
                  annotation_position="top left")
    for i, (name, ys) in enumerate(ratios.items()):
        fig.add_trace(go.Scatter(x=list(params), y=list(ys), mode="markers+lines", name=name,
                                 line=dict(color=COLORS[i % len(COLORS)]),
                                 hovertemplate=f"{name}<br>%{{x:.3s}} parameters: %{{y:.3f}}<extra></extra>"))
    if crossover:
        fig.add_vline(x=crossover, line=dict(color="grey", dash="dot"))
        fig.add_annotation(x=math.log10(crossover), y=1, yref="paper", text=f"{crossover:.3g}", showarrow=False,
                           xanchor="left", yanchor="top")
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(title_text="step on 2 ranks / step on 1")
    fig.update_layout(title=title, height=400, **BASE)
    return fig


def ddp_timelines_figure(traces: dict, title: str = "One DDP step, rank by rank"):
    """Two DDP steps on one time axis, `traces` = {label: Trace} with two entries (e.g. all-reduce
    after backward, then overlapped): the first's rows on top, the second's below (lighter).
    Compute bars (F, B, optimizer) and each all-reduce as a thin COLLECTIVE bar on its rank's
    row, on the communication lane: under the backward it overlaps, in the gaps where the
    compute lane waits for it. The messages inside each all-reduce are left out."""
    if len(traces) != 2:
        raise ValueError(f"ddp_timelines_figure draws two steps, got {len(traces)}: {list(traces)}")
    kinds = (Kind.COMPUTE, Kind.COLLECTIVE)
    shown = {label: [e for e in t.events if e.kind in kinds] for label, t in traces.items()}
    ranks = 1 + max((e.rank for evs in shown.values() for e in evs), default=0)  # the group's ranks only
    (a, ta), (b, tb) = [(label, Trace(evs, ranks)) for label, evs in shown.items()]
    return timeline_figure(ta, title, overlay=tb, groups=(a, b), kinds=kinds, idle_name="compute idle")
