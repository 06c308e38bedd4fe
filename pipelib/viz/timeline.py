"""Figures drawn from events: timelines, memory over time, scaling curves.

Every figure here takes a `Trace` (measured on the cluster or produced by `simulate`), never
numbers typed by hand. Figures are deterministic for the same events, so a re-run gives the
same output. Animations use plotly's own frames, so they play in the static book too: time
advancing (`timeline_figure`) or a parameter changing (`sweep_figure`, the static stand-in for
the schedule explorer's sliders, `pipelib.pipeline.explorer`). `timeline_figure(overlay=...)` draws
measured above predicted on one time axis.
Show them with `pipelib.viz.display.show`. This module never imports torch.distributed.

Introduced in chapter 04.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from pipelib.trace import Kind, Trace

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


def _rank_names(trace: Trace, kinds=(Kind.COMPUTE,), prefix: str = "") -> list[str]:
    return [f"{prefix}rank {r} · idle {100 * trace.idle_fraction(r, kinds):.0f}%" for r in range(trace.world_size)]


def _groups(trace: Trace, show_kinds) -> dict[tuple, list]:
    """Events to draw, by (kind, label): one bar trace (one legend entry) per group."""
    groups: dict[tuple, list] = {}
    for e in trace.events:
        if e.kind in show_kinds and e.duration > 0:
            groups.setdefault((e.kind, e.label if e.kind == Kind.COMPUTE else e.kind.value), []).append(e)
    return groups


def _order(keys) -> list[tuple]:
    return sorted(keys, key=lambda k: (k[0].value, k[1]))


def _bars(trace: Trace, t_cut: float | None, show_kinds, scale: float, *, names=None, keys=None,
          faded: bool = False):
    """One bar trace per (kind, label) group, clipped at t_cut (seconds after the trace's first
    event) for animation frames; `keys` fixes the groups so every frame has the same traces.

    Times are drawn from the trace's first event (a wall-clock trace starts long after the epoch).
    `faded` draws the second row group of an overlay: lighter, its legend entries merged.
    """
    names = _rank_names(trace) if names is None else names
    t_first = trace.start
    groups = _groups(trace, show_kinds)
    out = []
    for kind, label in (_order(groups) if keys is None else keys):
        evs = groups.get((kind, label), [])
        cut = None if t_cut is None else t_first + t_cut
        ends = [e.end if cut is None else min(e.end, max(cut, e.start)) for e in evs]
        color = LABEL_COLORS.get(label, KIND_COLORS[kind]) if kind == Kind.COMPUTE else KIND_COLORS[kind]
        out.append(go.Bar(
            name=label, orientation="h", y=[names[e.rank] for e in evs], legendgroup=label,
            showlegend=not faded,
            base=np.array([(e.start - t_first) * scale for e in evs]),  # arrays: plotly copies lists item by item
            x=np.array([(end - e.start) * scale for e, end in zip(evs, ends)]),
            marker=dict(color=color, line=dict(width=0.5, color="white")),
            opacity=(1.0 if kind == Kind.COMPUTE else 0.75) * (0.6 if faded else 1.0),
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


def _play_controls(fig: go.Figure, frames: list[str], labels: list[str], prefix: str, suffix: str,
                   duration: int) -> None:
    """A play button and a slider stepping through the named `frames`, its steps read `labels`."""
    fig.update_layout(
        updatemenus=[dict(type="buttons", showactive=False, x=0, y=0, xanchor="left", yanchor="top",
                          pad=dict(t=45), buttons=[
            dict(label="▶ play", method="animate",
                 args=[None, dict(frame=dict(duration=duration, redraw=True), fromcurrent=False,
                                  transition=dict(duration=0))]),
        ])],
        sliders=[dict(active=len(frames) - 1, x=0.12, len=0.88, y=0, yanchor="top", pad=dict(t=30),
                      currentvalue=dict(prefix=prefix, suffix=suffix), steps=[
            dict(label=label, method="animate",
                 args=[[name], dict(mode="immediate", frame=dict(duration=0, redraw=True))])
            for name, label in zip(frames, labels)])],
    )


def timeline_figure(trace: Trace, title: str = "Timeline", *, animate: bool = True, frames: int = 24,
                    kinds=(Kind.COMPUTE, Kind.RECV_WAIT), unit: str = "ms",
                    overlay: Trace | None = None, groups: tuple[str, str] = ("measured", "predicted")) -> go.Figure:
    """One row per rank; gaps are idle time (share in the row label); animated as time advances.

    With `overlay` (e.g. what `simulate` predicts for the run in `trace`), two row groups share
    the time axis: `trace`'s rows on top, the overlay's below, named by `groups` (chapter 12).
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    show_kinds = {Kind(k) for k in kinds}
    traces = [trace] if overlay is None else [trace, overlay]
    rows = [_rank_names(t, prefix="" if overlay is None else f"{g} · ") for t, g in zip(traces, groups)]

    def data(t_cut):
        return [bar for i, (t, r) in enumerate(zip(traces, rows))
                for bar in _bars(t, t_cut, show_kinds, scale, names=r, faded=i == 1)]

    fig = go.Figure(data(None))
    span = max(t.span for t in traces)
    bubble = " · ".join(f"{g + ' ' if overlay is not None else ''}{100 * t.bubble_fraction():.1f}%"
                        for t, g in zip(traces, groups))
    fig.update_layout(
        title=f"{title} · bubble {bubble} of {trace.world_size} × {trace.span * scale:.3g} {unit}",
        barmode="overlay", xaxis=dict(title=f"time ({unit})", range=[0, span * scale * 1.02]),
        yaxis=dict(categoryarray=[n for r in rows for n in r][::-1], categoryorder="array"),
        height=260 + 38 * sum(t.world_size for t in traces),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
        margin=dict(l=10, r=10, t=90, b=40), template="plotly_white",
    )
    if animate and trace.events:
        cuts = [span * (i + 1) / frames for i in range(frames)]
        fig.frames = [go.Frame(data=data(t), name=f"{i}") for i, t in enumerate(cuts)]
        _play_controls(fig, [f"{i}" for i in range(frames)], [f"{t * scale:.3g}" for t in cuts],
                       "t = ", f" {unit}", 120)
    return fig


def sweep_figure(traces: dict, title: str = "Timeline", *, param: str = "", unit: str = "ms",
                 kinds=(Kind.COMPUTE, Kind.RECV_WAIT)) -> go.Figure:
    """One timeline per setting (`{value label: Trace}`), switched by a slider and a play button.

    The static book cannot run a widget's Python callbacks: plotly's own frames replay the
    settings a widget would have drawn, one frame per value (chapter 12). Rows are fixed at the
    largest world_size and the time axis at the longest span, so the frames compare at a glance.
    """
    if not traces:
        raise ValueError("sweep_figure needs at least one trace; pass {label: Trace}")
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    show_kinds = {Kind(k) for k in kinds}
    keys = _order({k for t in traces.values() for k in _groups(t, show_kinds)})
    names = [f"rank {r}" for r in range(max(t.world_size for t in traces.values()))]
    labels = [str(k) for k in traces]

    def heading(label, t):
        return (f"{title} · {param} = {label} · bubble {100 * t.bubble_fraction():.1f}% · "
                f"step {t.span * scale:.3g} {unit}")

    frames = [go.Frame(data=_bars(t, None, show_kinds, scale, names=names, keys=keys), name=label,
                       layout=dict(title=dict(text=heading(label, t))))
              for label, t in zip(labels, traces.values())]
    fig = go.Figure(data=frames[-1].data, frames=frames)
    fig.update_layout(
        title=heading(labels[-1], list(traces.values())[-1]), barmode="overlay",
        xaxis=dict(title=f"time ({unit})", range=[0, 1.02 * scale * max(t.span for t in traces.values())]),
        yaxis=dict(categoryorder="array", categoryarray=names[::-1]), height=260 + 38 * len(names),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
        margin=dict(l=10, r=10, t=90, b=40), template="plotly_white",
    )
    _play_controls(fig, labels, labels, f"{param} = ", "", 800)
    return fig


def memory_figure(trace: Trace, title: str = "Memory over time", unit: str = "ms", *,
                  per: float = 2**20, yaxis_title: str = "allocated (MiB)") -> go.Figure:
    """Bytes allocated per rank after each event, as a step line per rank (in units of `per` bytes)."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    fig, t0 = go.Figure(), trace.start
    by_rank: dict[int, list] = {}
    for e in trace.events:
        if e.memory is not None:
            by_rank.setdefault(e.rank, []).append(e)
    for r in range(trace.world_size):
        evs = sorted(by_rank.get(r, []), key=lambda e: e.end)
        if not evs:
            continue
        xs = [0.0] + [(e.end - t0) * scale for e in evs]
        ys = [0.0] + [e.memory / per for e in evs]
        fig.add_trace(go.Scatter(x=np.array(xs), y=np.array(ys), mode="lines", line_shape="hv", name=f"rank {r}",
                                 line=dict(color=PALETTE[r % len(PALETTE)])))
    fig.update_layout(title=title, xaxis_title=f"time ({unit})", yaxis_title=yaxis_title,
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
