"""Ranks that disagree on which collective to call (issue 28, the review's K04 and K13): an error
within seconds naming the rank that did not come and what it did instead, not a hang to the
cluster's timeout (60 s here); and no false alarm for a collective that is just long, a rank that
is slow to call it, or a chain of waits that ends at a rank still computing. One 3-rank cluster
on the wall clock (a simulated link's latency is then a real wait inside the collective); the
flight recorder's rule alone is tests/runtime/test_flight.py.
"""
from __future__ import annotations

import re
import time

import pytest

from pipelib.runtime.cluster import Cluster
from pipelib.runtime.errors import ClusterError, DesyncError
from pipelib.runtime.flight import DESYNC_SECONDS

TIMEOUT = 60.0
WITHIN = TIMEOUT / 3  # far from the timeout: the error came from the records, not from the clock


@pytest.fixture(scope="module")
def c3():
    c = Cluster(3, clock="wall", timeout=TIMEOUT)
    yield c
    c.stop()


@pytest.fixture
def cluster(c3):
    if c3._broken:  # restarted before the next test, not after the last one (a restart costs seconds)
        c3.restart()
    return c3


# ----------------------------------------------------------------------------- engine functions
def all_reduce_after(seconds, slow_rank=0, latency=None):
    """Every rank all-reduces ones; `slow_rank` first sleeps `seconds`; with `latency`, every
    message of the ring takes that long (a real wait, inside the collective, on every rank)."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from pipelib.comm.collectives import all_reduce
    from pipelib.costmodel import Link
    from pipelib.runtime.device import current

    if dist.get_rank() == slow_rank:
        time.sleep(seconds)
    dev = current()
    slow = dataclasses.replace(dev.profile, link=Link("slow", alpha=latency, beta=1e9)) if latency else None
    with dev.overrides(profile=slow):
        return all_reduce(torch.ones(4)).tolist()


def pair_then_world(seconds):
    """Ranks 0 and 1 all-reduce on their pair (rank 1 after `seconds`), then all on the world:
    rank 2 waits for rank 0, which waits for rank 1, which computes: a chain that completes."""
    import torch
    import torch.distributed as dist

    from pipelib.comm.collectives import all_reduce

    pair = dist.new_group([0, 1])
    if dist.get_rank() == 1:
        time.sleep(seconds)
    if dist.get_rank() < 2:
        all_reduce(torch.ones(1), group=pair)
    return all_reduce(torch.ones(1)).item()


def all_reduce_but_last_rank():  # K04: one rank returns without calling the collective
    import torch
    import torch.distributed as dist

    from pipelib.comm.collectives import all_reduce

    if dist.get_rank() == dist.get_world_size() - 1:
        return None
    return all_reduce(torch.ones(4)).tolist()


def last_rank_on_another_group():  # K13: the last rank calls the collective on the world
    import torch
    import torch.distributed as dist

    from pipelib.comm.collectives import all_reduce

    n = dist.get_world_size()
    g = dist.new_group(list(range(n - 1)))
    return all_reduce(torch.ones(4), group=g if dist.get_rank() < n - 1 else None).tolist()


def each_on_its_neighbours_group():  # a cycle: rank r on {r, r+1}, each waits for the next
    import torch
    import torch.distributed as dist

    from pipelib.comm.collectives import all_reduce

    n, r = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(sorted([i, (i + 1) % n])) for i in range(n)]
    return all_reduce(torch.ones(4), group=groups[r]).tolist()


# ----------------------------------------------------------------------------- no false alarm
def test_a_collective_that_is_long_on_every_rank_is_not_flagged(cluster):
    t0 = time.monotonic()
    assert cluster.run(all_reduce_after, 0.0, latency=1.0) == [[3.0] * 4] * 3
    assert time.monotonic() - t0 >= 4 * 1.0 > DESYNC_SECONDS + 0.5  # 2(n-1) messages of 1 s each, all inside it


def test_a_rank_slow_to_call_the_collective_is_waited_for(cluster):
    t0 = time.monotonic()
    assert cluster.run(all_reduce_after, 2 * DESYNC_SECONDS) == [[3.0] * 4] * 3
    assert time.monotonic() - t0 >= 2 * DESYNC_SECONDS


def test_a_chain_of_waits_that_ends_at_a_computing_rank_is_waited_for(cluster):
    assert cluster.run(pair_then_world, 2 * DESYNC_SECONDS) == [3.0] * 3


# ----------------------------------------------------------------------------- desync: an error in seconds
def _desync(cluster, fn) -> DesyncError:
    t0 = time.monotonic()
    with pytest.raises(DesyncError) as err:
        cluster.run(fn)
    took = time.monotonic() - t0
    assert DESYNC_SECONDS <= took < WITHIN, (took, str(err.value))
    with pytest.raises(ClusterError) as after:  # the waiting ranks hold receives: one line, the way out
        cluster.run(all_reduce_after, 0.0)
    assert "\n" not in str(after.value) and "call cluster.restart() to continue" in str(after.value)
    return err.value


def test_a_rank_that_returns_without_calling_the_collective_is_named_in_seconds(cluster):  # K04
    err = _desync(cluster, all_reduce_but_last_rank)
    assert (err.ranks, err.missing) == ([0, 1], [2])
    for r in (0, 1):
        assert (re.search(rf"rank {r} has waited \d+\.\d s in all_reduce on group \[0, 1, 2\], that group's "
                          rf"collective #\d+, for rank 2", str(err))
                and "for rank 2, which returned from all_reduce_but_last_rank without calling it (its last "
                    "collective: all_reduce on group [0, 1, 2]" in str(err)), str(err)
    assert str(err).endswith("call cluster.restart() to continue.")


def test_a_rank_that_calls_the_collective_on_another_group_is_named_in_seconds(cluster):  # K13
    err = _desync(cluster, last_rank_on_another_group)
    assert (err.ranks, err.missing) == ([2], [0, 1])
    assert (re.search(r"rank 2 has waited \d+\.\d s in all_reduce on group \[0, 1, 2\], that group's collective "
                      r"#\d+, for ranks 0, 1, which", str(err))
            and "for ranks 0, 1, which each returned from last_rank_on_another_group without calling it (their "
                "last collective: all_reduce on group [0, 1], that group's collective #1)" in str(err)), str(err)


def test_ranks_each_waiting_in_another_groups_collective_are_named_in_seconds(cluster):
    err = _desync(cluster, each_on_its_neighbours_group)
    assert (err.ranks, err.missing) == ([0, 1, 2], [0, 1, 2])
    assert re.search(r"rank 0 has waited \d+\.\d s in all_reduce on group \[0, 1\], that group's collective #1, ",
                     str(err))
    assert "for rank 1, which waits in all_reduce on group [1, 2], that group's collective #1" in str(err)
    assert "for rank 0, which waits in all_reduce on group [0, 1]" in str(err)  # rank 2's wait closes the cycle
