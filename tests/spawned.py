"""Spawned ranks for the tests that run pipelib under plain torch.distributed, with no cluster.

    outs = spawn_ranks(_worker, 2, tmp_path, deadline_s=180)   # [rank 0's saved result, rank 1's]

Each `worker(rank, path)` is started by `torch.multiprocessing.spawn` and saves its result as
`path/out{rank}.pt`. A hang fails the test after `deadline_s` (the ranks are killed) instead of
stalling the suite.
"""
import time

import pytest
import torch
import torch.multiprocessing as mp


def spawn_ranks(worker, nprocs: int, path, deadline_s: float) -> list:
    """Run `worker(rank, str(path))` on `nprocs` spawned processes; every rank's saved result."""
    ctx = mp.spawn(worker, args=(str(path),), nprocs=nprocs, join=False)
    deadline = time.monotonic() + deadline_s
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {nprocs} spawned ranks did not finish within {deadline_s} s")
    return [torch.load(f"{path}/out{r}.pt", weights_only=False) for r in range(nprocs)]
