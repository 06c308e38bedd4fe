"""Figures of chapter 15: ranks laid on the (dp, tp, pp, cp, ep) grid, and every axis on a timeline.

- `mesh_rows(topology)`: every rank's coordinates and its group along every axis, the data the
  grid's hover reads (and a test checks against `Topology`);
- `mesh_figure(topology, gpus_per_node)`: one marker per rank, laid out as the ranks sit on the
  nodes (consecutive ranks share a node, one row per node); hovering a rank shows its
  coordinates and the ranks of each of its groups; a menu colours the ranks by node or by the
  groups of one axis and joins each group's ranks with a line, so the reader sees which groups
  stay inside a node and which cross between nodes. The order of the axes is the topology's
  (`Topology(order=...)`), or `order=` here;
- `axis_timeline_figure(trace)`: each rank's compute, and its communication coloured by the
  mesh axis that carried it (`Event.axis`): each collective as one bar, and the point-to-point
  transfers outside any collective (a pipeline's activations) as thinner ones;
- `orders_figure(rows)`: seconds of communication per axis under several axis orders, two
  quantities side by side (`pipelib.planner.orders`);
- `rank_memory_figure(measured, predicted)`: bytes per rank measured on the simulated devices,
  beside the planner's itemised prediction of each rank;
- `plans_figure(candidates)`: the planner's best plans, each one's step time itemised;
  `plans_explorer_figure({scenario: candidates})` the same for several models and machines, a
  menu choosing the scenario (the static book's control over the planner's space).

The pure layer: plotly, `pipelib.topology` and `pipelib.trace`. Introduced in chapter 15.
"""
from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import plotly.graph_objects as go

from pipelib.topology import Topology
from pipelib.trace import Kind, Trace
from pipelib.viz.display import rounder, time_title, time_unit

AXIS_COLORS = MappingProxyType({"tp": "#E45756", "cp": "#B279A2", "dp": "#4C78A8", "pp": "#54A24B",
                                "ep": "#F58518"})
GROUP_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6",
                "#9D755D", "#BAB0AC", "#79706E", "#D37295", "#8CD17D", "#B6992D", "#499894", "#86BCB6")
COMPUTE_COLOR = "#C9CED6"
# the title at the figure's top, the legend's rows growing up from the plot's top: a legend that wraps
# to two or three rows stays under the title instead of running into it
_LOOK = MappingProxyType(dict(template="plotly_white", margin=dict(l=10, r=10, t=100, b=40),
                              title_y=1, title_yref="container", title_yanchor="top", title_pad_t=14,
                              legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom")))


def _axes(topo: Topology) -> list[str]:
    """The axes drawn: those with more than one rank, outermost first (ep after dp)."""
    return list(topo.used)


def mesh_rows(topology: Topology) -> list[dict]:
    """One dict per rank: {"rank", "coords": {axis: index}, "groups": {axis: ranks}} over the
    used axes, outermost first."""
    axes = _axes(topology)
    return [{"rank": r, "coords": {a: getattr(topology.coords(r), a) for a in axes},
             "groups": {a: topology.group_of(a, r) for a in axes}} for r in range(topology.world_size)]


def _columns(topo: Topology, gpus_per_node: int | None) -> int:
    if gpus_per_node:
        return gpus_per_node
    cols = 1
    for a in reversed(topo.order):  # the innermost axes, while they fit in a row of 8
        if cols * getattr(topo, a) > 8:
            break
        cols *= getattr(topo, a)
    return max(cols, 1)


def _rank_hover(row: dict, gpus_per_node: int | None) -> str:
    coords = ", ".join(f"{a}={i}" for a, i in row["coords"].items()) or "one rank"
    node = f" · node {row['rank'] // gpus_per_node}" if gpus_per_node else ""
    groups = "<br>".join(f"{a} group: ranks {', '.join(map(str, g))}" for a, g in row["groups"].items())
    return f"<b>rank {row['rank']}</b>{node}<br>({coords})<br>{groups}"


def _group_lines(topo: Topology, axis: str, xy) -> tuple[list, list]:
    """Each group of `axis` as a chain of arcs through its ranks, each group's arcs bowed by its
    own height, so that groups along the same row or column stay apart and show above the
    ranks' squares."""
    xs, ys = [], []
    for i, g in enumerate(topo.groups(axis)):
        h = 0.3 + 0.12 * (i % 4)
        for a, b in zip(g, g[1:]):
            (xa, ya), (xb, yb) = xy[a], xy[b]
            length = math.hypot(xb - xa, yb - ya) or 1.0
            mid = ((xa + xb) / 2 + h * (yb - ya) / length, (ya + yb) / 2 - h * (xb - xa) / length)
            xs += [xa, mid[0], xb]
            ys += [ya, mid[1], yb]
        xs.append(None)
        ys.append(None)
    return xs, ys


def mesh_figure(topology: Topology, gpus_per_node: int | None = None, *, order=None,
                title: str | None = None) -> go.Figure:
    """The ranks of `topology` on their nodes (`gpus_per_node` a row; None: the innermost axes
    fill a row), hover for coordinates and groups, a menu to colour by node or by an axis's
    groups. `order` (outermost first) replaces the topology's."""
    topo = replace(topology, order=tuple(order)) if order is not None else topology
    rows, axes, cols = mesh_rows(topo), _axes(topo), _columns(topo, gpus_per_node)
    xy = {r["rank"]: (r["rank"] % cols, r["rank"] // cols) for r in rows}
    n_rows = (topo.world_size + cols - 1) // cols
    node_of = [r // cols for r in range(topo.world_size)]
    colourings = {"node" if gpus_per_node else "row": [GROUP_COLORS[n % len(GROUP_COLORS)] for n in node_of]}
    for a in axes:
        index = {g: i for i, g in enumerate(topo.groups(a))}
        colourings[a] = [GROUP_COLORS[index[row["groups"][a]] % len(GROUP_COLORS)] for row in rows]
    fig = go.Figure()
    for a in axes:  # each axis's groups as lines, under the ranks; shown by the menu
        xs, ys = _group_lines(topo, a, xy)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=AXIS_COLORS[a], width=3, shape="spline"),
                                 name=f"{a} groups", hoverinfo="skip", visible=False, opacity=0.6))
    fig.add_trace(go.Scatter(
        x=[xy[r][0] for r in range(topo.world_size)], y=[xy[r][1] for r in range(topo.world_size)],
        mode="markers+text", text=[str(r) for r in range(topo.world_size)], textfont=dict(color="white", size=12),
        marker=dict(size=34, symbol="square", color=next(iter(colourings.values())),
                    line=dict(width=1, color="white")),
        hovertext=[_rank_hover(row, gpus_per_node) for row in rows], hoverinfo="text", name="ranks", showlegend=False))
    if gpus_per_node:
        for n in range(n_rows):
            fig.add_shape(type="rect", x0=-0.5, x1=cols - 0.5, y0=n - 0.45, y1=n + 0.45, line=dict(color="#888"),
                          layer="below")
            fig.add_annotation(x=cols - 0.5, y=n, text=f" node {n}", showarrow=False, xanchor="left")
    buttons = []
    for name, colours in colourings.items():
        visible = [name == a for a in axes] + [True]
        label = f"{name} groups" if name in axes else f"by {name}"
        buttons.append(dict(label=label, method="update",
                            args=[{"visible": visible, "marker.color": [None] * len(axes) + [colours]}]))
    fig.update_layout(
        title=dict(text=title or f"{topo}", font=dict(size=14)), height=140 + 60 * n_rows,
        width=max(600, 70 * cols + 160),
        xaxis=dict(visible=False, range=[-0.7, cols + 0.6]),
        yaxis=dict(visible=False, autorange="reversed", scaleanchor="x"),
        updatemenus=[dict(type="buttons", direction="right", x=0, y=1.0, xanchor="left", yanchor="bottom",
                          pad=dict(b=8), buttons=buttons, showactive=True)],
        **{k: v for k, v in _LOOK.items() if k != "legend"}, showlegend=False)
    return fig


def axis_timeline_figure(trace: Trace, title: str = "Every axis's communication") -> go.Figure:
    """Each rank's compute (grey) and its collectives and transfers, coloured by mesh axis."""
    span = max(trace.span, 1e-12)
    unit, scale = time_unit(span)
    rnd, t0 = rounder(span * scale), trace.start
    names = [f"rank {r}" for r in range(trace.world_size)]
    fig = go.Figure()

    def bars(evs, name, color, width, group, pattern=""):
        if not evs:
            return
        fig.add_trace(go.Bar(
            orientation="h", y=[names[e.rank] for e in evs], base=[rnd((e.start - t0) * scale) for e in evs],
            x=[rnd(e.duration * scale) for e in evs], name=name, legendgroup=group, width=width,
            marker=dict(color=color, line=dict(width=0), pattern_shape=pattern),
            customdata=[[e.label, e.bytes, rnd(e.duration * scale)] for e in evs],
            hovertemplate=f"<b>{name}</b> · %{{y}}<br>%{{customdata[0]}}<br>%{{customdata[1]}} bytes, "
                          f"%{{customdata[2]}} {unit}<extra></extra>"))

    bars([e for e in trace.events if e.kind == Kind.COMPUTE and e.duration > 0], "compute", COMPUTE_COLOR, 0.8,
         "compute")
    colls = [e for e in trace.events if e.kind == Kind.COLLECTIVE and e.duration > 0]
    for axis, color in AXIS_COLORS.items():
        coll = [e for e in colls if e.axis == axis]
        sent = [e for e in trace.events if e.axis == axis and e.kind == Kind.TRANSFER and e.duration > 0
                and not _inside(e, colls)]  # a collective's own messages are drawn as the collective
        bars(coll, f"{axis} collective", color, 0.5, axis)
        bars(sent, f"{axis} transfer", color, 0.25, axis, pattern="/")  # hatched: told from the collective
    fig.update_layout(title=title, barmode="overlay", xaxis_title=time_title(unit),
                      yaxis=dict(categoryorder="array", categoryarray=names[::-1]),
                      height=160 + 34 * trace.world_size, **_LOOK)
    return fig


def _inside(e, collectives) -> bool:
    """Whether event `e` lies within one of its rank's collectives."""
    return any(c.rank == e.rank and c.start <= e.start and e.end <= c.end for c in collectives)


def orders_figure(rows: list[dict], title: str = "What each order of the axes costs", *,
                  names: tuple[str, str] = ("measured", "predicted")) -> go.Figure:
    """rows: {"order": str, "axis": str, "measured": seconds, "predicted": seconds} (one per
    order and axis): grouped bars of communication seconds, "measured" solid, "predicted"
    hatched, named in the legend by `names`."""
    orders = list(dict.fromkeys(r["order"] for r in rows))
    axes = list(dict.fromkeys(r["axis"] for r in rows))
    span = max([r["measured"] for r in rows] + [r["predicted"] for r in rows] + [1e-12])
    unit, scale = time_unit(span)
    fig = go.Figure()
    for axis in axes:
        for what, pattern, label in (("measured", "", names[0]), ("predicted", "/", names[1])):
            ys = [next((r[what] for r in rows if r["order"] == o and r["axis"] == axis), 0.0) * scale for o in orders]
            fig.add_trace(go.Bar(x=orders, y=ys, name=f"{axis} {label}", offsetgroup=f"{axis}{what}",
                                 marker=dict(color=AXIS_COLORS.get(axis, "#888"), pattern_shape=pattern),
                                 opacity=1.0 if not pattern else 0.55))
    fig.update_layout(title=title, barmode="group", yaxis_title=f"communication per step ({unit})",
                      xaxis_title="order of the axes, outermost first", height=380, **_LOOK)
    return fig


def rank_memory_figure(measured: list[int], predicted: list[dict], title: str = "Memory per rank") -> go.Figure:
    """Per rank: the peak bytes measured (one bar) beside the prediction, stacked by item."""
    ranks = [f"rank {r}" for r in range(len(measured))]
    fig = go.Figure(go.Bar(x=ranks, y=[m / 2**20 for m in measured], name="measured peak", offsetgroup="measured",
                           marker_color="#333333"))
    items = list(dict.fromkeys(k for d in predicted for k in d))
    for i, item in enumerate(items):
        fig.add_trace(go.Bar(x=ranks, y=[d.get(item, 0) / 2**20 for d in predicted], name=f"predicted: {item}",
                             offsetgroup="predicted", marker_color=GROUP_COLORS[i % len(GROUP_COLORS)],
                             base=[sum(d.get(k, 0) for k in items[:i]) / 2**20 for d in predicted]))
    fig.update_layout(title=title, barmode="group", yaxis_title="MiB", height=380, **_LOOK)
    return fig


def plans_figure(candidates, title: str = "The planner's best plans, step time itemised") -> go.Figure:
    """One horizontal bar per candidate (a `planner.search.Candidate`), its seconds by item."""
    names = [_plan_name(c) for c in candidates]
    items = list(dict.fromkeys(k for c in candidates for k, v in c.time.items() if v))
    span = max((c.step_time for c in candidates), default=1.0)
    unit, scale = time_unit(span)
    fig = go.Figure()
    for i, item in enumerate(items):
        fig.add_trace(go.Bar(y=names, x=[c.time.get(item, 0) * scale for c in candidates], orientation="h",
                             name=item, marker_color=GROUP_COLORS[i % len(GROUP_COLORS)]))
    fig.update_layout(title=title, barmode="stack", xaxis_title=f"step time ({unit})",
                      yaxis=dict(autorange="reversed"), height=160 + 30 * len(names), **_LOOK)
    return fig


def _plan_name(c) -> str:
    lay = c.layout
    v = f" v{lay.virtual}" if lay.virtual > 1 else ""
    return (f"dp{lay.dp} tp{lay.tp} pp{lay.pp}" + (f" cp{lay.cp}" if lay.cp > 1 else "")
            + f" Z{lay.zero} {lay.recompute} b{lay.micro_batch} {lay.schedule}{v} · MFU {c.mfu:.1%}")


def plans_explorer_figure(scenarios: dict, title: str = "The planner's space: best plans per scenario") -> go.Figure:
    """{scenario name: candidates, fastest first}: one scenario's plans shown at a time (a menu
    picks it), each a bar of its step time itemised (seconds), its plan and memory on hover."""
    items = list(dict.fromkeys(k for cands in scenarios.values() for c in cands for k, v in c.time.items() if v))
    fig, visible = go.Figure(), []
    for s_i, cands in enumerate(scenarios.values()):
        ranks = [f"#{i + 1}" for i in range(len(cands))]
        hover = [f"{_plan_name(c)}<br>{c.memory_bytes / 2**30:.1f} GiB per device, "
                 f"{c.tokens_per_s:,.0f} tokens/s" for c in cands]
        for i, item in enumerate(items):
            fig.add_trace(go.Bar(y=ranks, x=[c.time.get(item, 0) for c in cands], orientation="h", name=item,
                                 legendgroup=item, showlegend=s_i == 0, visible=s_i == 0,
                                 marker_color=GROUP_COLORS[i % len(GROUP_COLORS)], hovertext=hover,
                                 hovertemplate=f"{item}: %{{x:.3g}} s<br>%{{hovertext}}<extra></extra>"))
            visible.append(s_i)
    buttons = [dict(label=name, method="update", args=[{"visible": [v == s_i for v in visible]}])
               for s_i, name in enumerate(scenarios)]  # the menu shows the scenario: the title need not
    fig.update_layout(title=title, barmode="stack", xaxis_title="step time (s)",
                      yaxis=dict(autorange="reversed", title="rank among feasible plans"), height=480,
                      updatemenus=[dict(type="dropdown", x=1, y=1.0, xanchor="right", yanchor="bottom",
                                        pad=dict(b=30), buttons=buttons)], **_LOOK)  # right: clear of the title
    return fig
