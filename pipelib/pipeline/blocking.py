"""A pipeline runner with *blocking* sends: the way not to run 1F1B, kept to be watched failing.

Chapter 12 runs this next to the real executor (`pipelib.pipeline.step.execute`). Both walk a
rank's actions in order and receive each input just before the compute that needs it. The one
difference: here every send is blocking. `comms.send` returns only once the neighbour has posted
the matching receive, because gloo sends are rendezvous (chapter 05).

- GPipe survives it: between two ranks, all activations flow one way, then all gradients the
  other way, and each send finds its receiver already waiting for it.
- 1F1B does not. In its steady state rank r, having run F of microbatch j, sends that
  activation to rank r+1, while rank r+1, having run B of microbatch k < j, sends that gradient
  to rank r. Each waits for the other to receive; neither will: a deadlock, which the cluster
  turns into a `RankTimeoutError` naming each rank and the send it is stuck in.

`execute` posts sends with `comms.isend` and keeps the handles until the step ends, so a rank
goes on to its next receive and the cycle never closes.

Messages: the F of stage s sends its output activation ("act", microbatch rows x width x 4
bytes in float32) to rank s+1; the B of stage s sends the gradient of its input ("grad", the
same shape) to rank s-1. One stage per rank (plain schedules: naive, GPipe, 1F1B).

Introduced in chapter 12.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipelib.comm import p2p as comms
from pipelib.pipeline.schedules import Op, Schedule, validate
from pipelib.pipeline.stage import Stage, partition, split_into_stages
from pipelib.results import StepResult
from pipelib.runtime.device import current
from pipelib.runtime.place import to_rank_device

__all__ = ["check_blocking", "execute_blocking", "stage_input_shapes", "train_step_blocking"]

ACT, GRAD = 0, 1  # message tags: activations and gradients travel in separate queues


def stage_input_shapes(modules, x: torch.Tensor) -> list[tuple[int, ...]]:
    """The input shape of every stage for a microbatch `x`, found by running all stages once.

    Every rank builds the whole model here (same seed), so it can work out locally the shape
    of each message it will receive; `pipelib.pipeline.step` asks the previous rank instead.
    """
    shapes = []
    with torch.no_grad():
        for module in modules:
            shapes.append(tuple(x.shape))
            x = module(x)
    return shapes


def check_blocking(schedule) -> Schedule:
    """`validate`, and one stage per rank with F and B only; a ValueError before any message."""
    s = validate(schedule)
    if s.num_stages != s.num_ranks:
        raise ValueError(f"execute_blocking runs one stage per rank; schedule {s.name!r} has "
                         f"{s.num_stages} stages on {s.num_ranks} ranks; run it with "
                         f"pipelib.pipeline.step.execute")
    split = sorted({str(a) for acts in s.actions for a in acts if a.op not in (Op.F, Op.B)})
    if split:
        raise ValueError(f"execute_blocking runs F and B only; schedule {s.name!r} has "
                         f"{split[:4]} (split backwards: chapter 13, pipelib.pipeline.step.execute)")
    return s


def _duration(costs, a):
    return None if costs is None else costs.compute(a.op, a.stage)


def execute_blocking(schedule: Schedule, stage: Stage, batch, targets, loss_fn: Callable,
                     shapes: list[tuple[int, ...]], group=None, *, costs=None):
    """Run this rank's actions with blocking receives *and blocking sends*; returns the loss.

    `stage` is this rank's only stage (stage r on rank r); `shapes[s]` is stage s's input shape
    for one microbatch (`stage_input_shapes`). `batch` is needed on rank 0, `targets` on the
    last rank. Each microbatch's loss is scaled by 1/m, as in `execute`. `costs` (a
    `pipelib.pipeline.simulate.Costs`) gives each op its modelled duration on a simulated device.
    """
    s = check_blocking(schedule)
    rank = dist.get_rank(group)
    if not 0 <= rank < s.num_ranks:
        return None
    m, dev, losses = s.num_microbatches, current(), []
    xs = batch.chunk(m) if stage.is_first else None
    ys = targets.chunk(m) if stage.is_last else None
    for a in s.actions[rank]:
        j = a.microbatch
        if a.op is Op.F:
            x = xs[j] if stage.is_first else comms.recv(
                torch.empty(shapes[rank], device=dev.torch_device), rank - 1, group, tag=ACT, label=f"act for {a}",
                stage=rank - 1, microbatch=j)
            with dev.compute("F", stage=rank, microbatch=j, duration=_duration(costs, a)):
                out = stage.forward(j, x, ys[j] if stage.is_last else None, loss_fn, 1.0 / m)
            if stage.is_last:
                losses.append(out)
            else:  # blocks until rank + 1 posts its receive of this activation
                comms.send(out, rank + 1, group, tag=ACT, label=f"act of {a}",
                           stage=rank, microbatch=j)
        elif a.op is Op.B:
            grad = None if stage.is_last else comms.recv(
                torch.empty(shapes[rank + 1], device=dev.torch_device), rank + 1, group, tag=GRAD,
                label=f"grad for {a}", stage=rank + 1, microbatch=j)
            with dev.compute("B", stage=rank, microbatch=j, duration=_duration(costs, a)):
                gin = stage.backward(j, grad)
            if not stage.is_first:  # blocks until rank - 1 posts its receive of this gradient
                comms.send(gin, rank - 1, group, tag=GRAD, label=f"grad of {a}",
                           stage=rank, microbatch=j)
    return torch.stack(losses).sum() if losses else None


def train_step_blocking(schedule: Schedule, model_config, batch_seed: int = 0, *,
                        batch_size: int | None = None, model_seed: int = 0, costs=None,
                        group=None) -> StepResult | None:
    """Run on every engine: `pipelib.pipeline.step.train_step`, but through `execute_blocking`.

    Returns a `StepResult`: loss or None, {monolith parameter name: gradient} for this rank's
    stage.
    """
    from pipelib.model import MLP
    from pipelib.batches import global_batch

    s = check_blocking(schedule)
    batch_size = batch_size or 2 * s.num_microbatches
    if batch_size % s.num_microbatches:
        raise ValueError(f"batch_size={batch_size} cannot be split into m={s.num_microbatches} "
                         f"equal microbatches; use a multiple of {s.num_microbatches}")
    rank = dist.get_rank(group)
    if not 0 <= rank < s.num_ranks:
        return None
    model = MLP(model_config, seed=model_seed)
    bounds = partition(len(model.layers), s.num_stages)
    modules = split_into_stages(model.layers, s.num_stages)
    x, y = global_batch(model_config, batch_size, 0, batch_seed)
    shapes = stage_input_shapes(modules, x.chunk(s.num_microbatches)[0])
    stage = Stage(to_rank_device(modules[rank]), rank, s.num_stages)  # shapes probed on the CPU, then moved
    x, y = to_rank_device((x, y))
    loss = execute_blocking(s, stage, x, y, F.cross_entropy, shapes, group, costs=costs)
    first = bounds[rank].start
    grads = {}
    for name, prm in stage.module.named_parameters():
        k, _, rest = name.partition(".")
        grads[f"layers.{first + int(k)}.{rest}"] = prm.grad
    return StepResult(loss, grads)
