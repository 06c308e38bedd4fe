"""Chapter 15's mesh figure: every rank's hover names its coordinates and every group of every
axis, as `Topology` computes them; the order of the axes changes which groups cross nodes;
the axis timeline colours each event by the mesh axis that carried it."""
import pytest

from pipelib.topology import Topology
from pipelib.trace import Event, Kind, Trace
from pipelib.viz.display import figure_bundle
from pipelib.viz.mesh import AXIS_COLORS, axis_timeline_figure, mesh_figure, mesh_rows, orders_figure


def test_rows_are_the_topologys_coordinates_and_groups_for_every_rank():
    topo = Topology(dp=2, tp=2, pp=2)
    rows = mesh_rows(topo)
    assert [r["rank"] for r in rows] == list(range(8))
    for r in rows:
        assert r["coords"] == {a: getattr(topo.coords(r["rank"]), a) for a in ("pp", "dp", "tp")}
        assert r["groups"] == {a: topo.group_of(a, r["rank"]) for a in ("pp", "dp", "tp")}
    # tp innermost: consecutive ranks; pp outermost: ranks world/2 apart
    assert rows[5]["groups"] == {"pp": (1, 5), "dp": (5, 7), "tp": (4, 5)}


def test_hover_lists_every_group_and_the_menu_colours_by_node_or_by_each_axis():
    fig = mesh_figure(Topology(dp=2, tp=2, pp=2), gpus_per_node=4)
    ranks = fig.data[-1]  # drawn last, over the groups' lines
    assert list(ranks.text) == [str(r) for r in range(8)]
    hover = ranks.hovertext[5]
    for piece in ("rank 5", "node 1", "pp=1, dp=0, tp=1", "pp group: ranks 1, 5", "dp group: ranks 5, 7",
                  "tp group: ranks 4, 5"):
        assert piece in hover, (piece, hover)
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels == ["by node", "pp groups", "dp groups", "tp groups"]
    # "tp groups": one colour per tp group (4 groups of 2), the tp lines shown, no other axis's
    tp = fig.layout.updatemenus[0].buttons[3].args[0]
    assert len(set(tp["marker.color"][-1])) == 4 and tp["visible"] == [False, False, True, True]
    assert len(fig.layout.shapes) == 2  # one box a node
    figure_bundle(fig)  # serialises for the book


def test_the_order_is_a_parameter_and_moves_the_groups_across_nodes():
    topo = Topology(dp=2, tp=2, pp=2)

    def crossing(fig, axis):  # groups whose ranks' rows (nodes) differ, read back from the lines drawn
        line = next(d for d in fig.data if d.name == f"{axis} groups")
        groups, cur = [], []
        for y in line.y:
            if y is None:
                groups.append(cur)
                cur = []
            elif float(y).is_integer():  # a rank's row (the points between are the arcs' bows)
                cur.append(y)
        return sum(len(set(g)) > 1 for g in groups)

    pp_outer = mesh_figure(topo, 4)
    dp_outer = mesh_figure(topo, 4, order=("dp", "pp", "cp", "tp"))
    tp_outer = mesh_figure(topo, 4, order=("tp", "pp", "dp", "cp"))
    assert (crossing(pp_outer, "pp"), crossing(pp_outer, "dp"), crossing(pp_outer, "tp")) == (4, 0, 0)
    assert (crossing(dp_outer, "pp"), crossing(dp_outer, "dp"), crossing(dp_outer, "tp")) == (0, 4, 0)
    assert crossing(tp_outer, "tp") == 4
    assert "order dp > pp > cp > tp" in dp_outer.layout.title.text


def test_expert_groups_are_drawn_inside_dp():
    fig = mesh_figure(Topology(dp=4, tp=2, ep=2))
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["by row", "dp groups", "tp groups", "ep groups"]
    assert "ep group: ranks 0, 2" in fig.data[-1].hovertext[0]


def test_axis_timeline_colours_each_axis_and_leaves_waiting_out():
    evs = [Event(0, Kind.COMPUTE, "F", 0.0, 1.0), Event(1, Kind.COMPUTE, "F", 0.0, 1.0),
           Event(0, Kind.COLLECTIVE, "all_reduce", 1.0, 1.5, bytes=64, axis="tp"),
           Event(1, Kind.TRANSFER, "act", 1.0, 1.2, bytes=32, peer=0, axis="pp"),
           Event(1, Kind.RECV_WAIT, "act", 1.0, 1.2, peer=0, axis="pp"),
           Event(0, Kind.TRANSFER, "all_reduce step 0", 1.0, 1.25, bytes=32, peer=1, axis="tp")]  # in the collective
    fig = axis_timeline_figure(Trace(evs, 2))
    by_name = {d.name: d for d in fig.data}
    assert set(by_name) == {"compute", "tp collective", "pp transfer"}
    assert by_name["tp collective"].marker.color == AXIS_COLORS["tp"]
    assert list(by_name["pp transfer"].x) == [pytest.approx(0.2)]  # the span is 1.5 s: seconds


def test_orders_figure_draws_measured_beside_predicted():
    rows = [{"order": o, "axis": a, "measured": 1e-3 * i, "predicted": 1.1e-3 * i}
            for i, (o, a) in enumerate([(o, a) for o in ("pp>dp>tp", "dp>pp>tp") for a in ("dp", "pp")], 1)]
    fig = orders_figure(rows)
    assert [d.name for d in fig.data] == ["dp measured", "dp predicted", "pp measured", "pp predicted"]
    assert list(fig.data[0].y) == pytest.approx([1.0, 3.0])


def test_rank_memory_stacks_the_prediction_beside_the_measured_peak():
    from pipelib.viz.mesh import rank_memory_figure

    predicted = [{"parameters": 2**20, "activations": 3 * 2**20}, {"parameters": 2**20, "activations": 2**20}]
    fig = rank_memory_figure([4 * 2**20, 2 * 2**20], predicted)
    assert [d.name for d in fig.data] == ["measured peak", "predicted: parameters", "predicted: activations"]
    assert list(fig.data[2].base) == [1.0, 1.0] and list(fig.data[2].y) == [3.0, 1.0]


def test_plans_figure_itemises_each_candidates_step():
    from pipelib.costmodel import LINKS, PROFILES
    from pipelib.planner.search import search
    from pipelib.planner.spec import GPT3_175B, Machine
    from pipelib.viz.mesh import plans_figure

    best = search(GPT3_175B, Machine(PROFILES["a100"], 8, LINKS["ib-ndr"]), 1024, 1536)[:3]
    fig = plans_figure(best)
    assert len(fig.data[0].y) == 3 and fig.data[0].name == "compute"
    totals = [sum(d.x[i] for d in fig.data) for i in range(3)]
    assert totals == pytest.approx([c.step_time for c in best])  # seconds: the span is over 1 s


def test_the_explorer_shows_one_scenario_at_a_time_behind_a_menu():
    from pipelib.costmodel import LINKS, PROFILES
    from pipelib.planner.search import search
    from pipelib.planner.spec import GPT3_175B, LLAMA3_70B, Machine
    from pipelib.viz.mesh import plans_explorer_figure

    h100 = Machine(PROFILES["h100"], 8, LINKS["ib-ndr"])
    scenarios = {"GPT-3 on 1024": search(GPT3_175B, h100, 1024, 1536)[:5],
                 "Llama on 64": search(LLAMA3_70B, h100, 64, 128)[:4]}
    fig = plans_explorer_figure(scenarios)
    menu = fig.layout.updatemenus[0].buttons
    assert [b.label for b in menu] == list(scenarios)
    shown = [d for d, v in zip(fig.data, menu[1].args[0]["visible"]) if v]
    assert {len(d.x) for d in shown} == {4}
    assert sum(d.x[0] for d in shown) == pytest.approx(scenarios["Llama on 64"][0].step_time)
    assert [bool(d.visible) for d in fig.data] == list(menu[0].args[0]["visible"])  # the first scenario first
    figure_bundle(fig)
