"""The pure grid: ranks <-> coordinates, the groups of every axis, placement, JSON (no torch)."""
import itertools
import json

import pytest

from pipelib.topology import Coords, Topology


@pytest.mark.parametrize("sizes", [dict(dp=2, tp=2), dict(dp=2, tp=2, pp=2), dict(pp=3, cp=2),
                                   dict(dp=4, ep=2, tp=2), dict(dp=1)])
def test_rank_and_coords_are_inverse_and_groups_partition_the_world(sizes):
    t = Topology(**sizes)
    assert t.world_size == t.dp * t.tp * t.pp * t.cp
    for r in range(t.world_size):
        c = t.coords(r)
        assert t.rank(pp=c.pp, dp=c.dp, cp=c.cp, tp=c.tp) == r
    for axis in ("dp", "tp", "pp", "cp", "ep"):
        groups = t.groups(axis)
        assert sorted(itertools.chain(*groups)) == list(range(t.world_size))
        assert all(len(g) == t.size(axis) for g in groups)
        for g in groups:  # group rank i is the rank whose coordinate along the axis is i
            for i, r in enumerate(g):
                assert t.group_of(axis, r) == g
                assert getattr(t.coords(r), axis) == i


def test_tp_innermost_by_default_and_the_order_is_a_parameter():
    t = Topology(dp=2, tp=2, pp=2)
    assert t.groups("tp") == ((0, 1), (2, 3), (4, 5), (6, 7))  # consecutive: inside a node
    assert t.groups("dp") == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert t.groups("pp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert t.coords(5) == Coords(pp=1, dp=0, cp=0, tp=1)
    assert t.check_placement(gpus_per_node=2) == []
    flipped = Topology(dp=2, tp=2, pp=2, order=("pp", "tp", "cp", "dp"))
    assert flipped.groups("tp") == ((0, 2), (1, 3), (4, 6), (5, 7))
    (problem,) = flipped.check_placement(gpus_per_node=2)
    assert "tp groups cross nodes" in problem and "(0, 2)" in problem


def test_expert_groups_are_runs_of_dp_ranks():
    t = Topology(dp=4, ep=2)
    assert t.world_size == 4
    assert t.groups("ep") == ((0, 1), (2, 3))
    assert [t.coords(r).ep for r in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize("bad, words", [
    (dict(dp=0), "dp=0"), (dict(tp=1.5), "tp=1.5"), (dict(pp=True), "pp=True"),
    (dict(dp=3, ep=2), "ep=2 does not divide dp=3"), (dict(order=("dp", "tp")), "order="),
    (dict(order=("dp", "dp", "cp", "tp")), "order=")])
def test_bad_degrees_name_the_value_and_what_to_do(bad, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        Topology(**bad)


def test_world_size_and_coordinate_errors():
    t = Topology(dp=2, tp=2)
    with pytest.raises(ValueError, match="needs 4 ranks but the cluster has 2"):
        t.check_world(2)
    t.check_world(8)  # the first 4 of 8 ranks
    with pytest.raises(ValueError, match="rank 4 is outside"):
        t.coords(4)
    with pytest.raises(ValueError, match="tp=2 is outside 0..1"):
        t.rank(tp=2)
    with pytest.raises(ValueError, match="unknown axis"):
        t.groups("xp")


def test_prints_and_round_trips_through_json():
    t = Topology(dp=2, tp=2, pp=2)
    assert str(t) == "Topology(pp=2 x dp=2 x tp=2; 8 ranks, order pp > dp > cp > tp)"
    assert Topology.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert t.table().splitlines()[0].split() == ["rank", "pp", "dp", "cp", "tp"]
    with pytest.raises(ValueError, match="unknown keys"):
        Topology.from_dict({"dq": 2})
