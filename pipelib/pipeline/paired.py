"""1F1B with *paired* messages: a send and a receive posted together in one `batch_isend_irecv`.

This is how picotron and Megatron run 1F1B (picotron's `bidirectional_pipeline_communicate`).
In the steady state rank r, after the forward of microbatch w+i, posts the send of that
activation to rank r+1 *together with* the receive of the gradient it needs next from rank r+1,
and waits for both; after the backward it posts the send of the input gradient to rank r-1
together with the receive of the next activation from rank r-1. The neighbour does the mirror
image, so two crossing messages are one exchange, never two sends waiting for each other
(the deadlock of `pipelib.pipeline.blocking`).

`mode="serial"` does the same exchanges one message at a time with *blocking* calls, in the
classic odd-even order (even ranks send first, odd ranks receive first), which also never
deadlocks: each message's time is paid on its own. Chapter 12 times both against the executor
(`pipelib.pipeline.step.execute`), which posts every send and waits nothing until it must.

Messages: activations on tag ACT, gradients on tag GRAD, one stage per rank; the order of
computes is `one_f_one_b(p, m)`'s, action for action.

Introduced in chapter 12.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipelib.comm import p2p as comms
from pipelib.pipeline.blocking import ACT, GRAD, stage_input_shapes
from pipelib.pipeline.schedules import Action, Op, one_f_one_b
from pipelib.pipeline.stage import Stage, partition, split_into_stages
from pipelib.results import StepResult
from pipelib.runtime.device import current
from pipelib.runtime.place import to_rank_device

__all__ = ["PAIRED_MODES", "Msg", "paired_program", "pipe_exchange", "execute_paired",
           "predict_paired", "train_step_paired"]

PAIRED_MODES = ("paired", "serial")


@dataclass(frozen=True)
class Msg:
    """One message of a rank's program: "send" or "recv", "act" or "grad", of microbatch j."""

    op: str
    kind: str
    peer: int
    microbatch: int


def paired_program(p: int, m: int, rank: int, mode: str = "paired") -> list:
    """Rank `rank`'s 1F1B as data: Actions (F j, B j) and talks (tuples of `Msg`, posted together).

    picotron's order: warm-up forwards (receive, F, send), one receive, then per steady step
    F, [send act, receive grad], B, [send grad, receive next act]; then the cool-down backwards.
    With mode="serial" every talk is split into one-message talks, even ranks sending first."""
    if mode not in PAIRED_MODES:
        raise ValueError(f"paired_program: mode must be one of {PAIRED_MODES}, got {mode!r}")
    one_f_one_b(p, m)  # checks p and m
    first, last = rank == 0, rank == p - 1
    warmup, prog = min(p - 1 - rank, m), []

    def talk(*msgs):
        msgs = [x for x in msgs if x is not None]
        if mode == "serial":
            msgs.sort(key=lambda x: (x.op == "send") != (rank % 2 == 0))
            prog.extend((x,) for x in msgs)
        elif msgs:
            prog.append(tuple(msgs))

    def act(op, j):
        return None if (first if op == "recv" else last) else Msg(op, "act", rank + (1 if op == "send" else -1), j)

    def grad(op, j):
        return None if (last if op == "recv" else first) else Msg(op, "grad", rank + (-1 if op == "send" else 1), j)

    for j in range(warmup):                       # warm-up: F only, one message each
        talk(act("recv", j))
        prog.append(Action(rank, Op.F, j))
        talk(act("send", j))
    steady = m - warmup
    if steady:
        talk(act("recv", warmup))
    for i in range(steady):                       # steady state: F, exchange, B, exchange
        prog.append(Action(rank, Op.F, warmup + i))
        talk(act("send", warmup + i), grad("recv", i))
        prog.append(Action(rank, Op.B, i))
        talk(grad("send", i), act("recv", warmup + i + 1) if i + 1 < steady else None)
    for j in range(steady, m):                    # cool-down: B only, one message each
        talk(grad("recv", j))
        prog.append(Action(rank, Op.B, j))
        talk(grad("send", j))
    return prog


def pipe_exchange(ops: list[comms.P2POp], mode: str = "paired") -> None:
    """Post `ops` as one `batch_isend_irecv` and wait for all ("paired"), or run each as a
    blocking call, in order ("serial"). Received tensors are filled in place."""
    if mode == "paired":
        comms.wait_all(comms.batch_isend_irecv(ops))
        return
    for o in ops:
        (comms.send if o.op == "send" else comms.recv)(o.tensor, o.peer, o.group, tag=o.tag,
                                                       label=o.label or o.op)


def execute_paired(p: int, m: int, stage: Stage, batch, targets, loss_fn: Callable,
                   shapes: list[tuple[int, ...]], group=None, *, costs=None,
                   mode: str = "paired"):
    """Run this rank's `paired_program`; returns the loss on the last rank, else None.

    Like `pipelib.pipeline.blocking.execute_blocking` (same arguments, one stage per rank):
    `shapes[s]` is stage s's input shape for one microbatch, `costs` gives each op its modelled
    duration on a simulated device."""
    rank, dev = dist.get_rank(group), current()
    first, last = rank == 0, rank == p - 1
    xs = batch.chunk(m) if first else None
    ys = targets.chunk(m) if last else None
    losses, held = [], {}   # held: (kind, direction, microbatch) -> tensor

    def tensor(x: Msg):
        if x.op == "send":
            return held.pop((x.kind, "out", x.microbatch))
        shape = shapes[rank] if x.kind == "act" else shapes[rank + 1]
        return held.setdefault((x.kind, "in", x.microbatch), torch.empty(shape, device=dev.torch_device))

    for item in paired_program(p, m, rank, mode):
        if not isinstance(item, Action):
            pipe_exchange([comms.P2POp(x.op, tensor(x), x.peer, group, ACT if x.kind == "act" else GRAD,
                                       f"{x.kind} {x.op} mb {x.microbatch}") for x in item], mode)
            continue
        j, dur = item.microbatch, None if costs is None else costs.compute(item.op, rank)
        with dev.compute(item.op.name, stage=rank, microbatch=j, duration=dur):
            if item.op is Op.F:
                x = xs[j] if first else held.pop(("act", "in", j))
                out = stage.forward(j, x, ys[j] if last else None, loss_fn, 1.0 / m)
            else:
                out = stage.backward(j, None if last else held.pop(("grad", "in", j)))
        if item.op is Op.F and last:
            losses.append(out)
        elif out is not None:
            held["act" if item.op is Op.F else "grad", "out", j] = out
    return torch.stack(losses).sum() if losses else None


def predict_paired(p: int, m: int, costs, mode: str = "paired") -> list[float]:
    """Each rank's end time for `execute_paired` on a simulated device with the virtual clock.

    The clock's rules (`pipelib.comm.message`): a message posted at t arrives at t + T (T =
    `costs.message()`); waiting a send ends at t + T, waiting a receive at max(now, arrival);
    a talk posts all its messages, then waits for all of them."""
    progs = [paired_program(p, m, r, mode) for r in range(p)]
    clock, pc, posted = [0.0] * p, [0] * p, {}   # posted: (src, kind, microbatch) -> time
    t_msg = costs.message()
    while any(pc[r] < len(progs[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pc[r] < len(progs[r]):
                item = progs[r][pc[r]]
                if isinstance(item, Action):
                    clock[r] += costs.compute(item.op, r)
                else:
                    for x in item:
                        if x.op == "send":
                            posted.setdefault((r, x.kind, x.microbatch), clock[r])
                    recvs = [posted.get((x.peer, x.kind, x.microbatch)) for x in item if x.op == "recv"]
                    if None in recvs:
                        break
                    sends = [clock[r] + t_msg for x in item if x.op == "send"]
                    clock[r] = max([clock[r]] + sends + [t + t_msg for t in recvs])
                pc[r] += 1
                moved = True
        if not moved:  # pragma: no cover - the program is deadlock-free
            raise RuntimeError(f"predict_paired: stuck at {pc}")
    return clock


def train_step_paired(p: int, m: int, model_config, batch_seed: int = 0, *,
                      batch_size: int | None = None, model_seed: int = 0, costs=None,
                      mode: str = "paired", group=None) -> StepResult | None:
    """Run on every engine: one 1F1B training step through `execute_paired`; a `StepResult`
    (loss or None, {monolith parameter name: gradient} for this rank's stage)."""
    from pipelib.model import MLP
    from pipelib.batches import global_batch

    one_f_one_b(p, m)  # checks p and m
    batch_size = batch_size or 2 * m
    if batch_size % m:
        raise ValueError(f"batch_size={batch_size} cannot be split into m={m} equal "
                         f"microbatches; use a multiple of {m}")
    rank = dist.get_rank(group)
    if not 0 <= rank < p:
        return None
    model = MLP(model_config, seed=model_seed)
    bounds = partition(len(model.layers), p)
    modules = split_into_stages(model.layers, p)
    x, y = global_batch(model_config, batch_size, 0, batch_seed)
    shapes = stage_input_shapes(modules, x.chunk(m)[0])
    stage = Stage(to_rank_device(modules[rank]), rank, p)  # shapes probed on the CPU, then moved
    x, y = to_rank_device((x, y))
    loss = execute_paired(p, m, stage, x, y, F.cross_entropy, shapes, group, costs=costs,
                          mode=mode)
    grads = {}
    for name, prm in stage.module.named_parameters():
        k, _, rest = name.partition(".")
        grads[f"layers.{bounds[rank].start + int(k)}.{rest}"] = prm.grad
    return StepResult(loss, grads)
