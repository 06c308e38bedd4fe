"""Figures drawn from events: timelines, memory over time, scaling curves.

Every figure here takes a `Trace` (measured on the cluster or produced by `simulate`), never
numbers typed by hand. Figures are deterministic for the same events, so a re-run gives the
same output. Animations use plotly's own frames, so they play in the static book too: time
advancing (`timeline_figure`) or a parameter changing (`sweep_figure`, the static stand-in for
the schedule explorer's sliders, `pipelib.pipeline.explorer`). `timeline_figure(overlay=...)` draws
measured above predicted on one time axis.

Readable at any density: a bar names its microbatch only where the number fits (plotly's
`uniformtext` hides the rest), and hovering any bar tells rank, op, stage, microbatch, start,
end and duration. Time axes pick µs, ms or s from the span (`pipelib.viz.display.time_unit`);
a schedule simulated in unit costs says so (`unit="units of F"`: "time (units of F)", "step 33.0 F").
A figure first shows its final state; "play" replays it. Show them with `pipelib.viz.display.show`.
This module never imports torch.distributed.

Introduced in chapter 04.
"""
from __future__ import annotations

from types import MappingProxyType

import numpy as np
import plotly.graph_objects as go

from pipelib.trace import Kind, Trace
from pipelib.viz.display import (
    Units,
    nice_cuts,
    plain_number,
    play_controls,
    rounder,
    short_number,
    time_title,
    time_unit,
)

KIND_COLORS = MappingProxyType({
    Kind.COMPUTE: "#4C78A8",
    Kind.SEND: "#F58518",
    Kind.RECV_WAIT: "#E45756",
    Kind.TRANSFER: "#72B7B2",
    Kind.COLLECTIVE: "#B279A2",
})
LABEL_COLORS = MappingProxyType({"F": "#4C78A8", "B": "#54A24B", "I": "#88C95F", "W": "#9D755D",
                "forward": "#4C78A8", "backward": "#54A24B",
                "serial": "#E45756", "parallel": "#4C78A8", "optimizer": "#EECA3B"})
# other compute labels (a model's parts, a strategy's phases): colours no op or kind above uses
OTHER_COLORS = ("#FF9DA6", "#8CD17D", "#D67195", "#B6992D", "#499894", "#BAB0AC", "#79706E", "#D37295")
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6")
OP_NAMES = MappingProxyType({"F": "forward", "B": "backward", "I": "backward, input gradient",
            "W": "backward, weight gradient", Kind.RECV_WAIT.value: "idle, waiting for a message"})
TEXT = MappingProxyType(dict(textposition="inside", insidetextanchor="middle", textangle=0, constraintext="inside",
            textfont=dict(size=10, color="white")))
LAYOUT = MappingProxyType(dict(barmode="overlay", uniformtext=dict(minsize=8, mode="hide"), template="plotly_white",
              legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
              margin=dict(l=10, r=10, t=115, b=40), hoverlabel=dict(align="left")))


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
    """Compute first (F, B, I, W, then other labels), then waits and messages: the legend's order."""
    ops = list(OP_NAMES)
    return sorted(keys, key=lambda k: (k[0] != Kind.COMPUTE, k[0].value, ops.index(k[1]) if k[1] in ops else 9, k[1]))


def _hover(kind: Kind, label: str, evs: list, t0: float, scale: float, unit: str, rnd) -> tuple[list, str, str | None]:
    """Per-bar customdata, the hovertemplate reading it, and the text drawn inside the bars.

    Columns: start, end, duration (in `unit`), then stage and microbatch if any event has them,
    then the event's label, peer and bytes for messages and waits. `%{y}` is the row: the rank.
    """
    cols = [("stage", lambda e: e.stage), ("microbatch", lambda e: e.microbatch)]
    if kind != Kind.COMPUTE:
        cols += [("label", lambda e: e.label), ("peer", lambda e: e.peer), ("bytes", lambda e: e.bytes or None)]
    cols = [(name, get) for name, get in cols if any(get(e) is not None for e in evs)]
    data = [[rnd((e.start - t0) * scale), rnd((e.end - t0) * scale), rnd(e.duration * scale)]
            + [("–" if get(e) is None else get(e)) for _, get in cols] for e in evs]
    what = OP_NAMES.get(label, kind.value)
    lines = [f"<b>{label}</b> ({what}) · %{{y}}"]
    lines += [" · ".join(f"{name} %{{customdata[{3 + i}]}}" for i, (name, _) in enumerate(cols))] if cols else []
    lines += [f"%{{customdata[0]}} – %{{customdata[1]}} {unit}, lasts %{{customdata[2]}} {unit}"]
    names = [name for name, _ in cols]
    text = (f"%{{customdata[{3 + names.index('microbatch')}]}}" if "microbatch" in names else label
            ) if kind == Kind.COMPUTE else None
    return data, "<br>".join(lines) + "<extra></extra>", text


def _color(kind: Kind, label: str, keys) -> str:
    """A compute op's colour: the schedule letters' own (F, B, I, W; "forward" as F, "backward"
    as B), other compute labels from the palette in legend order, so two labels never share a
    swatch; messages and waits by kind."""
    if kind != Kind.COMPUTE:
        return KIND_COLORS[kind]
    if label in LABEL_COLORS:
        return LABEL_COLORS[label]
    others = [k[1] for k in keys if k[0] == Kind.COMPUTE and k[1] not in LABEL_COLORS]
    return OTHER_COLORS[others.index(label) % len(OTHER_COLORS)] if label in others else KIND_COLORS[kind]


def _bars(trace: Trace, show_kinds, unit: str, scale: float, rnd, *, names=None, keys=None,
          faded: bool = False) -> list[go.Bar]:
    """One bar trace per (kind, label) group; `keys` fixes the groups so every frame of a
    sweep has the same traces. Times are drawn from the trace's first event (a wall-clock trace
    starts long after the epoch). `faded` draws the second row group of an overlay: lighter, its
    legend entries merged with the first's."""
    names = _rank_names(trace) if names is None else names
    t0, groups = trace.start, _groups(trace, show_kinds)
    out = []
    for kind, label in (_order(groups) if keys is None else keys):
        evs = groups.get((kind, label), [])
        custom, hover, text = _hover(kind, label, evs, t0, scale, unit, rnd)
        color = _color(kind, label, keys or _order(groups))
        # `base` as an array: plotly's encoder (figure_bundle) writes it as numbers, a generic one does not
        out.append(go.Bar(
            name=label, orientation="h", y=[names[e.rank] for e in evs], legendgroup=label,
            showlegend=not faded, base=np.array([c[0] for c in custom], dtype=float), x=[c[2] for c in custom],
            customdata=custom, hovertemplate=hover, marker=dict(color=color, line=dict(width=0.5, color="white")),
            # messages are not faded further: a faded collective over a faded compute bar reads grey
            opacity=0.75 if kind != Kind.COMPUTE else (0.6 if faded else 1.0),
            width=0.8 if kind == Kind.COMPUTE else 0.35,
            **({"texttemplate": text, **TEXT} if text is not None else {"textposition": "none"}),
        ))
    return out


def _widths(trace: Trace, show_kinds, t_cut: float, scale: float, rnd, keys) -> list[go.Bar]:
    """An animation frame: only the bars' widths change, clipped at t_cut seconds from the start."""
    groups, cut = _groups(trace, show_kinds), trace.start + t_cut
    return [go.Bar(x=[rnd((min(e.end, max(cut, e.start)) - e.start) * scale) for e in groups.get(k, [])])
            for k in keys]


def _bubble(traces, groups, overlay) -> str:
    return " · ".join(f"{g + ' ' if overlay else ''}{100 * t.bubble_fraction():.1f}%" for t, g in zip(traces, groups))


def timeline_figure(trace: Trace, title: str = "Timeline", *, animate: bool = True, frames: int = 24,
                    kinds=(Kind.COMPUTE, Kind.RECV_WAIT), unit: str | Units | None = None,
                    overlay: Trace | None = None, groups: tuple[str, str] = ("measured", "predicted"),
                    idle_name: str = "bubble") -> go.Figure:
    """One row per rank; gaps are idle time (share in the row label); animated as time advances.

    The subtitle names the ranks' idle share `idle_name`: a pipeline's "bubble" (chapters
    10-13), or e.g. "compute idle" for a data-parallel step waiting on its collectives (08).

    With `overlay` (e.g. what `simulate` predicts for the run in `trace`), two row groups share
    the time axis: `trace`'s rows on top, the overlay's below, named by `groups` (chapter 12).
    The time unit is chosen from the span unless `unit` ("s", "ms", "us"; "units of F" for unit
    costs) is given. The figure shows the whole step; "play" replays it in at most `frames`
    frames, at round times (`nice_cuts`) so the slider's labels stay readable.
    """
    show_kinds = {Kind(k) for k in kinds}
    traces = [trace] if overlay is None else [trace, overlay]
    span = max(t.span for t in traces)
    unit, scale = time_unit(span, unit)
    rnd = rounder(span * scale)
    rows = [_rank_names(t, prefix="" if overlay is None else f"{g} · ") for t, g in zip(traces, groups)]
    keys = [_order(_groups(t, show_kinds)) for t in traces]
    fig = go.Figure([bar for i, (t, r, k) in enumerate(zip(traces, rows, keys))
                     for bar in _bars(t, show_kinds, unit, scale, rnd, names=r, keys=k, faded=i == 1)])
    idle_bars = "".join(f" and {name} bars"
                        for kind, name in ((Kind.RECV_WAIT, "recv-wait"), (Kind.COLLECTIVE, "collective"))
                        if kind in show_kinds)
    steps = " · ".join(f"{g + ' ' if overlay is not None else ''}{short_number(t.span * scale)} {unit}"
                       for t, g in zip(traces, groups))
    fig.update_layout(
        # two subtitle lines, so that neither runs into the legend at the top right
        title=dict(text=f"{title}<br><sub>{idle_name} {_bubble(traces, groups, overlay is not None)} of "
                        f"{trace.world_size} ranks × step {steps}</sub><br><sub>idle: gaps{idle_bars}</sub>"),
        xaxis=dict(title=time_title(unit), range=[0, span * scale * 1.02]),
        yaxis=dict(categoryarray=[n for r in rows for n in r][::-1], categoryorder="array"),
        height=260 + 38 * sum(t.world_size for t in traces), **LAYOUT,
    )
    rows = -(-sum(1 for d in fig.data if d.showlegend is not False) // 6)  # legend rows, about 6 entries each
    if rows > 1:  # a long legend wraps upwards: the title at the very top, the legend's rows under it
        top = 80 + 30 * rows
        fig.update_layout(title=dict(yref="container", y=1, yanchor="top", pad=dict(t=28)), margin=dict(t=top),
                          height=fig.layout.height + top - LAYOUT["margin"]["t"])
    if animate and trace.events:
        cuts = nice_cuts(span * scale, frames)  # in axis units
        fig.frames = [go.Frame(data=[b for t, k in zip(traces, keys)
                                     for b in _widths(t, show_kinds, c / scale, scale, rnd, k)],
                               traces=list(range(len(fig.data))), name=f"{i}") for i, c in enumerate(cuts)]
        play_controls(fig, [f"{i}" for i in range(len(cuts))], [plain_number(c) for c in cuts], "t = ", f" {unit}")
    return fig


def sweep_figure(traces: dict, title: str = "Timeline", *, param: str = "", unit: str | Units | None = None,
                 kinds=(Kind.COMPUTE, Kind.RECV_WAIT)) -> go.Figure:
    """One timeline per setting (`{value label: Trace}`), switched by a slider and a play button.

    The static book cannot run a widget's Python callbacks: plotly's own frames replay the
    settings a widget would have drawn, one frame per value (chapter 12). Rows are fixed at the
    largest world_size and the time axis at the longest span, so the frames compare at a glance.
    Each frame's title names its value, bubble and step; the figure shows the last value.
    """
    if not traces:
        raise ValueError("sweep_figure needs at least one trace; pass {label: Trace}")
    show_kinds = {Kind(k) for k in kinds}
    span = max(t.span for t in traces.values())
    unit, scale = time_unit(span, unit)
    rnd = rounder(span * scale)
    keys = _order({k for t in traces.values() for k in _groups(t, show_kinds)})
    names = [f"rank {r}" for r in range(max(t.world_size for t in traces.values()))]
    labels = [str(k) for k in traces]

    def heading(label, t):
        return (f"{title}<br><sub>{param + ' = ' if param else ''}{label}: bubble {100 * t.bubble_fraction():.1f}% · "
                f"step {short_number(t.span * scale)} {unit}</sub>")

    frames = [go.Frame(data=_bars(t, show_kinds, unit, scale, rnd, names=names, keys=keys), name=label,
                       layout=dict(title=dict(text=heading(label, t))))
              for label, t in zip(labels, traces.values())]
    fig = go.Figure(data=frames[-1].data, frames=frames)
    fig.update_layout(
        title=dict(text=heading(labels[-1], list(traces.values())[-1])),
        xaxis=dict(title=time_title(unit), range=[0, 1.02 * scale * span]),
        yaxis=dict(categoryorder="array", categoryarray=names[::-1]), height=260 + 38 * len(names), **LAYOUT,
    )
    play_controls(fig, labels, labels, f"{param} = " if param else "", "")
    return fig


def memory_figure(trace: Trace, title: str = "Memory over time", unit: str | Units | None = None, *,
                  per: float = 2**20, yaxis_title: str = "allocated (MiB)") -> go.Figure:
    """Bytes allocated per rank after each event, as a step line per rank (in units of `per` bytes)."""
    unit, scale = time_unit(trace.span, unit)
    rnd, t0, fig = rounder(trace.span * scale), trace.start, go.Figure()
    by_rank: dict[int, list] = {}
    for e in trace.events:
        if e.memory is not None:
            by_rank.setdefault(e.rank, []).append(e)
    for r in range(trace.world_size):
        evs = sorted(by_rank.get(r, []), key=lambda e: e.end)
        if not evs:
            continue
        fig.add_trace(go.Scatter(
            x=[0] + [rnd((e.end - t0) * scale) for e in evs], y=[0] + [float(f"{e.memory / per:.6g}") for e in evs],
            mode="lines", line_shape="hv", name=f"rank {r}", line=dict(color=PALETTE[r % len(PALETTE)]),
            hovertemplate=f"rank {r} · %{{x}} {unit}: %{{y}} {yaxis_title}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=time_title(unit), yaxis_title=yaxis_title,
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
    fig.update_layout(title=title, xaxis_title="workers N", yaxis_title="speedup",
                      template="plotly_white", height=380, margin=dict(l=10, r=10, t=50, b=10))
    return fig
