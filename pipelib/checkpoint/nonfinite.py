"""A NaN or an Inf on one rank: every rank agrees to skip the step before anyone steps.

    if not agree_finite(par, group):     # every rank of the grid, after the backward
        opt.zero_grad(); continue        # the step is skipped everywhere, or nowhere

A non-finite gradient on one rank (an overflow, a bad row, a flipped bit after the reduction)
must not be stepped by that rank alone: its replica would leave the others for good (DDP's
ranks must stay equal), and a shard stepped by some ZeRO ranks and not others is a model
nobody trained. Each rank checks what it holds and one all-reduce of a single flag (MIN over
the grid: 4 bytes) gives every rank the same verdict, so all skip or none does, as Megatron-LM's
`found_inf` all-reduce and torch's `GradScaler` do for fp16 overflows.

`poison(par)` injects the failure: a NaN into this rank's first gradient. Supported where the
gradients are the parameters' own (`p.grad`: no data parallelism, or DDP); ZeRO reduces into
its own shards at its step, so a skip there needs ZeRO's help (refused with a clear error).
Introduced in chapter 18.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _check_supported(par) -> None:
    if any(getattr(r, "zero", None) is not None for r in par.reducers):
        raise ValueError(f"agree_finite: {par.plan} keeps its reduced gradients inside ZeRO until its step; "
                         f"skipping a step needs ZeRO to drop them: use data_parallel='ddp' here")


def local_finite(par) -> bool:
    """Whether every gradient this rank holds is finite."""
    return all(bool(torch.isfinite(p.grad).all()) for p in par.parameters() if p.grad is not None)


def agree_finite(par, group=None) -> bool:
    """The same answer on every rank of `group` (default the world): True when every rank's
    gradients are finite. One all-reduce (MIN) of one flag; raw gloo, off the trace."""
    _check_supported(par)
    flag = torch.tensor([1 if local_finite(par) else 0], dtype=torch.int32, device=par.mesh.dev.torch_device)
    if dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


@torch.no_grad()
def poison(par) -> None:
    """Inject a NaN into the first element of this rank's first gradient (a failure on one rank)."""
    _check_supported(par)
    for p in par.parameters():
        if p.grad is not None:
            p.grad.view(-1)[0] = float("nan")
            return
