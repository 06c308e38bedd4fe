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


# ----------------------------------------------------------------------------- derived axes
def _and_pp1(groups, pp_stride=16):
    """The groups of pp index 0 followed by the same groups one pipeline stage later."""
    return tuple(groups) + tuple(tuple(r + pp_stride for r in g) for g in groups)


GRID = Topology(dp=4, tp=2, cp=2, pp=2, ep=2, dp_replicate=2)  # strides: tp 1, cp 2, dp 4, pp 16
EXPECTED = {
    "tp": _and_pp1([(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]),
    "cp": _and_pp1([(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]),
    "dp": _and_pp1([(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]),
    "pp": tuple((r, r + 16) for r in range(16)),
    "loss": _and_pp1([(0, 2, 4, 6, 8, 10, 12, 14), (1, 3, 5, 7, 9, 11, 13, 15)]),
    "ep": _and_pp1([(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]),
    "edp": _and_pp1([(0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)]),
    "etp": _and_pp1([(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]),
    "tp-pp": tuple((r, r + 1, r + 16, r + 17) for r in range(0, 16, 2)),
    "tp-dp-cp": (tuple(range(16)), tuple(range(16, 32))),
    "tp-ep": _and_pp1([(0, 1, 4, 5), (2, 3, 6, 7), (8, 9, 12, 13), (10, 11, 14, 15)]),
}


@pytest.mark.parametrize("axis", sorted(EXPECTED))
def test_every_derived_axis_lists_the_groups_written_by_hand(axis):
    assert GRID.groups(axis) == EXPECTED[axis]
    assert GRID.groups("dp-cp") == GRID.groups("cp-dp") == EXPECTED["loss"]


def test_hsdp_cuts_dp_into_shard_runs_and_replicas():
    t = Topology(dp=8, ep=2, dp_replicate=2)  # dp_shard = 4: not ep's cut
    assert t.dp_shard == 4 and t.size("dp_shard") == 4 and t.size("dp_replicate") == 2
    assert t.groups("dp_shard") == ((0, 1, 2, 3), (4, 5, 6, 7))   # zero_runner's shard groups
    assert t.groups("dp_replicate") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert t.groups("ep") == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert t.groups("edp") == ((0, 2, 4, 6), (1, 3, 5, 7))         # dp_group[e::ep]
    assert [t.local_rank("dp_replicate", r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [t.local_rank("edp", r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert GRID.groups("dp_shard") == EXPECTED["ep"] and GRID.groups("dp_replicate") == EXPECTED["edp"]


NAMES = ("dp", "tp", "pp", "cp", "ep", "loss", "edp", "etp", "dp_shard", "dp_replicate")
PAIRS = ("tp-pp", "dp-cp", "tp-cp", "pp-dp", "tp-ep", "cp-edp", "pp-dp_shard", "tp-dp_replicate", "loss-tp")


@pytest.mark.parametrize("sizes", [dict(dp=4, tp=2, cp=2, pp=2, ep=2, dp_replicate=2), dict(dp=6, pp=2, ep=3),
                                   dict(dp=4, tp=3, dp_replicate=4, order=("tp", "cp", "dp", "pp")),
                                   dict(dp=8, cp=2, ep=4, dp_replicate=2, order=("dp", "pp", "tp", "cp")), dict()])
def test_groups_partition_the_ranks_and_combined_axes_are_products(sizes):
    t = Topology(**sizes)
    for axis in (*NAMES, *PAIRS, "tp-dp-cp"):
        groups = t.groups(axis)
        assert sorted(itertools.chain(*groups)) == list(range(t.world_size)), axis  # each rank once
        assert [g[0] for g in groups] == sorted(g[0] for g in groups), axis  # by smallest rank
        for g in groups:
            assert len(g) == t.size(axis) and list(g) == sorted(g), axis
            for i, r in enumerate(g):
                assert t.group_of(axis, r) == g and t.local_rank(axis, r) == i, (axis, r)
    for pair in PAIRS:  # a combined group: every rank reached by a step along one part, then the other
        a, b = pair.split("-")
        for r in range(t.world_size):
            reached = {y for x in t.group_of(a, r) for y in t.group_of(b, x)}
            assert t.group_of(pair, r) == tuple(sorted(reached)), (pair, r)
    for axis in ("dp", "tp", "pp", "cp", "ep"):  # group rank i is index i along a single axis
        assert all(getattr(t.coords(r), axis) == t.local_rank(axis, r) for r in range(t.world_size))


def test_tied_pairs_are_each_pipelines_first_and_last_ranks():
    t = Topology(dp=2, pp=3)
    assert t.tied_pairs() == ((0, 4), (1, 5))
    assert t.tied_pairs(2, 1) == ((2, 4), (3, 5)) and t.tied_pairs(1, 1) == ()
    with pytest.raises(ValueError, match="last=3 is not a pp index"):
        t.tied_pairs(0, 3)


@pytest.mark.parametrize("axis, words", [
    ("xp", "unknown axis 'xp'"), ("dp-", "unknown axis '' in 'dp-'"), ("tp-tp", r"names \['tp'\] twice"),
    ("loss-cp", r"'loss-cp' names \['cp'\] twice"), ("dp-ep", r"combines \['dp', 'ep'\]"),
    ("edp-dp_shard", r"combines \['edp', 'dp_shard'\]"), ("", "unknown axis ''")])
def test_bad_axis_names_are_named(axis, words):
    for ask in (GRID.groups, GRID.size, lambda a: GRID.group_of(a, 0)):
        with pytest.raises(ValueError, match=words):
            ask(axis)


@pytest.mark.parametrize("bad, words", [
    (dict(dp=4, dp_replicate=3), "dp_replicate=3 does not divide dp=4"), (dict(dp_replicate=0), "dp_replicate=0"),
    (dict(dp=2, dp_replicate=1.0), r"dp_replicate=1\.0")])
def test_bad_dp_replicate_names_the_value(bad, words):
    with pytest.raises(ValueError, match=words):
        Topology(**bad)


def test_hsdp_prints_and_round_trips():
    t = Topology(dp=4, tp=2, dp_replicate=2)
    assert str(t) == ("Topology(dp=4 x tp=2 (dp = dp_replicate=2 x dp_shard=2); 8 ranks, "
                      "order pp > dp > cp > tp)")
    assert Topology.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert Topology.from_dict({"dp": 4}) == Topology(dp=4)  # a manifest from before HSDP
    head, *rows = t.table().splitlines()
    assert head.split() == ["rank", "pp", "dp", "cp", "tp", "dp_replicate", "dp_shard"]
    assert rows[5].split() == ["5", "0", "2", "0", "1", "1", "0"]


def test_listing_every_group_of_a_large_grid_is_quick():
    """10,752 ranks (dp=84 x tp=8 x pp=16, ep=4, HSDP 2 x 42): every group of every axis, derived
    and some combined axes at once; rank lists by arithmetic (a search over the ranks per rank,
    as before, took over 4 s for the five single axes alone on this machine)."""
    import time

    t = Topology(dp=84, tp=8, pp=16, ep=4, dp_replicate=2)
    start = time.perf_counter()
    listed = {a: t.groups(a) for a in (*NAMES, *PAIRS, "tp-dp-cp")}
    took = time.perf_counter() - start
    assert took < 1.5, f"{took:.2f} s"
    assert len(listed["tp"]) == 1344 and len(listed["edp"]) == 8 * 16 * 4 and t.tied_pairs()[0] == (0, 10080)
