"""Figures of chapter 18: what a checkpoint costs, and how often to take one.

`lost_time_figure(intervals_s, lost, young_s, daly_s)` draws the share of time lost against the
checkpoint interval (saves on the left, recomputed work on the right), with Young's and Daly's
optima marked; `save_time_figure(rows)` draws measured save times against the state's size,
with the fitted line whose slope is the bandwidth of a save; `lost_rank_figure(losses, ranks,
lost_after)` draws the loss per step of runs that lost a rank (pipelib's restart resharded to
fewer ranks, torchft's replicas going on) beside the uninterrupted run, and under it how many
ranks or replicas took part in each step.

Pure layer: plotly and the pure arithmetic of `pipelib.checkpoint.interval`; the numbers come
from measured saves.
Introduced in chapter 18.
"""
from __future__ import annotations

from plotly.colors import qualitative
import plotly.graph_objects as go


def lost_time_figure(intervals_s, lost, young_s: float, daly_s: float, lost_young: float,
                     title: str = "Time lost against the checkpoint interval") -> go.Figure:
    """intervals_s, lost: the curve (seconds, fractions); Young's and Daly's intervals marked."""
    minutes = [t / 60 for t in intervals_s]
    fig = go.Figure(go.Scatter(x=minutes, y=[100 * f for f in lost], mode="lines", name="lost (first order)",
                               hovertemplate="every %{x:.1f} min: %{y:.2f} % lost<extra></extra>"))
    for name, t, dash in (("Young", young_s, "dash"), ("Daly", daly_s, "dot")):
        fig.add_vline(x=t / 60, line_dash=dash, annotation_text=f"{name}: {t / 60:.1f} min",
                      annotation_position="top right" if name == "Young" else "bottom right")
    fig.add_trace(go.Scatter(x=[young_s / 60], y=[100 * lost_young], mode="markers", name="optimum",
                             marker=dict(size=10)))
    fig.update_layout(title=title, xaxis_title="checkpoint interval (minutes)", yaxis_title="time lost (%)",
                      xaxis_type="log", height=380, margin=dict(l=60, r=20, t=50, b=50))
    return fig


def save_time_figure(rows: list[dict], title: str = "Save time against the state's size") -> go.Figure:
    """rows: {"mib": size, "seconds": measured save time}; a least-squares line through them."""
    from pipelib.checkpoint.interval import fit_save_time

    xs, ys = [r["mib"] for r in rows], [r["seconds"] for r in rows]
    fixed, slope = fit_save_time(xs, ys)
    fig = go.Figure(go.Scatter(x=xs, y=[1e3 * y for y in ys], mode="markers", name="measured",
                               hovertemplate="%{x:.0f} MiB: %{y:.1f} ms<extra></extra>"))
    line = [fixed + slope * x for x in (min(xs), max(xs))]
    fig.add_trace(go.Scatter(x=[min(xs), max(xs)], y=[1e3 * v for v in line], mode="lines",
                             name=f"fit: {1 / slope:.0f} MiB/s" if slope > 0 else "fit", line_dash="dash"))
    fig.update_layout(title=title, xaxis_title="state saved (MiB)", yaxis_title="save time (ms)", height=360,
                      margin=dict(l=60, r=20, t=50, b=50))
    return fig


def lost_rank_figure(losses: dict, ranks: dict, lost_after: int,
                     title: str = "A rank lost for good: the loss per step, and who took part") -> go.Figure:
    """losses: {run: [loss per step]}; ranks: {run: [ranks or replicas in each step]} (runs of
    `losses` may be missing); lost_after: the last step before the loss (a line after it)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.08)
    names = list(dict.fromkeys([*losses, *ranks]))
    palette = qualitative.Plotly
    color = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    for i, (name, ys) in enumerate(losses.items()):  # earlier runs drawn wider, so a run that retraces one shows both
        width = max(2, 8 - 3 * i)
        fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=list(ys), mode="lines+markers", name=name,
                                 legendgroup=name, line=dict(color=color[name], width=width),
                                 marker=dict(color=color[name], size=width + 4), opacity=0.6 if i == 0 else 1,
                                 hovertemplate=f"{name}<br>step %{{x}}: %{{y:.6f}}<extra></extra>"),
                      row=1, col=1)
    for name, ns in ranks.items():
        fig.add_trace(go.Scatter(x=list(range(1, len(ns) + 1)), y=list(ns), mode="lines+markers", name=name,
                                 legendgroup=name, showlegend=name not in losses, line_shape="hv",
                                 line=dict(color=color[name]), marker=dict(color=color[name]),
                                 hovertemplate=f"{name}<br>step %{{x}}: %{{y}}<extra></extra>"), row=2, col=1)
    for row in (1, 2):
        fig.add_vline(x=lost_after + 0.5, line_dash="dot", row=row, col=1)
    fig.add_annotation(x=lost_after + 0.5, y=1, yref="y domain", text="rank lost", showarrow=False,
                       xanchor="left", yanchor="top", xshift=4, row=1, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="taking part", rangemode="tozero", dtick=1, row=2, col=1)
    fig.update_xaxes(title_text="step", dtick=1, row=2, col=1)
    fig.update_layout(title=dict(text=title, y=0.98, yanchor="top"), height=500,
                      margin=dict(l=60, r=20, t=90, b=50),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"))
    return fig
