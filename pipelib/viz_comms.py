"""Figures for communication: ping-pong curves, size sweeps, collectives replayed step by step.

Every figure is drawn from measurements: `collective_animation` replays the SEND events a real
run recorded (labels ``"<name> <phase> step <s> chunk <c>"``, see `pipelib.collectives`) and
derives, step by step, whose contributions each rank holds in each chunk slot. Nothing is
drawn by hand. Never imports torch.distributed.

Introduced in chapters 05 and 06.
"""
from __future__ import annotations

import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .trace import Kind, Trace

_LABEL = re.compile(r"^(?P<name>\S+) (?P<phase>\S+) step (?P<step>\d+) chunk (?P<chunk>\d+)$")
REDUCING = {"reduce-scatter", "reduce"}
COPYING = {"all-gather", "broadcast"}


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
    """States after each step: state[rank][slot] = the set of ranks whose data it holds."""
    slots = n if name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all") else 1
    if name == "broadcast":
        state = [[frozenset({root}) if r == root else frozenset()] for r in range(n)]
    elif name == "all_gather":
        state = [[frozenset({r}) if s == r else frozenset() for s in range(slots)] for r in range(n)]
    else:
        state = [[frozenset({r}) for _ in range(slots)] for r in range(n)]
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


def _cells(state, n):
    z = [[len(s) / n for s in row] for row in state]
    text = [["+".join(map(str, sorted(s))) if s else "·" for s in row] for row in state]
    return z, text


def collective_animation(trace: Trace, name: str, n: int | None = None, *, root: int = 0,
                         title: str | None = None) -> go.Figure:
    """Rows are ranks, columns chunk slots; each cell names the ranks whose data it holds
    (colour: share of all ranks). One frame per step, with that step's messages in the title."""
    n = n or trace.world_size
    rows = message_steps(trace, name)
    if not rows:
        raise ValueError(f"no messages of collective {name!r} in this trace; run it after cluster.reset()")
    states = replay(rows, name, n, root)
    steps = sorted({r["step"] for r in rows})
    ylab = [f"rank {r}" for r in range(n)]
    xlab = [f"chunk {c}" for c in range(len(states[0][0]))]

    def heat(state):
        z, text = _cells(state, n)
        return go.Heatmap(z=z, x=xlab, y=ylab, text=text, texttemplate="%{text}", zmin=0, zmax=1,
                          colorscale="Blues", showscale=False, hoverinfo="skip", xgap=3, ygap=3)

    def caption(i):
        if i == 0:
            return "before the first step"
        s = steps[i - 1]
        ms = [r for r in rows if r["step"] == s]
        moves = ", ".join(f"{m['src']}→{m['dst']} c{m['chunk']}" for m in ms[:8]) + (" …" if len(ms) > 8 else "")
        return f"step {s} ({ms[0]['phase']}): {moves}"

    head = title or f"{name} on {n} ranks"
    frames = [go.Frame(data=[heat(st)], name=str(i), layout=go.Layout(title_text=f"{head}<br><sub>{caption(i)}</sub>"))
              for i, st in enumerate(states)]
    fig = go.Figure(data=[heat(states[-1])], frames=frames)
    fig.update_layout(
        title=f"{head}<br><sub>after the last step (press play to replay)</sub>", height=120 + 45 * n,
        yaxis=dict(autorange="reversed"), margin=dict(l=60, r=20, t=80, b=40),
        updatemenus=[dict(type="buttons", showactive=False, x=0, y=-0.15, xanchor="left", buttons=[
            dict(label="▶ play", method="animate",
                 args=[None, dict(frame=dict(duration=900, redraw=True), fromcurrent=False)])])],
        sliders=[dict(steps=[dict(method="animate", label=str(i), args=[[str(i)], dict(mode="immediate",
                      frame=dict(duration=0, redraw=True))]) for i in range(len(states))],
                      x=0.15, len=0.85, y=-0.1, currentvalue=dict(prefix="after step: "))],
    )
    return fig


def pingpong_figure(rows: list[dict], alpha: float, beta: float, title: str = "Ping-pong") -> go.Figure:
    """One-way time and bandwidth vs message size (log-log), with the fitted alpha-beta line."""
    x = [r["bytes"] for r in rows]
    fit = [alpha + b / beta for b in x]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("one-way time", "bandwidth"))
    fig.add_trace(go.Scatter(x=x, y=[r["time"] * 1e6 for r in rows], mode="markers", name="measured"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[t * 1e6 for t in fit], mode="lines",
                             name=f"α={alpha * 1e6:.1f} µs, β={beta / 1e9:.2f} GB/s"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[r["bandwidth"] / 1e9 for r in rows], mode="markers", name="measured GB/s",
                             showlegend=False, marker=dict(color="#636EFA")), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=[b / t / 1e9 for b, t in zip(x, fit)], mode="lines", showlegend=False,
                             line=dict(color="#EF553B")), 1, 2)
    fig.update_xaxes(type="log", title_text="message size (bytes)")
    fig.update_yaxes(type="log", title_text="µs", row=1, col=1)
    fig.update_yaxes(type="log", title_text="GB/s", row=1, col=2)
    fig.update_layout(title=title, height=380)
    return fig


def sweep_figure(measured: dict, predicted: dict | None = None, title: str = "Time vs size",
                 unit: str = "ms") -> go.Figure:
    """Lines of time vs bytes: measured {name: (sizes, seconds)} as markers, predicted as lines."""
    scale = {"s": 1, "ms": 1e3, "us": 1e6}[unit]
    fig = go.Figure()
    for name, (x, y) in measured.items():
        fig.add_trace(go.Scatter(x=x, y=[v * scale for v in y], mode="markers+lines", name=name))
    for name, (x, y) in (predicted or {}).items():
        fig.add_trace(go.Scatter(x=x, y=[v * scale for v in y], mode="lines", name=name, line=dict(dash="dash")))
    fig.update_xaxes(type="log", title_text="tensor size (bytes)")
    fig.update_yaxes(type="log", title_text=unit)
    fig.update_layout(title=title, height=400)
    return fig
