"""Figures drawn from events: timelines, memory over time, scaling curves.

Every figure here takes a `Trace` (measured on the cluster or produced by `simulate`), never
numbers typed by hand. Figures are deterministic for the same events, so a re-run gives the
same output. Animations use plotly's own frames, so they play in the static book too.
Show them with `pipelib.display.show`. This module never imports torch.distributed.

Introduced in chapter 04.
"""
from __future__ import annotations

import plotly.graph_objects as go

from .trace import Kind, Trace

KIND_COLORS = {
    Kind.COMPUTE: "#4C78A8",
    Kind.SEND: "#F58518",
    Kind.RECV_WAIT: "#E45756",
    Kind.TRANSFER: "#72B7B2",
    Kind.COLLECTIVE: "#B279A2",
}
LABEL_COLORS = {"F": "#4C78A8", "B": "#54A24B", "I": "#54A24B", "W": "#9D755D",
                "serial": "#E45756", "parallel": "#4C78A8", "optimizer": "#B279A2"}
PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6"]


def _rank_names(trace: Trace, kinds=(Kind.COMPUTE,)) -> list[str]:
    return [f"rank {r} · idle {100 * trace.idle_fraction(r, kinds):.0f}%" for r in range(trace.world_size)]


def _bars(trace: Trace, t_cut: float | None, show_kinds, scale: float):
    """One bar trace per (kind, label) group, clipped at t_cut for animation frames.

    Times are drawn from the trace's first event (a wall-clock trace starts long after the epoch).
    """
    names = _rank_names(trace)
    t_first = trace.start
    groups: dict[tuple, list] = {}
    for e in trace.events:
        if e.kind not in show_kinds or e.duration <= 0:
            continue
        groups.setdefault((e.kind, e.label if e.kind == Kind.COMPUTE else e.kind.value), []).append(e)
    out = []
    for (kind, label), evs in sorted(groups.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        ends = [e.end if t_cut is None else min(e.end, max(t_cut, e.start)) for e in evs]
        color = LABEL_COLORS.get(label, KIND_COLORS[kind]) if kind == Kind.COMPUTE else KIND_COLORS[kind]
        out.append(go.Bar(
            name=label, orientation="h", y=[names[e.rank] for e in evs],
            base=[(e.start - t_first) * scale for e in evs], x=[(end - e.start) * scale for e, end in zip(evs, ends)],
            marker=dict(color=color, line=dict(width=0.5, color="white")),
            opacity=1.0 if kind == Kind.COMPUTE else 0.75,
            text=[_label(e) for e in evs], hovertemplate="%{text}<extra></extra>",
            width=0.8 if kind == Kind.COMPUTE else 0.35,
        ))
    return out


def _label(e) -> str:
    parts = [f"rank {e.rank}", e.label, e.kind.value]
    if e.stage is not None:
        parts.append(f"stage {e.stage}")
    if e.microbatch is not None:
        parts.append(f"microbatch {e.microbatch}")
    if e.bytes:
        parts.append(f"{e.bytes} B")
    if e.peer is not None:
        parts.append(f"peer {e.peer}")
    return " · ".join(parts) + f" · {1e3 * e.start:.3f}-{1e3 * e.end:.3f} ms"


def timeline_figure(trace: Trace, title: str = "Timeline", *, animate: bool = True, frames: int = 24,
                    kinds=(Kind.COMPUTE, Kind.RECV_WAIT), unit: str = "ms") -> go.Figure:
    """One row per rank; gaps are idle time (share in the row label); animated as time advances."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    show_kinds = {Kind(k) for k in kinds}
    fig = go.Figure(_bars(trace, None, show_kinds, scale))
    names = _rank_names(trace)
    span = trace.span * scale
    fig.update_layout(
        title=f"{title} · bubble {100 * trace.bubble_fraction():.1f}% of {trace.world_size} × {span:.3g} {unit}",
        barmode="overlay", xaxis=dict(title=f"time ({unit})", range=[0, span * 1.02]),
        yaxis=dict(categoryorder="array", categoryarray=names[::-1]),
        height=260 + 38 * trace.world_size,
        legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
        margin=dict(l=10, r=10, t=90, b=40), template="plotly_white",
    )
    if animate and trace.events:
        cuts = [trace.start + trace.span * (i + 1) / frames for i in range(frames)]
        fig.frames = [go.Frame(data=_bars(trace, t, show_kinds, scale), name=f"{i}") for i, t in enumerate(cuts)]
        fig.update_layout(
            updatemenus=[dict(type="buttons", showactive=False, x=0, y=0, xanchor="left", yanchor="top",
                              pad=dict(t=45), buttons=[
                dict(label="▶ play", method="animate",
                     args=[None, dict(frame=dict(duration=120, redraw=True), fromcurrent=False, transition=dict(duration=0))]),
            ])],
            sliders=[dict(active=frames - 1, x=0.12, len=0.88, y=0, yanchor="top", pad=dict(t=30),
                          currentvalue=dict(prefix="t = ", suffix=f" {unit}"), steps=[
                dict(label=f"{(t - trace.start) * scale:.3g}", method="animate",
                     args=[[f"{i}"], dict(mode="immediate", frame=dict(duration=0, redraw=True))])
                for i, t in enumerate(cuts)])],
        )
    return fig


def memory_figure(trace: Trace, title: str = "Memory over time", unit: str = "ms") -> go.Figure:
    """Bytes allocated per rank after each event, as a step line per rank."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    fig = go.Figure()
    for r in range(trace.world_size):
        evs = [e for e in trace.events if e.rank == r and e.memory is not None]
        if not evs:
            continue
        xs, ys = [0.0], [0.0]
        for e in sorted(evs, key=lambda e: e.end):
            xs.append((e.end - trace.start) * scale)
            ys.append(e.memory / 2**20)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name=f"rank {r}",
                                 line=dict(color=PALETTE[r % len(PALETTE)])))
    fig.update_layout(title=title, xaxis_title=f"time ({unit})", yaxis_title="allocated (MiB)",
                      template="plotly_white", height=320, margin=dict(l=10, r=10, t=50, b=10))
    return fig


def speedup_figure(series: dict, laws: dict, title: str = "Speedup") -> go.Figure:
    """Measured speedups (name -> (ks, speedups)) as points, laws (name -> (ks, values)) as lines."""
    fig = go.Figure()
    kmax = max(max(ks) for ks, _ in series.values())
    fig.add_trace(go.Scatter(x=[1, kmax], y=[1, kmax], mode="lines", name="ideal (linear)",
                             line=dict(color="#bbbbbb", dash="dot")))
    for i, (name, (ks, ys)) in enumerate(laws.items()):
        fig.add_trace(go.Scatter(x=list(ks), y=list(ys), mode="lines", name=name,
                                 line=dict(color=PALETTE[i % len(PALETTE)], dash="dash")))
    for i, (name, (ks, ys)) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(ks), y=list(ys), mode="markers", name=name,
                                 marker=dict(size=10, color=PALETTE[i % len(PALETTE)])))
    fig.update_layout(title=title, xaxis_title="workers k", yaxis_title="speedup",
                      template="plotly_white", height=380, margin=dict(l=10, r=10, t=50, b=10))
    return fig
