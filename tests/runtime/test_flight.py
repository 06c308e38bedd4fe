"""The collectives' flight recorder alone: what a rank writes, what the notebook reads, and the rule
that turns records into an error (`never_complete`): a wait for a rank that returned, or a cycle
of waits, is flagged; a slow rank, ranks all inside the same collective, a rank that is just
leaving one, a rank whose record cannot be read are not. The cluster cases are
tests/runtime/test_desync_cluster.py."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch.distributed as dist

from pipelib.runtime.beacon import Activity
from pipelib.runtime.flight import (DESYNC_SECONDS, MAX_GROUPS, Entry, Flight, desync_message, never_complete,
                                    read)

NOW = 1000.0
OLD = NOW - DESYNC_SECONDS - 0.5  # a wait long enough to count
WORLD = (0, 1, 2, 3)


def entry(op, ranks, seq, since=OLD, key=None):
    return Entry(op, tuple(ranks), hash(tuple(ranks)) % 1000 if key is None else key, seq, since)


def flight(current=None, counts=None, last=None):
    counts = dict(counts or {})
    if current is not None:
        counts.setdefault(current.key, current.seq)
    return Flight(current, last or current, counts)


def world(seq):
    return {entry("x", WORLD, 1).key: seq}


# ----------------------------------------------------------------------------- the rule
def test_ranks_waiting_for_a_rank_that_returned_are_flagged_naming_it():  # K04
    e = entry("all_reduce", WORLD, 5)
    last = entry("all_reduce", WORLD, 4)
    flights = {r: flight(e) for r in range(3)} | {3: flight(None, world(4), last)}
    waits = never_complete(flights, running={0, 1, 2}, now=NOW)
    assert [(w.rank, w.missing) for w in waits] == [(0, (3,)), (1, (3,)), (2, (3,))]
    msg = desync_message(waits, flights, {0, 1, 2}, WORLD, "coll")
    assert ("rank 0 has waited 2.5 s in all_reduce on group [0, 1, 2, 3], that group's collective #5, for rank 3, "
            "which returned from coll without calling it (its last collective: all_reduce on group [0, 1, 2, 3], "
            "that group's collective #4)") in msg, msg


def test_a_rank_on_another_group_is_flagged_naming_what_the_others_did():  # K13
    sub = entry("all_reduce", (0, 1, 2), 1)
    e = entry("all_reduce", WORLD, 3)
    flights = {r: flight(None, world(2) | {sub.key: 1}, sub) for r in range(3)} | {3: flight(e)}
    waits = never_complete(flights, running={3}, now=NOW)
    assert [(w.rank, w.missing) for w in waits] == [(3, (0, 1, 2))]
    msg = desync_message(waits, flights, {3}, WORLD, "coll")
    assert "for ranks 0, 1, 2, which each returned from coll without calling it (their last collective: " \
           "all_reduce on group [0, 1, 2]" in msg, msg


def test_a_cycle_of_ranks_each_in_another_groups_collective_is_flagged():
    groups = [(0, 1), (1, 2), (0, 2)]
    flights = {r: flight(entry("all_reduce", g, 1)) for r, g in enumerate(groups)}
    waits = never_complete(flights, running={0, 1, 2}, now=NOW)
    assert [(w.rank, w.missing) for w in waits] == [(0, (1,)), (1, (2,)), (2, (0,))]
    assert "rank 0 has waited 2.5 s in all_reduce on group [0, 1], that group's collective #1, for rank 1, which " \
           "waits in all_reduce on group [1, 2]" in desync_message(waits, flights, {0, 1, 2}, (0, 1, 2), "f")


def test_a_slow_rank_still_computing_is_never_flagged_however_long():
    e = entry("all_reduce", WORLD, 5, since=NOW - 3600)
    flights = {r: flight(e) for r in range(3)} | {3: flight(None, world(4))}
    assert never_complete(flights, running={0, 1, 2, 3}, now=NOW) == []


def test_ranks_all_inside_the_same_collective_are_never_flagged():
    e = entry("all_reduce", WORLD, 5, since=NOW - 3600)
    assert never_complete({r: flight(e) for r in WORLD}, running=set(WORLD), now=NOW) == []


def test_a_rank_past_the_collective_is_not_awaited():  # it sent its share and left (a broadcast's root)
    e = entry("broadcast", WORLD, 5)
    flights = {r: flight(e) for r in range(3)} | {3: flight(None, world(5))}
    assert never_complete(flights, running={0, 1, 2}, now=NOW) == []


def test_a_chain_that_ends_at_a_computing_rank_may_still_complete():
    pair = entry("all_reduce", (0, 1), 1)
    flights = {0: flight(pair, world(1)), 1: flight(None, world(1)),  # rank 1 computes, then joins
               2: flight(entry("all_reduce", WORLD, 2)), 3: flight(entry("all_reduce", WORLD, 2))}
    assert never_complete(flights, running=set(WORLD), now=NOW) == []


def test_young_waits_and_unreadable_records_give_no_verdict():
    young = entry("all_reduce", WORLD, 5, since=NOW - DESYNC_SECONDS / 2)
    flights = {r: flight(young) for r in range(3)} | {3: flight(None, world(4))}
    assert never_complete(flights, running={0, 1, 2}, now=NOW) == []
    old = entry("all_reduce", WORLD, 5)
    flights = {r: flight(old) for r in range(3)} | {3: None}
    assert never_complete(flights, running={0, 1, 2}, now=NOW) == []
    full = Flight(None, None, {}, complete=False)  # more groups than the file's table
    assert never_complete({r: flight(old) for r in range(3)} | {3: full}, running={0, 1, 2}, now=NOW) == []


# ----------------------------------------------------------------------------- the recorder
@pytest.fixture(scope="module")
def one_rank():
    d = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1)
    yield d
    dist.destroy_process_group()


def test_the_file_says_the_collective_its_group_and_its_number_while_the_text_stays_readable(one_rank):
    path = os.path.join(one_rank, "beacon")
    a = Activity(path)
    assert read(path, Activity.SIZE) == Flight(None, None, {})
    a.flight.enter("all_reduce", None)
    with a.doing("running f"):
        a.flight.enter("agreement check of all_reduce", None)
        got = read(path, Activity.SIZE)
        assert (got.current.op, got.current.ranks, got.current.seq) == ("agreement check of all_reduce", (0,), 2)
        assert Activity.read(path)[1] == "running f"
    got = read(path, Activity.SIZE)  # the block closed what it opened, not the collective around it
    assert (got.current.op, got.last.op) == ("all_reduce", "agreement check of all_reduce")
    try:
        with a.doing("running g"):
            a.flight.enter("broadcast", None)
            raise KeyError("boom")
    except KeyError:
        pass
    got = read(path, Activity.SIZE)
    assert got.current.op == "all_reduce" and got.last.op == "broadcast" and got.last.seq == 3
    a.flight.unwind(0)
    got = read(path, Activity.SIZE)
    assert got.current is None and list(got.counts.values()) == [3] and got.complete


def test_more_groups_than_the_table_holds_leave_their_counts_unknown(one_rank):
    path = os.path.join(one_rank, "many")
    a = Activity(path)
    groups = [dist.new_group([0]) for _ in range(MAX_GROUPS + 1)]
    for g in groups:
        a.flight.enter("all_reduce", g)
        a.flight.unwind(0)
    got = read(path, Activity.SIZE)
    assert not got.complete and len(got.counts) == MAX_GROUPS
    assert got.entered(got.last.key) is None and got.entered(next(iter(got.counts))) == 1


def test_without_a_file_nothing_is_recorded():
    a = Activity()
    a.flight.enter("all_reduce", None)
    assert a.flight.depth == 0
    with a.doing("x"):
        pass
