"""The one pipeline executor: it runs any schedule and never asks which one it is.

    stages = [Stage(module, s, S) for s, module in my_stages]         # this rank's stages
    loss = execute(schedule, stages, batch, targets, F.cross_entropy, group)

`execute` walks this rank's actions (`pipelib.pipeline.schedules`) in order. Who sends what to whom
follows from the actions: the F of stage s sends its output activation ("act", microbatch
bytes x width) to the rank of stage s+1; the B or I of stage s sends the gradient of its input
("grad", the same shape) to the rank of stage s-1; W sends nothing. Three rules make any schedule
that `validate` accepts run without deadlock (DESIGN.md section 6):

1. sends are non-blocking (`comms.isend`); their handles are kept until the step ends (a gloo
   send whose handle is dropped crashes, and a blocking send deadlocks 1F1B: FACTS.md);
2. a receive blocks just before the compute that needs it, and nowhere else (it is *posted*
   earlier, `recv_ahead` receives ahead, so its bytes flow while this rank computes);
3. a neighbouring stage on the same rank (interleaved and V placements) is handed its input
   locally, without a message.

Messages carry a tag per (kind, sending stage): activations and gradients travel in separate
queues, so V schedules (ZB-V, DualPipeV), whose activations and gradients between two ranks are
interleaved differently on the two sides, need no reordering (validate(order="kind")). Under
NCCL's rules, which have no tags, each rank takes a peer's messages in the order that peer sends
them and posts each receive just before its compute (`pipelib.pipeline.messages`).

Before the step, each rank learns the shapes of the messages it will receive
(`pipelib.pipeline.shapes`). `execute` checks its arguments, then `_run` walks the actions and
a `StepMessages` holds the step's messages: receives posted ahead, sends in flight, local handovers.

On a simulated device with a virtual clock and `costs`, DualPipeV's F&B (`Costs.overlaps`) runs
as one overlapped pair: both inputs taken, both computed in turn, the collectives inside them (an
MoE layer's all-to-alls, chapter 16) timed on a communication lane (DualPipe's second stream,
chapter 07's lane); the pair lasts max(F + B, the lane's time), split as `simulate` splits it.

Introduced in chapter 10; chapters 11-13 run GPipe, 1F1B, interleaved and zero-bubble
schedules through this same function.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

from pipelib.checks import check_int
from pipelib.comm import p2p as comms
from pipelib.pipeline.messages import StepMessages
from pipelib.pipeline.schedules import Op, Schedule, validate
from pipelib.pipeline.shapes import cached_shapes
from pipelib.runtime.clocks import VirtualClock
from pipelib.runtime.device import current

__all__ = ["execute"]


@functools.lru_cache(maxsize=64)
def _validated(s: Schedule) -> Schedule:
    """`validate` once per Schedule (a frozen, hashable value): a training loop repeats it."""
    return validate(s, order="kind")


def _chunks(t: torch.Tensor, m: int, what: str, copy: bool) -> list[torch.Tensor]:
    """Split along dim 0 into m equal microbatches: views, or with copy=True each its own
    storage (a device that counts saved activations would count a shared storage once)."""
    if t is None:
        raise ValueError(f"execute: this rank holds a stage that needs the {what}; pass it")
    if t.shape[0] % m:
        raise ValueError(f"{what} of {t.shape[0]} rows cannot be split into m={m} equal "
                         f"microbatches; use a batch size that is a multiple of m")
    return [c.clone() for c in t.chunk(m)] if copy else list(t.chunk(m))


def _run(io: StepMessages, mine: dict, xs, ys, loss_fn: Callable, costs, dev,
         stage_done: Callable | None = None) -> tuple[list, int]:
    """Run this rank's actions in order: (the last stage's microbatch losses, peak activation bytes
    above the step's start); `stage_done(stage)` once a stage's m-th B or W is in."""
    m, ahead, post, take, give = io.s.num_microbatches, io.ahead, io.post, io.take, io.give
    base, peak, losses = dev.memory.bytes["activations"], 0, []
    weights_left = dict.fromkeys(mine, m)  # B or W actions still to run, by stage
    overlap = costs is not None and dev.modelled and dev.clock.virtual  # pairs overlap on a virtual clock

    def prepare(a):  # take the action's input (blocking, outside its compute); the math to run
        st, j = mine[a.stage], a.microbatch
        if a.op is Op.F:
            x = xs[j] if st.is_first else take("act", a.stage - 1, a)
            return lambda: st.forward(j, x, ys[j] if st.is_last else None, loss_fn, 1.0 / m)
        if a.op is Op.W:
            return lambda: st.backward_weight(j)
        grad = None if st.is_last else take("grad", a.stage + 1, a)
        return lambda: st.backward(j, grad) if a.op is Op.B else st.backward_input(j, grad)

    def deliver(a, out):
        st, j = mine[a.stage], a.microbatch
        if a.op is Op.F and st.is_last:
            losses.append(out)
        elif a.op is not Op.W and (a.op is Op.F or not st.is_first):
            give("act" if a.op is Op.F else "grad", a.stage, j, out)
        if a.op in (Op.B, Op.W):
            weights_left[a.stage] -= 1
            if weights_left[a.stage] == 0 and stage_done is not None:
                stage_done(a.stage)
    acts, i = io.acts, 0
    while i < len(acts):
        post(ahead)  # the next receives flow while this action computes
        a, b = acts[i], acts[i + 1] if i + 1 < len(acts) else None
        if overlap and costs.overlaps(a, b):  # DualPipeV's F&B pair (module docstring)
            run_f, run_b, t0 = prepare(a), prepare(b), dev.clock.now()
            with dev.lane(VirtualClock(t0)) as lane:  # their all-to-alls: the communication lane
                outs = run_f(), run_b()
            peak = max(peak, dev.memory.bytes["activations"] - base)
            for act, out, seconds in zip((a, b), outs, costs.pair_times(a.stage, b.stage, lane.now() - t0)):
                with dev.compute(act.op.value, stage=act.stage, microbatch=act.microbatch, duration=seconds):
                    pass
                deliver(act, out)
            i += 2
            continue
        run = prepare(a)
        with dev.compute(a.op.value, stage=a.stage, microbatch=a.microbatch,
                         duration=None if costs is None else costs.compute(a.op, a.stage)):
            out = run()
        peak = max(peak, dev.memory.bytes["activations"] - base)
        deliver(a, out)
        i += 1
    return losses, peak


def _my_stages(s: Schedule, stages, rank: int, size: int) -> dict | None:
    """{stage: Stage} of this rank, checked against the schedule; None for a rank it leaves out."""
    if size < s.num_ranks:
        raise ValueError(f"schedule {s.name!r} needs {s.num_ranks} ranks but the group has {size}")
    if rank >= s.num_ranks:
        return None
    stages = list(stages.values()) if isinstance(stages, dict) else list(stages)
    mine = {st.index: st for st in stages}
    want = s.stages_of(rank)
    if sorted(mine) != list(want) or any(st.num_stages != s.num_stages for st in stages):
        raise ValueError(f"rank {rank} runs stages {list(want)} of {s.num_stages} in schedule "
                         f"{s.name!r} but was given {[f'{st.index} of {st.num_stages}' for st in stages]}")
    return mine


# ----------------------------------------------------------------------------- the executor
def execute(schedule: Schedule, stages, batch, targets, loss_fn: Callable, group=None, *,
            costs=None, stats: dict | None = None, shapes: dict | None = None,
            recv_ahead: int = 2, check: bool = False, stage_done: Callable | None = None):
    """Run this rank's actions of `schedule` once: one training step's forward and backward.

    `stages`: this rank's `Stage`s (those `schedule.stages_of(rank)` names). `batch` is needed
    on the rank of stage 0 and `targets` on the rank of the last stage (None elsewhere); both
    are split into `schedule.num_microbatches` microbatches along dim 0. Each microbatch's loss
    is scaled by 1/m, so the returned loss is the mean over microbatches and the gradients equal
    the whole batch's. Gradients accumulate into the parameters' .grad (zero them between steps).

    `group`: the schedule's ranks are ranks 0..n-1 of `group`; its other ranks have no work.
    `costs` (a `pipelib.pipeline.simulate.Costs`): give each op that modelled duration on a simulated
    device, so the timeline can be compared with `simulate`; without it, FLOPs are counted.
    `stats`, if a dict, receives peak_activation_bytes (this rank's saved activations at their
    most; None on a device that does not count them: `DeviceSpec.track_memory`), messages and
    bytes_sent.
    `shapes`, if a dict, keeps the shape handshake's result between steps of the same stages:
    the first call fills it, later calls skip the handshake (torch.distributed.pipelining
    likewise infers shapes once per schedule object). Pass the same dict only while the batch
    shape and the stages stay the same; the rank of stage 0 checks its microbatch shape, and a
    receive that still gets another shape raises `comms.MessageMismatchError`.
    `recv_ahead`: how many receives beyond the one an action needs are posted before it
    computes, so their bytes flow meanwhile (gloo sends are rendezvous: a message moves only
    once its receive is posted; torch's lowering posts its RECVs early for the same reason).
    0 posts each receive just before the compute that needs it. The default 2 posts the
    next activation and the next gradient of a 1F1B step at once: their senders then write as
    soon as they are done instead of waiting to hear that the receive is up (1F1B on 4 CPU
    engines: 4-8% faster than with 1, bench/pipelines.py).
    `check`: send `comms`' header with every message on real devices too (simulated devices always
    send it: it carries the timestamp). Off by default, the shape handshake agreed every buffer's
    shape: the header costs a message and a wait per transfer (bench/pipelines.py); turn it on
    for stages whose output shape can change.
    `stage_done(stage)`: called once per stage of this rank, as soon as that stage's last weight
    gradient of the step is in (torch's pipelining IR calls this point REDUCE_GRAD): data
    parallelism reduces the stage's gradients there, while later stages still compute.

    Returns the loss (a 0-dim tensor) on the rank of the last stage, None elsewhere.
    """
    # identical on every rank, so a bad schedule fails everywhere; validated once per Schedule
    s = _validated(schedule) if isinstance(schedule, Schedule) else validate(schedule, order="kind")
    check_int(recv_ahead, "recv_ahead", minimum=0, hint="receives posted ahead")
    rank = dist.get_rank(group)
    mine = _my_stages(s, stages, rank, dist.get_world_size(group))
    if mine is None:
        return None
    m, dev = s.num_microbatches, current()
    copy = dev.memory.track_activations
    xs = _chunks(batch, m, "batch", copy) if 0 in mine else None
    ys = _chunks(targets, m, "targets", copy) if s.num_stages - 1 in mine else None
    in_spec, out_spec = cached_shapes(s, mine, rank, group, xs[0] if xs else None, shapes)
    # receive buffers: kept with the shapes between steps (as torch's stages do): a step allocates none
    bufs = {} if shapes is None else shapes.setdefault(("buffers", s, rank), {})
    io = StepMessages(s, rank, group, in_spec, out_spec, bufs, recv_ahead, check)
    losses, peak = _run(io, mine, xs, ys, loss_fn, costs, dev, stage_done)
    comms.wait_all(io.sends)
    if stats is not None:
        stats.update(peak_activation_bytes=peak if dev.memory.track_activations else None,
                     messages=len(io.sends), bytes_sent=sum(h.nbytes for h in io.sends))
    return torch.stack(losses).sum() if losses else None
