"""A NaN or an Inf on one rank: every rank agrees to skip the step before anyone steps.

    if not agree_finite(par, group):     # every rank of the grid, after the backward
        skip_step(par, opt)              # the step is skipped everywhere, or nowhere

A non-finite gradient on one rank (an overflow, a bad row, a flipped bit after the reduction)
must not be stepped by that rank alone: its replica would leave the others for good (DDP's
ranks must stay equal), and a shard stepped by some ZeRO ranks and not others is a model
nobody trained. Each rank checks what it holds and one all-reduce of a single flag (MIN over
the grid: 4 bytes) gives every rank the same verdict, so all skip or none does, as Megatron-LM's
`found_inf` all-reduce and torch's `GradScaler` do for fp16 overflows.

What a rank checks is what its optimizer would read: the parameters' own gradients (`p.grad`:
no data parallelism, or DDP after its all-reduce), or under ZeRO the averaged shard of every
unit (`ZeRO.reduce_gradients` runs the stage's reduction first: a NaN on one rank lands in the
shard of the rank that owns those elements, so the others see finite numbers and only the flag
tells them). A skip under ZeRO drops the reduced shards (`ZeRO.skip_step`), so the next step
starts from zero gradients as after a real step.

`poison(par)` injects the failure: a NaN into this rank's first gradient (under ZeRO its own
gradient buffer before the reduction: stages 0-1 the full flat gradients, stages 2-3 its
reduced shard). Introduced in chapter 18.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.checkpoint.state import zero_wrappers


def held_gradients(par) -> list[torch.Tensor]:
    """The gradients this rank's optimizer would read at this step (ZeRO: reduced first)."""
    zeros = zero_wrappers(par)
    for zero in zeros:
        zero.reduce_gradients()  # the stage's collective: every rank of its group runs it here
    mine = [u.master.grad for zero in zeros for u in zero.units if u.master.grad is not None]
    sharded = {id(p) for zero in zeros for u in zero.units for _, p in u.params}
    return mine + [p.grad for p in par.parameters() if p.grad is not None and id(p) not in sharded]


def local_finite(par) -> bool:
    """Whether every gradient this rank's optimizer would read is finite."""
    return all(bool(torch.isfinite(g).all()) for g in held_gradients(par))


def agree_finite(par, group=None) -> bool:
    """The same answer on every rank of `group` (default the world): True when every rank's
    gradients are finite. One all-reduce (MIN) of one flag; raw gloo, off the trace."""
    flag = torch.tensor([1 if local_finite(par) else 0], dtype=torch.int32, device=par.mesh.dev.torch_device)
    if dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def skip_step(par, opt) -> None:
    """Every rank, when `agree_finite` said no: no optimizer step, this step's gradients dropped."""
    for zero in zero_wrappers(par):
        zero.skip_step()
    opt.zero_grad(set_to_none=False)


@torch.no_grad()
def poison(par) -> None:
    """Inject a NaN into the first element of this rank's first gradient (a failure on one rank)."""
    for zero in zero_wrappers(par):
        u = zero.units[0]
        (u.gflat if zero.stage <= 1 else u.gshard).view(-1)[0] = float("nan")
        return
    for p in par.parameters():
        if p.grad is not None:
            p.grad.view(-1)[0] = float("nan")
            return
