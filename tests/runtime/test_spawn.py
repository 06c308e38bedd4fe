"""`pipelib.runtime.spawn.run_spawned`: ranks without a launcher, their results, and each way a
rank can fail (an exception, a death, a stall) as an error that says which, with no process left."""
import operator
import os
import time

import pytest
import torch.distributed as dist

from pipelib.runtime.spawn import run_spawned


def test_each_rank_runs_in_its_own_gloo_group_and_returns_its_result():
    assert run_spawned(dist.get_rank, 3) == [0, 1, 2]  # one group of 3 (a spawn costs seconds: one only)


def test_an_exception_on_the_ranks_comes_back_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)run_spawned\(truediv\) failed:.*rank 0:.*ZeroDivisionError"):
        run_spawned(operator.truediv, 2, (1, 0))


def test_a_rank_that_dies_is_an_error_not_a_hang():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="a spawned rank died"):
        run_spawned(os._exit, 2, (3,), quiet=True, what="dying ranks")
    assert time.monotonic() - t0 < 60


def test_a_stalled_run_is_killed_at_its_timeout():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks still running after 2 s"):
        run_spawned(time.sleep, 2, (120,), timeout=2)
    assert time.monotonic() - t0 < 60  # killed, not waited for (the ranks would sleep 120 s)


def test_bad_world_size_is_refused_before_any_process():
    with pytest.raises(ValueError, match="world_size"):
        run_spawned(dist.get_rank, 0)
