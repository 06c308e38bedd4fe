"""Predict a schedule's timeline: when each action runs, the bubble, and peak activation memory.

`simulate(schedule, costs)` plays the schedule event by event. Each rank runs its actions in
order; an action starts when its rank is free and its inputs have arrived: the F of stage s
needs the F of stage s-1, the B or I of stage s needs its own F and the B or I of stage s+1, W
needs its own I. A neighbour on another rank adds one message time (p2p); one on the same rank
adds nothing. Messages from one rank to another queue on their link in send order.

The output is a `pipelib.trace.Trace` of the same `Event`s the runtime records (COMPUTE per
action, SEND and TRANSFER per message, RECV_WAIT while a rank waits for a message), so one
figure draws predicted above measured, and the bubble is the idle time on the timeline.

Introduced in chapter 10; the closed forms are derived in chapters 11 to 13.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from pipelib.pipeline.schedules import (
    Action,
    Op,
    Schedule,
    ScheduleDeadlock,
    action_key,
    action_messages,
    as_schedule,
    check_channels,
    check_counts,
    check_placement,
    deadlock_message,
    dependencies,
    schedule_info,
)
from pipelib.trace import Event, Kind, Trace

__all__ = ["Costs", "SimResult", "ScheduleDeadlock", "simulate", "bubble_closed_form"]


@dataclass(frozen=True)
class Costs:
    """Seconds per action of one stage on one microbatch, and per message between ranks.

    Defaults: F=1, B=2 (a backward does twice a forward's FLOPs: input and weight gradients),
    I=W=1 (its two halves), no communication time. `p2p` is seconds per message or a function
    of the message's bytes (e.g. `profile.message_time`). `stage_factor[s]` scales stage s's
    compute (an unbalanced split); `backward_factor[s]`, when given, scales its B, I and W
    instead (a stage can be the slowest forward and another the slowest backward, chapter 10).
    For interleaved schedules the costs are per stage chunk: `costs.scaled(1 / v)` keeps the
    work per rank equal to a plain pipeline's. `all_to_all`: seconds of expert-parallel
    all-to-all (dispatch and combine) in each F, B and I of a chunk, paid serially, except by
    an F followed on its rank by a B of another stage (DualPipeV's overlapped pair): the pair
    takes max(F + B, both one's all-to-alls), each hidden behind the other's compute.
    `all_to_all_backward`: a B's or I's when not F's (chapter 16's MoE exchanges counts too in F).
    """

    F: float = 1.0
    B: float = 2.0
    I: float = 1.0  # noqa: E741
    W: float = 1.0
    p2p: float | Callable[[int], float] = 0.0
    message_bytes: int = 0     # bytes of one activation or gradient sent between stages
    activation_bytes: int = 0  # bytes one stage keeps for backward, per microbatch
    stage_factor: tuple[float, ...] = ()
    backward_factor: tuple[float, ...] = ()
    all_to_all: float = 0.0    # per F, B and I of a chunk (expert parallelism, chapter 13)
    all_to_all_backward: float | None = None  # per B and I, when not all_to_all (chapter 16)

    def __post_init__(self):
        def ok(x):  # NaN and infinity fail too: a makespan of inf, a bubble of nan
            return 0 <= x < float("inf")

        names = (*"FBIW", "all_to_all") + (("all_to_all_backward",) if self.all_to_all_backward is not None else ())
        bad = {k: getattr(self, k) for k in names if not ok(getattr(self, k))}
        bad.update({k: getattr(self, k) for k in ("stage_factor", "backward_factor")
                    if not all(ok(f) for f in getattr(self, k))})
        if not callable(self.p2p) and not ok(self.p2p):
            bad["p2p"] = self.p2p
        if bad:
            raise ValueError(f"Costs must be finite and >= 0 (seconds per op, per message), got {bad}")

    def compute(self, op: Op, stage: int) -> float:
        op = Op(op)
        factors = self.backward_factor if op is not Op.F and self.backward_factor else self.stage_factor
        scale = factors[stage] if stage < len(factors) else 1.0
        return getattr(self, op.value) * scale

    def exchange(self, op: Op) -> float:
        """Seconds of all-to-all in one action of kind `op`: F's, B's and I's, none in W."""
        op, back = Op(op), self.all_to_all_backward
        return 0.0 if op is Op.W else self.all_to_all if op is Op.F or back is None else back

    def serial(self, op: Op, stage: int) -> float:
        """An action's time on its own: compute plus its all-to-all (none for W)."""
        return self.compute(op, stage) + self.exchange(op)

    def overlaps(self, a, b) -> bool:
        """Whether `a` and the next action on its rank, `b`, are DualPipeV's overlapped pair (an F, a
        B of another stage, an all-to-all to hide): `simulate`'s and the executor's rule."""
        return (a.op is Op.F and b is not None and b.op is Op.B and b.stage != a.stage
                and self.exchange(Op.F) + self.exchange(Op.B) > 0)

    def pair_times(self, f_stage: int, b_stage: int, exchange: float | None = None) -> tuple[float, float]:
        """(F's share, B's share) of an overlapped pair: together max(F + B, the two actions'
        all-to-all, or `exchange` seconds of it when measured), split in proportion to compute."""
        fc, bc = self.compute(Op.F, f_stage), self.compute(Op.B, b_stage)
        total = max(fc + bc, self.exchange(Op.F) + self.exchange(Op.B) if exchange is None else exchange)
        return (f := total * fc / (fc + bc) if fc + bc > 0 else total / 2), total - f

    def message(self) -> float:
        return self.p2p(self.message_bytes) if callable(self.p2p) else float(self.p2p)

    def scaled(self, factor: float) -> Costs:
        """Compute costs times `factor` (activation bytes too): one of v chunks is 1/v of a stage."""
        return replace(self, F=self.F * factor, B=self.B * factor, I=self.I * factor,
                       W=self.W * factor, activation_bytes=int(self.activation_bytes * factor))


@dataclass(frozen=True)
class SimResult:
    """What `simulate` predicts. `events` is a Trace, drawn like a measured one."""

    schedule: Schedule
    costs: Costs
    events: Trace
    makespan: float
    bubble: float                       # idle share of the step: 1 - busy / (ranks * makespan)
    peak_inflight: tuple[int, ...]      # per rank: most (stage, microbatch) activations held
    peak_bytes: tuple[int, ...]         # the same in bytes (costs.activation_bytes each)
    times: Mapping[Action, tuple[float, float]] = field(repr=False)
    memory: tuple[tuple[tuple[float, int], ...], ...] = field(repr=False)  # (time, held) per rank

    @property
    def own_span_idle(self) -> tuple[float, ...]:
        """Per rank: idle time between its own first action's start and last action's end.

        `bubble` counts idle time in the step's span, from the first action on any rank to the
        last: the fill and drain corners included. Qi et al. (2023) count it in each rank's own
        span instead, because with their optimizer post-validation a rank's corners overlap
        the previous and next iterations: ZB-H2 and ZB-V are "zero bubble" in that count.
        """
        first = [float("inf")] * self.schedule.num_ranks
        last, busy = [0.0] * self.schedule.num_ranks, [0.0] * self.schedule.num_ranks
        for a, (start, end) in self.times.items():
            r = self.schedule.stage_to_rank[a.stage]
            first[r], last[r], busy[r] = min(first[r], start), max(last[r], end), busy[r] + end - start
        return tuple(max(0.0, e - s - b) for s, e, b in zip(first, last, busy))

    @property
    def bubble_relative(self) -> float:
        """Idle time over compute time: (p-1)/m for GPipe, where `bubble` is (p-1)/(m+p-1)."""
        return self.bubble / (1.0 - self.bubble) if self.bubble < 1 else float("inf")

    def summary(self, unit: str = "s") -> str:
        """One line: the makespan in `unit` (the costs' own unit: "s", or "F" when every op is
        costed in forward passes, chapter 13), the bubble and the microbatches in flight."""
        s = self.schedule
        return (f"{s.name}: {s.num_ranks} ranks, {s.num_stages} stages, {s.num_microbatches} "
                f"microbatches; makespan {self.makespan:.6g} {unit}, bubble {self.bubble:.1%} "
                f"({self.bubble_relative:.1%} of compute); peak in flight per rank "
                f"{list(self.peak_inflight)}")


class _Sim:
    """The mutable state of one simulation; `simulate` is its only user."""

    def __init__(self, s: Schedule, costs: Costs):
        self.s, self.costs = s, costs
        self.pos = [0] * s.num_ranks
        self.free = [0.0] * s.num_ranks
        self.held = [0] * s.num_ranks
        self.memory = [[(0.0, 0)] for _ in range(s.num_ranks)]
        self.end: dict[tuple, float] = {}
        self.arrival: dict[tuple, float] = {}
        self.link_free: dict[tuple[int, int], float] = {}
        self.times: dict[Action, tuple[float, float]] = {}
        self.events: list[Event] = []

    def inputs_at(self, rank: int, a: Action) -> tuple[float, int | None] | None:
        """When `a`'s inputs are all there (and the rank it last waits for), or None if not yet."""
        t, peer = 0.0, None
        for st, ops, j in dependencies(self.s, a):
            key = next(((st, op, j) for op in ops if (st, op, j) in self.end), None)
            if key is None:
                return None
            if self.s.stage_to_rank[st] == rank:
                t, peer = (self.end[key], None) if self.end[key] > t else (t, peer)
            else:
                arrive = self.arrival[("act" if a.op is Op.F else "grad", st, j)]
                if arrive >= t:
                    t, peer = arrive, self.s.stage_to_rank[st]
        return t, peer

    def run(self, rank: int, a: Action, ready: float, peer: int | None,
            duration: float | None = None) -> None:
        start = max(self.free[rank], ready)
        if peer is not None and start > self.free[rank]:
            self.events.append(Event(rank, Kind.RECV_WAIT, "wait", self.free[rank], start,
                                     stage=a.stage, microbatch=a.microbatch, peer=peer))
        end = start + (self.costs.serial(a.op, a.stage) if duration is None else duration)
        self.held[rank] += {Op.F: 1, Op.B: -1, Op.W: -1}.get(a.op, 0)
        self.memory[rank].append((end, self.held[rank]))
        mem = self.held[rank] * self.costs.activation_bytes if self.costs.activation_bytes else None
        self.events.append(Event(rank, Kind.COMPUTE, a.op.value, start, end, stage=a.stage,
                                 microbatch=a.microbatch, memory=mem))
        for direction, to, msg in action_messages(self.s, rank, a):
            if direction == "send":
                self.send(rank, to, msg, end)
        self.end[action_key(a)], self.free[rank], self.times[a] = end, end, (start, end)

    def send(self, rank: int, to: int, msg: tuple, at: float) -> None:
        nbytes = self.costs.message_bytes
        t0 = max(at, self.link_free.get((rank, to), 0.0))
        t1 = t0 + self.costs.message()
        self.link_free[rank, to] = self.arrival[msg] = t1
        kind, stage, j = msg
        self.events.append(Event(rank, Kind.SEND, kind, at, at, stage=stage, microbatch=j,
                                 bytes=nbytes, peer=to))
        self.events.append(Event(rank, Kind.TRANSFER, kind, t0, t1, stage=stage, microbatch=j,
                                 bytes=nbytes, peer=to))

    def advance(self) -> bool:
        """Run every action whose inputs are known; False when nothing could run."""
        moved = False
        for rank, acts in enumerate(self.s.actions):
            while self.pos[rank] < len(acts):
                a = acts[self.pos[rank]]
                got = self.inputs_at(rank, a)
                if got is None:
                    break
                b = acts[self.pos[rank] + 1] if self.pos[rank] + 1 < len(acts) else None
                pair = self.costs.overlaps(a, b)  # DualPipeV's F&B
                got_b = self.inputs_at(rank, b) if pair else None
                if pair and got_b is None:
                    break
                if pair:  # F and B start together, compute and all-to-all overlap, F's share first
                    f_share, b_share = self.costs.pair_times(a.stage, b.stage)
                    self.run(rank, a, max(got[0], got_b[0]), got[1] if got[0] >= got_b[0] else got_b[1], f_share)
                    self.run(rank, b, self.free[rank], None, b_share)
                else:
                    self.run(rank, a, *got)
                self.pos[rank] += 2 if pair else 1
                moved = True
        return moved


def simulate(schedule, costs: Costs | None = None, *, order: str | None = None) -> SimResult:
    """Play `schedule` under `costs` and return its timeline, bubble and peak memory.

    The schedule's structure is checked first (each (stage, microbatch) forwarded and
    backwarded once, F before B/I before W); pass `order="pair"` or `"kind"` to also check the
    message order as `validate` does. A schedule that gets stuck raises `ScheduleDeadlock`
    naming each blocked rank, the action it waits on and what that waits for.

    Activation memory counts (stage, microbatch) pairs whose F is done and whose backward is
    not: freed at B, or at W when the backward is split. That is an upper bound for zero-bubble
    schedules, where most activations can go at I and only W's inputs stay (Qi et al. 2023).
    """
    s = as_schedule(schedule)
    costs = Costs() if costs is None else costs
    check_placement(s)
    check_counts(s)
    if order is not None:
        check_channels(s, order)
    sim = _Sim(s, costs)
    while sim.advance():
        pass
    if any(p < len(acts) for p, acts in zip(sim.pos, s.actions)):
        raise ScheduleDeadlock(deadlock_message(s, sim.pos))
    trace = Trace(sim.events, world_size=s.num_ranks)
    peaks = tuple(max(n for _, n in mem) for mem in sim.memory)
    return SimResult(
        s, costs, trace, trace.span, trace.bubble_fraction(), peaks,
        tuple(n * costs.activation_bytes for n in peaks), sim.times,
        tuple(tuple(mem) for mem in sim.memory),
    )


def bubble_closed_form(name: str, p: int, m: int, v: int = 1, *, costs: Costs | None = None,
                       relative: bool = False) -> float:
    """The bubble of a named schedule from its formula, for uniform stages and free messages.

    Two ways to state one bubble: as a share of the step, idle / (idle + busy), which is what
    `simulate(...).bubble` measures, and relative to the ideal compute time, idle / busy
    (`relative=True`). Per rank, with t = F + B (costs per chunk for interleaved and ZB-V):

    - naive: share (p-1)/p, relative p-1.
    - gpipe, 1f1b: share (p-1)/(m+p-1), relative (p-1)/m, whatever the ratio of B to F.
    - interleaved_1f1b, looped_bfs: share (p-1)/(v m + p-1), relative (p-1)/(v m). Needs m >= p.
    - zb_h1: idle (p-1) max(F, F+I-W), busy m (F+I+W): with F = I = W a third of 1F1B's.
    - zb_h2, F = I = W: share (p-1)/(3m+p-1) of the step, as ZB-H1's; 0 in each rank's own
      span for m >= 2p-1 (`SimResult.own_span_idle`, the count of Qi et al.). Needs m >= p.
    - zbv, F = I = W: relative (p-1)/(6m) of the step; 0 in each rank's own span for m >= 2p-1.
      Needs m >= 2p.

    Each formula is its schedule's `closed_form` in `pipelib.pipeline.schedules.registry`
    (derivations and citations there); a schedule without one raises a ValueError.
    """
    info = schedule_info(name)
    return info.bubble(p, m, v, Costs() if costs is None else costs, relative=relative)
