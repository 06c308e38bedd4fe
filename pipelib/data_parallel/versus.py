"""pipelib's DDP steps and torch's DistributedDataParallel, alternating step by step (bench, chapter 07).

On a shared machine the load drifts from second to second, so timing one side for a few
seconds, then the other, compares two different machines. `versus_steps` builds every side on
every rank once (same seed, so the same initial weights; the same data), then runs them in
turn, one training step each, the order rotating from step to step; every step starts from a
barrier and its time is the slowest rank's (a MAX all-reduce after the clock stopped). Side by
side within a fraction of a second, a drift hits both alike; `bench/data_parallel.py` reports
the median of the per-step ratios.

A side is (step, comm): `run_ddp`'s steps ("torch" for torch's DDP) and "gloo" or "pipelib".
After the last step every side's parameters are compared with torch's (they trained on the
same batches: equal up to fp32 rounding).

Introduced in chapter 07 (used by bench/data_parallel.py).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

SIDES = {"torch": ("torch", "gloo"), "overlap": ("overlap", "gloo"), "overlap_ring": ("overlap", "pipelib"),
         "after": ("buckets", "gloo"), "step1": ("all_reduce", "gloo")}


def run_versus(cluster, config, *, sides=tuple(SIDES), steps: int = 10, batch: int = 8,
               bucket_bytes: int = 1 << 20, seed: int = 0) -> dict:
    """`versus_steps` on every rank of `cluster`; rank 0's report: {"times": {side: [s, ...]},
    "max_param_diff": {side: max |param - torch's param|}}. `batch`: sequences per rank."""
    from pipelib.data_parallel.buckets import check_bucket_bytes

    unknown = [s for s in sides if s not in SIDES]
    if unknown or "torch" not in sides:
        raise ValueError(f"run_versus: sides={sides}; use names of {sorted(SIDES)}, torch's among them")
    check_bucket_bytes(bucket_bytes, "run_versus")
    return cluster.run(versus_steps, tuple(sides), config, steps, batch, bucket_bytes, seed)[0]


def _wrap(side, model, bucket_bytes):
    from pipelib.data_parallel import ddp

    step, comm = SIDES[side]
    if step == "torch":
        return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_bytes / 2**20)
    cls = {"overlap": ddp.OverlappedGrads, "buckets": ddp.BucketedGrads, "all_reduce": ddp.AllReduceGrads}[step]
    kw = {} if step == "all_reduce" else {"bucket_bytes": bucket_bytes}
    return cls(model, None, comm=comm, **kw)


def versus_steps(sides, config, steps, batch, bucket_bytes, seed):
    """On every rank: each side one step in turn, `steps` + 1 times (the first is not timed)."""
    from pipelib.data_parallel.runner import build_model, global_batch, loss_of
    from pipelib.runtime.device import current

    n, r = dist.get_world_size(), dist.get_rank()
    models = {s: build_model(config, seed) for s in sides}
    wrapped = {s: _wrap(s, models[s], bucket_bytes) for s in sides}
    opts = {s: torch.optim.Adam(models[s].parameters(), lr=1e-3) for s in sides}
    times = {s: [] for s in sides}
    for k in range(steps + 1):
        x, y = global_batch(config, batch * n, k, seed)
        x, y = x[r * batch:(r + 1) * batch], y[r * batch:(r + 1) * batch]
        for side in sides[k % len(sides):] + sides[:k % len(sides)]:
            dist.barrier()
            t0 = time.perf_counter()
            loss = loss_of(wrapped[side], x, y)
            if SIDES[side][0] == "torch":
                loss.backward()
            else:
                wrapped[side].backward(loss)
                wrapped[side].finish_gradients()
            opts[side].step()
            opts[side].zero_grad(set_to_none=False)
            elapsed = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
            if k:
                times[side].append(elapsed.item())
    ref = dict(models["torch"].named_parameters())
    diff = {s: max((p - ref[name]).abs().max().item() for name, p in models[s].named_parameters())
            for s in sides if s != "torch"}
    for s in sides:
        if s != "torch":
            wrapped[s].close()
    current().tracer.clear()
    return {"times": times, "max_param_diff": diff}
