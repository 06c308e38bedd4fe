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


def _scenario_rank(rank, path, *, scenarios, world: int, timeout_s: float):
    """A spawned rank that joins a gloo group and runs every `scenarios()` entry {name: fn(path)}
    in turn, keeping an exception as that scenario's "error" (a barrier after each)."""
    import datetime
    import os
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    out = {}
    try:
        for name, fn in scenarios().items():
            try:
                out[name] = fn(path)
            except Exception:
                out[name] = {"error": traceback.format_exc()}
            dist.barrier()
        torch.save(out, os.path.join(path, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


def scenario_runs(scenarios, world: int, path, deadline_s: float, timeout_s: float = 90) -> dict:
    """{name: [each rank's result]} of every scenario of `scenarios()` (a module-level function
    returning {name: fn(path)}), all run in one spawn of `world` ranks."""
    import functools

    worker = functools.partial(_scenario_rank, scenarios=scenarios, world=world, timeout_s=timeout_s)
    outs = spawn_ranks(worker, world, path, deadline_s)
    return {name: [o.get(name, {}) for o in outs] for name in scenarios()}


def scenario_facts(runs: dict, name: str) -> dict:
    """Rank 0's result of scenario `name`; the test fails with every rank's traceback if one raised."""
    errors = [f"rank {r}:\n{f['error']}" for r, f in enumerate(runs[name]) if "error" in f]
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return runs[name][0]
