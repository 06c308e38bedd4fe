"""Figures for communication: ping-pong curves, size sweeps, collectives replayed step by step.

Every figure is drawn from measurements: `collective_animation` replays the SEND events a real
run recorded (labels ``"<name> <phase> step <s> chunk <c>"``, see `pipelib.comm.collectives`) and
derives, step by step, whose contributions each rank holds in each chunk slot (`replay`) and
which chunk each message moved where (`step_moves`, drawn as arrows). `size_sweep_figure` and
`size_sweep_bandwidth_figure` draw measured times (and bandwidth) against the alpha-beta model
(`pipelib.comm.alphabeta`) as the tensor size grows.
Nothing is drawn by hand. Never imports torch.distributed.

Introduced in chapters 05 and 06.
"""
from __future__ import annotations

import math
import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipelib.comm.registry import REGISTRY
from pipelib.trace import Kind, Trace
from pipelib.viz.display import play_controls, time_unit

_LABEL = re.compile(r"^(?P<name>\S+) (?P<phase>\S+) step (?P<step>\d+) chunk (?P<chunk>\d+)$")
REDUCING = frozenset({"reduce-scatter", "reduce"})
COPYING = frozenset({"all-gather", "broadcast"})


def parse_label(label: str) -> dict | None:
    m = _LABEL.match(label)
    if not m:
        return None
    return {"name": m["name"], "phase": m["phase"], "step": int(m["step"]), "chunk": int(m["chunk"])}


def message_steps(trace: Trace, name: str | None = None) -> list[dict]:
    """One row per message of the collectives in `trace`: step, phase, src, dst, chunk, bytes.
    Ranks are those of the trace (global ranks)."""
    rows = []
    for e in trace.events:
        if e.kind != Kind.SEND:
            continue
        p = parse_label(e.label)
        if p is None or (name is not None and p["name"] != name):
            continue
        rows.append({**p, "src": e.rank, "dst": e.peer, "bytes": e.bytes})
    return sorted(rows, key=lambda r: (r["step"], r["src"]))


def replay(rows: list[dict], name: str, n: int, root: int = 0) -> list[list[list[frozenset]]]:
    """States after each step: state[rank][slot] = the set of ranks whose data it holds. The grid
    and where it starts are the collective's registry entry's (`CollectiveInfo.slots`, `start`);
    a pattern that is not a collective (chapter 17's ring attention) is one whole tensor per
    rank, starting from the rank's own data."""
    info = REGISTRY.get(name)
    slots = n if info is not None and info.slots == "chunks" else 1
    start = {"own": lambda r, s: {r}, "diagonal": lambda r, s: {r} if s == r else set(),
             "root": lambda r, s: {root} if r == root else set()}[info.start if info else "own"]
    state = [[frozenset(start(r, s)) for s in range(slots)] for r in range(n)]
    states = [state]
    for step in sorted({r["step"] for r in rows}):
        before, new = states[-1], [list(row) for row in states[-1]]
        for m in (r for r in rows if r["step"] == step):
            src, dst, c, phase = m["src"], m["dst"], m["chunk"], m["phase"]
            if phase == "forward":          # naive ring: the origin's whole tensor is added
                new[dst][0] = new[dst][0] | {c}
            elif phase == "all-to-all":     # src's block for dst (its input chunk c = dst) lands in slot src
                new[dst][src] = frozenset({src})
            elif phase in REDUCING:
                slot = 0 if slots == 1 else c
                new[dst][slot] = new[dst][slot] | before[src][slot]
            else:                           # COPYING
                slot = 0 if slots == 1 else c
                new[dst][slot] = before[src][slot]
        states.append(new)
    return states


def step_moves(rows: list[dict], name: str, n: int) -> dict[int, list[dict]]:
    """For each step, where each chunk comes from and lands on the replay grid:
    {step: [{src, src_slot, dst, dst_slot, chunk, phase, bytes, messages}]}. Slots are the
    columns of `replay`'s state: one slot for the whole tensor (broadcast, reduce, naive
    all-reduce), else chunk c sits in slot c, except all-to-all, where rank src's input chunk
    dst (its slot dst) lands in slot src of rank dst (the transpose). A chunk sent as several
    segment messages (real devices pipeline them, `pipelib.comm.collectives`) is one move, with the
    bytes of all its segments."""
    slots = len(replay([], name, n)[0][0])
    merged: dict[tuple, dict] = {}
    for m in rows:
        if m["phase"] == "all-to-all":
            s_slot, d_slot = m["dst"], m["src"]
        else:
            s_slot = d_slot = 0 if slots == 1 else m["chunk"]
        key = (m["step"], m["src"], m["dst"], m["chunk"], m["phase"])
        if key in merged:
            merged[key]["bytes"] += m["bytes"]
            merged[key]["messages"] += 1
        else:
            merged[key] = {"src": m["src"], "src_slot": s_slot, "dst": m["dst"], "dst_slot": d_slot,
                           "chunk": m["chunk"], "phase": m["phase"], "bytes": m["bytes"], "messages": 1}
    out: dict[int, list[dict]] = {}
    for key, move in merged.items():
        out.setdefault(key[0], []).append(move)
    return {k: out[k] for k in sorted(out)}


def _cells(state, n):
    z = [[len(s) / n for s in row] for row in state]
    text = [["+".join(map(str, sorted(s))) if s else "·" for s in row] for row in state]
    return z, text


def _fmt_size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes:g} {unit}" if unit == "B" else f"{nbytes:.3g} {unit}"
        nbytes /= 1024


def _arrows(moves: list[dict], gap: float = 0.22) -> go.Scatter:
    """The messages of one step as one scatter trace of arrows, each from the sending cell to the
    receiving one, shortened by `gap` at both ends so the cell text stays readable. Arrows that
    share a column are spread sideways so that none hides another. (A trace, not layout
    annotations: plotly.js animates traces reliably from frame to frame.)"""
    by_col: dict[int, list[dict]] = {}
    for m in moves:
        if m["src_slot"] == m["dst_slot"]:
            by_col.setdefault(m["src_slot"], []).append(m)
    shift = {}
    for col in by_col.values():
        for i, m in enumerate(sorted(col, key=lambda m: m["src"])):
            shift[id(m)] = (i - (len(col) - 1) / 2) * (0.6 / max(len(col), 2))
    xs, ys, sizes = [], [], []
    for m in moves:
        dx = shift.get(id(m), 0.0)
        x0, y0, x1, y1 = m["src_slot"] + dx, m["src"], m["dst_slot"] + dx, m["dst"]
        length = math.hypot(x1 - x0, y1 - y0) or 1.0
        ux, uy = (x1 - x0) / length, (y1 - y0) / length
        xs += [x0 + gap * ux, x1 - gap * ux, None]
        ys += [y0 + gap * uy, y1 - gap * uy, None]
        sizes += [0, 13, 0]
    return go.Scatter(x=xs, y=ys, mode="lines+markers", hoverinfo="skip", showlegend=False,
                      line=dict(color="#EF553B", width=2),
                      marker=dict(symbol="arrow", angleref="previous", size=sizes, color="#EF553B"))


def collective_animation(trace: Trace, name: str, n: int | None = None, *, root: int = 0,
                         title: str | None = None, arrows: bool = True,
                         columns: list[str] | None = None) -> go.Figure:
    """Rows are ranks, columns chunk slots; each cell names the ranks whose data it holds
    (colour: share of all ranks). One frame per step, with that step's messages drawn as arrows
    from the sending cell to the receiving one (`step_moves`) and listed in the title. The
    static view (the book's page before play) shows the last step. `columns` names the slots
    when "chunk c" / "whole tensor" does not say what they are (chapter 17: K/V blocks held)."""
    n = n or trace.world_size
    rows = message_steps(trace, name)
    if not rows:
        raise ValueError(f"no messages of collective {name!r} in this trace; run it after cluster.reset()")
    states = replay(rows, name, n, root)
    moves = step_moves(rows, name, n)
    steps = list(moves)
    slots = len(states[0][0])
    ylab = [f"rank {r}" for r in range(n)]
    xlab = [f"chunk {c}" for c in range(slots)] if slots > 1 else ["whole tensor"]
    if columns is not None:
        if len(columns) != slots:
            raise ValueError(f"columns={columns!r} names {len(columns)} slots; {name!r} has {slots}")
        xlab = list(columns)

    def heat(state):
        z, text = _cells(state, n)
        return go.Heatmap(z=z, x=list(range(slots)), y=list(range(n)), text=text,
                          texttemplate="%{text}", zmin=0, zmax=1, colorscale="Blues",
                          showscale=False, hoverinfo="skip", xgap=3, ygap=3)

    def caption(i):
        if i == 0:
            return "before the first step"
        ms = moves[steps[i - 1]]
        text = ", ".join(f"{m['src']}→{m['dst']} c{m['chunk']}" for m in ms[:8]) + (" …" if len(ms) > 8 else "")
        sizes = sorted({m["bytes"] for m in ms})
        each = _fmt_size(sizes[0]) if len(sizes) == 1 else f"{_fmt_size(sizes[0])}–{_fmt_size(sizes[-1])}"
        return f"step {steps[i - 1]} ({ms[0]['phase']}): {text} · {each} each"

    def data(i):
        shown = moves[steps[i - 1]] if (arrows and i > 0) else []
        return [heat(states[i]), _arrows(shown)]

    head = title or f"{name} on {n} ranks"
    frames = [go.Frame(data=data(i), name=str(i), layout=go.Layout(title_text=f"{head}<br><sub>{caption(i)}</sub>"))
              for i in range(len(states))]
    last = len(states) - 1
    fig = go.Figure(data=data(last), frames=frames)
    fig.update_layout(
        title=f"{head}<br><sub>{caption(last)} (the last step; press play to replay)</sub>",
        height=140 + 55 * n,
        xaxis=dict(tickvals=list(range(slots)), ticktext=xlab, range=[-0.5, slots - 0.5]),
        yaxis=dict(tickvals=list(range(n)), ticktext=ylab, autorange="reversed"),
        margin=dict(l=60, r=20, t=80, b=40),
    )
    play_controls(fig, [str(i) for i in range(len(states))],
                  ["start" if i == 0 else f"step {steps[i - 1]}" for i in range(len(states))], show_value=False)
    return fig


def pingpong_figure(rows: list[dict], alpha: float, beta: float, title: str = "Ping-pong") -> go.Figure:
    """One-way time and bandwidth vs message size (log-log), with the fitted alpha-beta line."""
    x = [r["bytes"] for r in rows]
    fit = [alpha + b / beta for b in x]
    unit, scale = time_unit(max([r["time"] for r in rows] + fit, default=0.0))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("one-way time", "bandwidth"))
    fig.add_trace(go.Scatter(x=x, y=[r["time"] * scale for r in rows], mode="markers", name="measured"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[t * scale for t in fit], mode="lines",
                             name=f"α={alpha * 1e6:.1f} µs, β={beta / 1e9:.2f} GB/s"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[r["bandwidth"] / 1e9 for r in rows], mode="markers", name="measured GB/s",
                             showlegend=False, marker=dict(color="#636EFA")), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=[b / t / 1e9 for b, t in zip(x, fit)], mode="lines", showlegend=False,
                             line=dict(color="#EF553B")), 1, 2)
    fig.update_xaxes(type="log", title_text="message size (bytes)")
    fig.update_yaxes(type="log", title_text=unit, row=1, col=1)
    fig.update_yaxes(type="log", title_text="GB/s", row=1, col=2)
    fig.update_layout(title=title, height=380)
    return fig


def _vlines(fig, vlines, axes=(("x", "y"),)):
    """Dotted vertical lines at x bytes on log-x axes, labelled on the first. plotly.js places a
    shape on a log axis in data units but an annotation in log10 units, hence the two."""
    for label, x in (vlines or {}).items():
        for i, (xa, ya) in enumerate(axes):
            fig.add_shape(type="line", x0=x, x1=x, xref=xa, y0=0, y1=1, yref=f"{ya} domain",
                          line=dict(dash="dot", color="grey"))
            if i == 0:
                fig.add_annotation(x=math.log10(x), xref=xa, y=1, yref=f"{ya} domain", text=label,
                                   showarrow=False, xanchor="right", yanchor="top")


def _largest(*series: dict | None) -> float:
    return max((v for s in series for _, ys in (s or {}).values() for v in ys if v is not None), default=0.0)


def size_sweep_figure(measured: dict, predicted: dict | None = None, title: str = "Time vs size",
                      unit: str | None = None, *, vlines: dict | None = None) -> go.Figure:
    """Lines of time vs bytes: measured {name: (sizes, seconds)} as markers, predicted as lines
    (dashed), and optional labelled vertical lines {label: bytes} (a predicted crossover).
    The time unit is chosen from the largest time unless `unit` ("s", "ms", "us") is given."""
    unit, scale = time_unit(_largest(measured, predicted), unit)
    fig = go.Figure()
    for name, (x, y) in measured.items():
        fig.add_trace(go.Scatter(x=x, y=[v * scale for v in y], mode="markers+lines", name=name))
    for name, (x, y) in (predicted or {}).items():
        fig.add_trace(go.Scatter(x=x, y=[v * scale for v in y], mode="lines", name=name, line=dict(dash="dash")))
    fig.update_xaxes(type="log", title_text="tensor size (bytes)")
    fig.update_yaxes(type="log", title_text=unit)
    fig.update_layout(title=title, height=400)
    _vlines(fig, vlines)
    return fig


def size_sweep_bandwidth_figure(measured: dict, predicted: dict | None = None,
                                title: str = "Time and bandwidth vs size", unit: str | None = None, *,
                                vlines: dict | None = None) -> go.Figure:
    """Time (left) and algorithm bandwidth, tensor bytes / time (right), vs tensor size, log-log.
    measured {name: (sizes, seconds)} as markers, predicted as dashed lines; one colour per name
    in both panels; the time unit as in `size_sweep_figure`."""
    unit, scale = time_unit(_largest(measured, predicted), unit)
    palette = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time", "algorithm bandwidth = bytes / time"))
    series = [(k, v, False) for k, v in measured.items()] + [(k, v, True) for k, v in (predicted or {}).items()]
    for i, (name, (x, y), dashed) in enumerate(series):
        style = dict(color=palette[i % len(palette)], dash="dash" if dashed else None)
        mode = "lines" if dashed else "markers+lines"
        fig.add_trace(go.Scatter(x=x, y=[v * scale for v in y], mode=mode, name=name, line=style,
                                 legendgroup=name), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=[b / t / 1e9 if t > 0 else None for b, t in zip(x, y)], mode=mode,
                                 name=name, line=style, legendgroup=name, showlegend=False), 1, 2)
    fig.update_xaxes(type="log", title_text="tensor size (bytes)")
    fig.update_yaxes(type="log", title_text=unit, row=1, col=1)
    fig.update_yaxes(type="log", title_text="GB/s", row=1, col=2)
    fig.update_layout(title=title, height=420)
    _vlines(fig, vlines, axes=(("x", "y"), ("x2", "y2")))
    return fig
