"""One A/B timing loop: several ways of doing one step, run in turn, with one definition of a
step's time.

    times = alternate_steps({"pipelib": mine, "torch": theirs}, steps=10, warmup=1, group=g)

On a shared machine the load drifts from second to second, so timing one side for a few
seconds, then the other, compares two different machines. Here every side runs one step in
turn, the order rotating from step to step, so a drift hits all of them alike. A step starts
from a barrier on `group`, and its time is the slowest rank's (a MAX all-reduce of each rank's
time once its clock stopped): the step is over when its last rank is. Time is the host's wall
clock, after the GPU's queue drained on CUDA: an A/B race compares real implementations, and a
built-in twin has no modelled time on a simulated device (the book's modelled timelines come
from `Device.measure` instead). The bench reports the median of per-step ratios.

The twins (DDP against torch's, TP against DTensor, ZeRO against FSDP2, a pipeline against
torch's schedule, ring attention against torch's) and `bench/` time through it.
Introduced in chapter 07.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist


def alternate_steps(sides: Mapping[str, Callable[[], object]], steps: int, *, warmup: int = 1,
                    group=None) -> dict[str, list[float]]:
    """{side: [the slowest rank's seconds for each timed step]}, every side's step run in turn
    `warmup + steps` times (the first `warmup` rounds not timed). Run on every rank of `group`."""
    from pipelib.checks import check_int
    from pipelib.runtime.device import current

    check_int(steps, "steps", context="alternate_steps")
    check_int(warmup, "warmup", minimum=0, context="alternate_steps")
    names = list(sides)
    if not names:
        raise ValueError("alternate_steps: no sides to time; pass {name: step function}")
    dev, times = current(), {name: [] for name in names}
    for i in range(warmup + steps):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            dist.barrier(group=group)
            t0 = time.perf_counter()
            sides[name]()
            if dev.kind == "cuda":
                torch.cuda.synchronize()
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev.torch_device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's step
            if i >= warmup:
                times[name].append(elapsed.item())
    return times
