"""The mesh on a live cluster: groups of every axis made once, events tagged with their axis."""
import torch

from pipelib.topology import Topology


def _groups_of_mesh(sizes):
    import torch.distributed as dist

    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh

    before = len(current().groups)
    mesh = Mesh(Topology(**sizes))
    made = len(current().groups) - before
    again = Mesh(Topology(**sizes))  # made once per engine: a second mesh makes nothing
    assert len(current().groups) - before == made and again["tp"] is mesh["tp"]
    ranks = {a: tuple(dist.get_process_group_ranks(mesh[a])) for a in ("dp", "tp")}
    return tuple(mesh.coords), ranks, mesh.ranks("dp")


def test_mesh_groups_follow_the_topology(cluster4):
    out = cluster4.run(_groups_of_mesh, {"dp": 2, "tp": 2})
    assert [c for c, _, _ in out] == [(0, 0, 0, 0, 0), (0, 0, 0, 1, 0), (0, 1, 0, 0, 0), (0, 1, 0, 1, 0)]
    assert [r["tp"] for _, r, _ in out] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [r["dp"] for _, r, _ in out] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert [d for _, _, d in out] == [(0, 2), (1, 3), (0, 2), (1, 3)]


def _all_reduce_on_each_axis():
    from pipelib.comm.collectives import all_reduce
    from pipelib.runtime.mesh import Mesh

    mesh = Mesh(Topology(dp=2, tp=2))
    x = torch.ones(8)
    all_reduce(x, group=mesh["tp"])
    all_reduce(x, group=mesh["dp"])
    return x


def test_events_carry_their_axis_and_bytes_per_axis_follow(cluster4):
    cluster4.reset()
    out = cluster4.run(_all_reduce_on_each_axis)
    assert all(torch.equal(x, torch.full((8,), 4.0)) for x in out)
    trace = cluster4.trace()
    # ring all-reduce on 2 ranks: each rank sends 2 (n-1)/n N = N bytes (N = 32)
    for axis in ("tp", "dp"):
        assert trace.bytes_sent(axis=axis) == 4 * 32, axis
        assert {e.label for e in trace.filter(kind="collective", axis=axis)} == {"all_reduce"}
    assert trace.bytes_sent(axis="pp") == 0


def _first_and_tied():
    import torch.distributed as dist

    from pipelib.runtime.mesh import Mesh

    first = Mesh.first(2)
    inside = first.contains
    dp = tuple(dist.get_process_group_ranks(first["dp"])) if inside else None
    mesh = Mesh(Topology(pp=2, dp=2))
    tied = mesh.tied_group()
    dm = mesh.to_device_mesh()
    return inside, dp, tuple(dist.get_process_group_ranks(tied)), dm.mesh.tolist(), dm.mesh_dim_names


def test_first_ranks_tied_pairs_and_torch_device_mesh(cluster4):
    out = cluster4.run(_first_and_tied)
    assert [o[0] for o in out] == [True, True, False, False]
    assert [o[1] for o in out] == [(0, 1), (0, 1), None, None]
    # pp outermost: stage 0 on ranks 0, 1 and the last stage on 2, 3; rank r pairs with r +- 2
    assert [o[2] for o in out] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert all(o[3] == [[0, 1], [2, 3]] and o[4] == ("pp", "dp") for o in out)


def _derived():
    import torch.distributed as dist

    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh

    def ranks(g):
        return tuple(dist.get_process_group_ranks(g))

    axes = current().axes
    out = {}
    flat = Mesh(Topology(dp=2, tp=2))  # cp = 1, no experts, no HSDP: nothing new to make
    out["reused"] = (flat["loss"] is flat["dp"], flat["etp"] is flat["tp"], flat["edp"] is flat["dp"],
                     flat["dp_shard"] is flat["dp"], flat["dp_replicate"] is flat["ep"], flat.grid_group())
    loss = Mesh(Topology(dp=2, cp=2))
    out["loss"] = ranks(loss["loss"]), axes[id(loss["loss"])], loss.local_rank("loss")
    experts = Mesh(Topology(dp=4, ep=2))
    out["edp"] = ranks(experts["edp"]), axes[id(experts["edp"])], ranks(experts["ep"])
    hsdp = Mesh(Topology(dp=4, dp_replicate=2))
    out["hsdp"] = (ranks(hsdp["dp_shard"]), ranks(hsdp["dp_replicate"]), axes[id(hsdp["dp_shard"])],
                   axes[id(hsdp["dp_replicate"])], hsdp.local_rank("dp_replicate"))
    both = Mesh(Topology(tp=2, pp=2), extra=("tp-pp", "cp-dp"))
    out["extra"] = (ranks(both["tp-pp"]), axes[id(both["tp-pp"])], both["cp-dp"] is both["loss"],
                    ranks(both["loss"]))
    before = len(current().groups)
    again = Mesh(Topology(tp=2, pp=2), extra=("tp-pp",))
    out["again"] = again["tp-pp"] is both["tp-pp"] and len(current().groups) == before
    try:
        Mesh(Topology(tp=2, pp=2))["tp-pp"]
    except KeyError as e:
        out["not made"] = str(e)
    first = Mesh.first(2, "pp")
    out["first"] = (ranks(first.tied_group(0, 1)) if first.contains else None,
                    ranks(first.grid_group()) if first.grid_group() is not None else None)
    odd = Mesh(Topology(dp=2), on=(1, 3))  # a grid on given ranks (run_ddp's ranks=[1, 3])
    out["on"] = (odd.contains and (ranks(odd["dp"]), axes[id(odd["dp"])], odd.ranks("dp"), odd.local_rank("dp")),
                 odd.grid_group() is not None and ranks(odd.grid_group()))
    try:
        Mesh(Topology(dp=2), on=(3, 1))
    except ValueError as e:
        out["bad on"] = str(e)
    return out


def test_derived_axes_made_once_reused_where_equal_and_tagged(cluster4):
    out = cluster4.run(_derived)
    for o in out:  # nothing new where a derived axis is a single axis's groups, or one rank each
        assert o["reused"][:5] == (True, True, True, True, True) and o["reused"][5] is None
        assert o["again"] is True and "extra=('tp-pp',)" in o["not made"]
    assert [o["loss"] for o in out] == [((0, 1, 2, 3), "loss", r) for r in range(4)]
    assert [o["edp"] for o in out] == [((0, 2), "edp", (0, 1)), ((1, 3), "edp", (0, 1)),
                                       ((0, 2), "edp", (2, 3)), ((1, 3), "edp", (2, 3))]
    assert [o["hsdp"] for o in out] == [((0, 1), (0, 2), "dp_shard", "dp_replicate", 0),
                                        ((0, 1), (1, 3), "dp_shard", "dp_replicate", 0),
                                        ((2, 3), (0, 2), "dp_shard", "dp_replicate", 1),
                                        ((2, 3), (1, 3), "dp_shard", "dp_replicate", 1)]
    # tp-pp is the whole world here; cp-dp (and loss) one rank each: the rank's group of one
    assert all(o["extra"] == ((0, 1, 2, 3), "tp-pp", True, (r,)) for r, o in enumerate(out))
    # what embedding_group needs: the pair of pipeline stages 0 and 1 on ranks 0 and 1, and the grid's group
    assert [o["first"] for o in out] == [((0, 1), (0, 1)), ((0, 1), (0, 1)), (None, None), (None, None)]
    assert [o["on"] for o in out] == [(False, False), (((1, 3), "dp", (1, 3), 0), (1, 3)), (False, False),
                                      (((1, 3), "dp", (1, 3), 1), (1, 3))]  # off the grid: no grid group
    assert all("on=(3, 1) must be 2 distinct ranks of the world (0..3), ascending" in o["bad on"] for o in out)
