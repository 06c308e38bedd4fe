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
