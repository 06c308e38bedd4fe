"""Figures of chapter 08: what one rank holds under each ZeRO stage, measured beside the formula.

`zero_memory_figure(rows)` draws one group of stacked bars per stage: parameters, gradients and
optimizer state *measured* on a rank (`ZeRO.memory()`), and beside each the same three stacked
from the paper's formula (`pipelib.data_parallel.zero_formulas.zero_state_bytes`), hatched, so
a reader sees the two agree bar by bar. An optional capacity draws the device's memory as a
line: what does not fit is above it. `milestone_figure` draws the formulas alone for a large
model (GB per rank against the number of ranks, one line per stage, both axes logarithmic).
`loss_curves_figure` draws loss curves in distinct line styles, so curves that coincide stay visible.

Pure layer: plotly only; rows are plain dicts.

Introduced in chapter 08.
"""
from __future__ import annotations

from types import MappingProxyType

import plotly.graph_objects as go

CATEGORIES = ("parameters", "gradients", "optimizer")
COLOURS = MappingProxyType({"parameters": "#4C78A8", "gradients": "#F58518", "optimizer": "#54A24B"})
STAGE_NAMES = MappingProxyType({0: "stage 0 (DDP)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"})


def _scale(nbytes_max: float) -> tuple[str, float]:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes_max >= div:
            return unit, div
    return "bytes", 1.0


def zero_memory_figure(rows: list[dict], capacity: int | None = None,
                       title: str = "Bytes per rank: measured beside the formula") -> go.Figure:
    """rows: {"stage": s, "measured": {category: bytes}, "formula": {category: bytes}}."""
    top = max(sum(r[k][c] for c in CATEGORIES) for r in rows for k in ("measured", "formula"))
    unit, div = _scale(max(top, capacity or 0))
    x = [[STAGE_NAMES.get(r["stage"], str(r["stage"])) for r in rows for _ in (0, 1)],
         [side for _ in rows for side in ("measured", "formula")]]
    fig = go.Figure()
    for c in CATEGORIES:
        y = [r[side][c] / div for r in rows for side in ("measured", "formula")]
        fig.add_bar(x=x, y=y, name=c, marker_color=COLOURS[c],
                    marker_pattern_shape=["", "/"] * len(rows),
                    hovertemplate=f"{c}: %{{y:.4g}} {unit}<extra></extra>")
    if capacity is not None:
        fig.add_hline(y=capacity / div, line_dash="dash", line_color="#E45756",
                      annotation_text=f"device memory {capacity / div:.3g} {unit}")
    fig.update_layout(barmode="stack", title=title, yaxis_title=f"{unit} per rank", height=380,
                      legend_title_text="held on one rank", margin=dict(t=50, b=40))
    return fig


def milestone_figure(psi: float, worlds: list[int], table: dict, unit: str = "GB",
                     title: str | None = None) -> go.Figure:
    """table: {stage: [bytes per rank / unit for each world size]} -> one line per stage."""
    fig = go.Figure()
    for s, ys in table.items():
        fig.add_scatter(x=worlds, y=ys, mode="lines+markers", name=STAGE_NAMES.get(s, str(s)),
                        hovertemplate=f"N = %{{x}}: %{{y:.3g}} {unit}<extra></extra>")
    size = next((f"{psi / d:.3g}{u}" for u, d in (("B", 1e9), ("M", 1e6), ("k", 1e3)) if psi >= d), f"{psi:g}")
    ticks = [v * 10 ** e for e in range(-3, 7) for v in (1, 2, 5)]
    fig.update_layout(title=title or f"Model states per rank, {size} parameters, mixed-precision Adam",
                      xaxis_title="data-parallel ranks N (log scale)", yaxis_title=f"{unit} per rank (log scale)",
                      xaxis_type="log", yaxis_type="log", height=360, margin=dict(t=50, b=40))
    fig.update_xaxes(tickvals=list(worlds), ticktext=[str(n) for n in worlds])
    fig.update_yaxes(tickvals=ticks)
    return fig


def loss_curves_figure(curves: dict, title: str = "Training loss") -> go.Figure:
    """curves: {name: [loss per step]} -> one line per name, against the step."""
    fig = go.Figure()
    styles = [dict(width=6), dict(width=2, dash="dash"), dict(width=2, dash="dot")]  # equal curves stay visible
    for i, (name, ys) in enumerate(curves.items()):
        fig.add_scatter(x=list(range(1, len(ys) + 1)), y=list(ys), mode="lines", name=name,
                        line=styles[i % len(styles)], opacity=0.5 if i == 0 else 1.0)
    fig.update_layout(title=title, template="plotly_white",
                      xaxis_title="optimizer step", yaxis_title="loss (nats per character)",
                      height=340, margin=dict(t=50, b=40))
    return fig
