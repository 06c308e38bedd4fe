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

from types import MappingProxyType

import torch
import torch.distributed as dist

SIDES = MappingProxyType({"torch": ("torch", "gloo"), "overlap": ("overlap", "gloo"),
                          "overlap_ring": ("overlap", "pipelib"), "after": ("buckets", "gloo"),
                          "step1": ("all_reduce", "gloo")})


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


def versus_steps(sides, config, steps, batch, bucket_bytes, seed):
    """On every rank: each side one step in turn, `steps` + 1 times (the first is not timed:
    `pipelib.runtime.alternate.alternate_steps`)."""
    from pipelib.data_parallel.steps import DDP_STEPS
    from pipelib.recipe import build_model, global_batch, loss_of
    from pipelib.runtime.alternate import alternate_steps
    from pipelib.runtime.device import current
    from pipelib.runtime.place import to_rank_device

    n, r = dist.get_world_size(), dist.get_rank()
    models = {s: to_rank_device(build_model(config, seed)) for s in sides}
    wrapped = {s: DDP_STEPS[SIDES[s][0]].wrap(models[s], None, comm=SIDES[s][1], bucket_bytes=bucket_bytes)
               for s in sides}
    opts = {s: torch.optim.Adam(models[s].parameters(), lr=1e-3) for s in sides}
    seen = dict.fromkeys(sides, 0)  # each side's k-th step trains on step k's rows

    def side(s):
        def step():
            x, y = global_batch(config, batch * n, seen[s], seed)
            seen[s] += 1
            loss = loss_of(wrapped[s], *to_rank_device((x[r * batch:(r + 1) * batch], y[r * batch:(r + 1) * batch])))
            wrapped[s].backward(loss)
            wrapped[s].finish_gradients()
            opts[s].step()
            opts[s].zero_grad(set_to_none=False)
        return step
    times = alternate_steps({s: side(s) for s in sides}, steps, warmup=1)
    ref = dict(models["torch"].named_parameters())
    diff = {s: max((p - ref[name]).abs().max().item() for name, p in models[s].named_parameters())
            for s in sides if s != "torch"}
    for s in sides:
        wrapped[s].close()
    current().tracer.clear()  # the race's events are not a figure
    return {"times": times, "max_param_diff": diff}
