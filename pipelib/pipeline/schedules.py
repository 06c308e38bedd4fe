"""Pipeline schedules as data: actions, generators, validation, tables and CSV.

A schedule says, for every rank, the order in which it runs its compute actions. An `Action` is
(stage, op, microbatch), printed `2F0` exactly as `torch.distributed.pipelining` prints its
`_Action`, so its CSV schedules load here and its orders can be compared with ours. Ops: F
(forward), B (full backward), I (backward for the input gradient only) and W (backward for the
weight gradient only); the I/W split is Zero Bubble's (Qi et al. 2023).

Idle slots are never written: when a rank waits is an *output* of `pipelib.pipeline.simulate`, not an
input. Who sends what to whom follows from the actions: the F of stage s sends its output
activation to the rank of stage s+1, the B or I of stage s sends the gradient of its input to the
rank of stage s-1; two stages on the same rank hand over locally and send nothing.

Generators are pure functions of integers (p = num_stages of a plain pipeline = number of ranks,
m = num_microbatches, v = num_chunks of stages per rank). The zero-bubble family lives in
`pipelib.pipeline.schedules_zb` and is re-exported here.

Introduced in chapter 10 (naive), 11 (GPipe), 12 (1F1B, interleaved) and 13 (zero bubble).
"""
from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Mapping


class Op(str, Enum):
    """The compute ops of a pipeline, with torch.distributed.pipelining's letters."""

    F = "F"  # forward
    B = "B"  # full backward: input and weight gradients together
    I = "I"  # backward for the input gradient only (sent to the previous stage)  # noqa: E741
    W = "W"  # backward for the weight gradient only (needs no message: fills bubbles)

    def __str__(self) -> str:
        return self.value


_ACTION_RE = re.compile(r"(\d+)([FBIW])(\d+)")


@dataclass(frozen=True)
class Action:
    """One compute op of one stage on one microbatch, printed `2F0` like torch's `_Action`."""

    stage: int
    op: Op
    microbatch: int

    def __post_init__(self):
        if not isinstance(self.op, Op):
            object.__setattr__(self, "op", Op(self.op))  # Action(2, "F", 0) works too

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{self.microbatch}"

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> "Action":
        """`Action.parse("2F0") == Action(2, Op.F, 0)`; the reverse of `str`."""
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"cannot parse action {text!r}: write [stage][op][microbatch] with op one of "
                f"F, B, I, W, for example '2F0' (stage 2, forward, microbatch 0)"
            )
        stage, op, mb = match.groups()
        return cls(int(stage), Op(op), int(mb))


@dataclass(frozen=True)
class Schedule:
    """A whole schedule: `actions[rank]` is the ordered tuple of that rank's actions.

    `stage_to_rank[stage]` is explicit so looped (interleaved: stage s on rank s % p) and V
    placements (ZB-V, DualPipeV: stage s on rank s, then back down) need no guessing.
    """

    actions: tuple[tuple[Action, ...], ...]
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    name: str = "custom"

    def __post_init__(self):  # accept lists; store tuples so a Schedule is hashable
        object.__setattr__(self, "actions", tuple(tuple(acts) for acts in self.actions))
        object.__setattr__(self, "stage_to_rank", tuple(self.stage_to_rank))

    def __hash__(self) -> int:
        """Hashed once: an executor looks its Schedule up (validation, shapes) every step, and
        hashing every Action of a big schedule again each time shows in the step time."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.actions, self.num_stages, self.num_microbatches, self.stage_to_rank,
                      self.name))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # str hashes differ between processes: never ship the cache
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    @property
    def num_chunks(self) -> int:
        """Stages per rank (v); 1 for a plain pipeline."""
        return self.num_stages // max(1, self.num_ranks)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def as_dict(self) -> dict[int, list[Action]]:
        """The plain form `{rank: [Action, ...]}`."""
        return {rank: list(acts) for rank, acts in enumerate(self.actions)}

    def __str__(self) -> str:
        return format_table(self)


class ScheduleDeadlock(ValueError):
    """Every rank that still has work waits for something no rank will ever produce."""


def as_schedule(schedule, *, num_microbatches: int | None = None, name: str = "custom") -> Schedule:
    """Accept a `Schedule` or a plain `{rank: [actions]}` dict (actions or strings like '0F0').

    For a dict, the stages and microbatches are inferred from the actions and each stage's rank
    from where its actions appear (a stage found on two ranks is an error).
    """
    if isinstance(schedule, Schedule):
        return schedule
    ranks = sorted(schedule)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"a schedule needs ranks 0..n-1 as keys, got {ranks}; add the missing ranks")
    actions = tuple(
        tuple(a if isinstance(a, Action) else Action.parse(a) for a in schedule[r]) for r in ranks
    )
    return _from_actions(actions, num_microbatches=num_microbatches, name=name)


def _from_actions(actions, *, num_microbatches=None, name="custom") -> Schedule:
    owner: dict[int, int] = {}
    for rank, acts in enumerate(actions):
        for step, a in enumerate(acts):
            if owner.setdefault(a.stage, rank) != rank:
                raise ValueError(
                    f"stage {a.stage} appears on rank {owner[a.stage]} and on rank {rank} "
                    f"(step {step}, {a}); a stage lives on one rank\n"
                    + format_table(actions, marks={(rank, step)})
                )
    num_stages = max(owner, default=-1) + 1
    missing = [s for s in range(num_stages) if s not in owner]
    if missing:
        raise ValueError(f"stages {missing} have no actions (stages run 0..{num_stages - 1})")
    if num_microbatches is None:
        num_microbatches = 1 + max((a.microbatch for acts in actions for a in acts), default=-1)
    return Schedule(actions, num_stages, num_microbatches,
                    tuple(owner[s] for s in range(num_stages)), name)


def _check_sizes(name: str, p: int, m: int, v: int | None = None) -> None:
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"{name}: p={p!r} ranks (pipeline stages); pass an integer p >= 1")
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"{name}: num_microbatches m={m!r}; pass an integer m >= 1")
    if v is not None and (not isinstance(v, int) or v < 1):
        raise ValueError(f"{name}: num_chunks v={v!r}; pass an integer v >= 1 (stages per rank)")


def _plain(name: str, p: int, m: int, rank_ops: Callable[[int], list[Action]]) -> Schedule:
    return Schedule(tuple(tuple(rank_ops(r)) for r in range(p)), p, m, tuple(range(p)), name)


# --------------------------------------------------------------------------- generators


def naive(p: int, m: int) -> Schedule:
    """Stop and wait: microbatch j+1 enters only after microbatch j came all the way back.

    Every rank runs F j then B j for j = 0..m-1; the dependencies do the rest, so one rank
    works at a time and the bubble is (p-1)/p whatever m is (chapter 10).
    """
    _check_sizes("naive", p, m)
    return _plain("naive", p, m,
                  lambda r: [Action(r, op, j) for j in range(m) for op in (Op.F, Op.B)])


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): all m forwards, then all m backwards, on every rank.

    Bubble (p-1)/(m+p-1) of the step; every rank holds the activations of all m microbatches
    at the turn. Backwards run in microbatch order 0..m-1, as in torch's ScheduleGPipe.
    """
    _check_sizes("gpipe", p, m)
    return _plain("gpipe", p, m, lambda r: [Action(r, Op.F, j) for j in range(m)]
                  + [Action(r, Op.B, j) for j in range(m)])


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021): same bubble as GPipe, memory of p.

    Rank r runs min(p-r-1, m) warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. It starts backwards as soon as it can, so it holds at
    most min(p-r, m) microbatches' activations (GPipe: m). Same order as torch's Schedule1F1B.
    """
    _check_sizes("one_f_one_b", p, m)

    def rank_ops(r: int) -> list[Action]:
        warmup = min(p - r - 1, m)
        ops = [Action(r, Op.F, j) for j in range(warmup)]
        for j in range(m - warmup):
            ops += [Action(r, Op.F, warmup + j), Action(r, Op.B, j)]
        return ops + [Action(r, Op.B, j) for j in range(m - warmup, m)]

    return _plain("1f1b", p, m, rank_ops)


def _rounds(name: str, p: int, m: int) -> int:
    """Microbatches per round of a looped schedule, with torch's rule (rounds = max(1, m//p))."""
    rounds = max(1, m // p)
    if m % rounds:
        ok = [k for k in range(max(1, m - p), m + p + 1) if k % max(1, k // p) == 0]
        raise ValueError(
            f"{name}: num_microbatches m={m} with p={p} ranks: m must be a multiple of the "
            f"number of rounds max(1, m // p) = {rounds}; choose m among {ok} (any multiple "
            f"of p works, and so does any m <= p)"
        )
    return m // rounds


def _looped_rank_ops(p: int, m: int, v: int, rank: int, *, zero_bubble: bool) -> list[Action]:
    """One rank's actions in the looped depth-first order of Megatron and torch.

    Stage chunk c of rank r is stage c*p + r. Forwards run in rounds of `per_round`
    microbatches per chunk, chunk 0 first; backwards likewise, last chunk first. After the
    warm-up, each forward is followed by one backward. With `zero_bubble` the backward is I and
    the W of the oldest pending I follows it once rank r has done r backwards (torch's ZB1P).
    """
    per_round = m // max(1, m // p)
    hops = 1 if zero_bubble else 2
    warmup = min((v - 1) * per_round + hops * (p - 1 - rank), m * v)
    next_mb: Counter = Counter()
    ops: list[Action] = []
    pending_w: list[int] = []

    def emit(stage: int, op: Op) -> None:
        ops.append(Action(stage, op, next_mb[stage, op]))
        next_mb[stage, op] += 1

    for k in range(warmup):
        emit((k // per_round % v) * p + rank, Op.F)
    for j in range(m * v):
        if warmup + j < m * v:
            emit(((warmup + j) // per_round % v) * p + rank, Op.F)
        stage = (v - 1 - j // per_round % v) * p + rank
        emit(stage, Op.I if zero_bubble else Op.B)
        pending_w.append(stage)
        if zero_bubble and j >= rank:
            emit(pending_w.pop(0), Op.W)
    for stage in pending_w if zero_bubble else []:
        emit(stage, Op.W)
    return ops


def interleaved_1f1b(p: int, m: int, num_chunks: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., SC'21): v = num_chunks stages per rank, looped.

    Stage s lives on rank s % p. Each rank's share of the model is cut into v chunks, so a
    forward costs 1/v as much and the warm-up bubble shrinks by v: (p-1)/(v*m + p-1) of the step
    instead of (p-1)/(m+p-1) once m >= p, for v times more messages. Same order as torch's
    ScheduleInterleaved1F1B, including its accepted m: m must be a multiple of
    max(1, m // p) (so every multiple of p, and every m <= p). With v = 1 this is 1F1B with a
    deeper warm-up of 2(p-1-r) forwards, as in torch.
    """
    _check_sizes("interleaved_1f1b", p, m, num_chunks)
    _rounds("interleaved_1f1b", p, m)
    v = num_chunks
    acts = tuple(tuple(_looped_rank_ops(p, m, v, r, zero_bubble=False)) for r in range(p))
    return Schedule(acts, p * v, m, tuple(s % p for s in range(p * v)), "interleaved_1f1b")


# --------------------------------------------------------------------------- validation


def _messages(s: Schedule, rank: int, a: Action):
    """(direction, peer, message) pairs of action `a` on `rank`: direction 'send' or 'recv'.

    A message is (kind, from_stage, microbatch): 'act' flows from the F of stage s to stage s+1,
    'grad' from the B or I of stage s to stage s-1. Neighbours on the same rank send nothing.
    """
    last, out = s.num_stages - 1, []
    if a.op is Op.F:
        if a.stage > 0 and s.stage_to_rank[a.stage - 1] != rank:
            out.append(("recv", s.stage_to_rank[a.stage - 1], ("act", a.stage - 1, a.microbatch)))
        if a.stage < last and s.stage_to_rank[a.stage + 1] != rank:
            out.append(("send", s.stage_to_rank[a.stage + 1], ("act", a.stage, a.microbatch)))
    elif a.op in (Op.B, Op.I):
        if a.stage < last and s.stage_to_rank[a.stage + 1] != rank:
            out.append(("recv", s.stage_to_rank[a.stage + 1], ("grad", a.stage + 1, a.microbatch)))
        if a.stage > 0 and s.stage_to_rank[a.stage - 1] != rank:
            out.append(("send", s.stage_to_rank[a.stage - 1], ("grad", a.stage, a.microbatch)))
    return out


def dependencies(s: Schedule, a: Action) -> list[tuple[int, tuple[Op, ...], int]]:
    """What `a` needs done first, as (stage, ops, microbatch): any one of `ops` will do.

    F of stage s needs the F of stage s-1; B or I of stage s needs its own F and the B or I of
    stage s+1 (the gradient of its output); W needs its own I.
    """
    st, j = a.stage, a.microbatch
    if a.op is Op.F:
        return [(st - 1, (Op.F,), j)] if st > 0 else []
    if a.op is Op.W:
        return [(st, (Op.I,), j)]
    deps = [(st, (Op.F,), j)]
    return deps + ([(st + 1, (Op.B, Op.I), j)] if st < s.num_stages - 1 else [])


def _ready(s: Schedule, a: Action, done: set) -> tuple | None:
    """The first unmet dependency of `a`, or None when it can run."""
    for st, ops, j in dependencies(s, a):
        if not any((st, op, j) in done for op in ops):
            return st, ops, j
    return None


def _key(a: Action) -> tuple:
    return a.stage, a.op, a.microbatch


def _run_order(s: Schedule, lockstep: bool = False):
    """Play the schedule with unit steps: returns (slots, positions).

    slots[rank] lists (slot, step) of each executed action; positions[rank] is how far the rank
    got (== len(actions[rank]) when it finished). With `lockstep`, a rank runs at most one
    action per slot and sees only what finished in earlier slots (for an aligned table).
    """
    pos, done, slot = [0] * s.num_ranks, set(), 0
    slots: list[list[tuple[int, int]]] = [[] for _ in range(s.num_ranks)]
    while True:
        ran = []
        for r, acts in enumerate(s.actions):
            while pos[r] < len(acts) and _ready(s, acts[pos[r]], done) is None:
                ran.append(acts[pos[r]])
                slots[r].append((slot, pos[r]))
                pos[r] += 1
                if lockstep:
                    break
                done.add(_key(ran[-1]))
        done.update(_key(a) for a in ran)
        if not ran:
            return slots, pos
        slot += 1


def _where(s: Schedule, key: tuple) -> tuple[int, int] | None:
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            if _key(a) == key:
                return r, step
    return None


def deadlock_message(s: Schedule, pos: list[int], what: str = "deadlocks") -> str:
    """Name every blocked rank, the action it waits on and what that action waits for."""
    done = {_key(a) for r, acts in enumerate(s.actions) for a in acts[: pos[r]]}
    lines = [f"schedule {s.name!r} {what}: no rank with work left can make progress"]
    marks = set()
    for r, acts in enumerate(s.actions):
        if pos[r] == len(acts):
            continue
        a = acts[pos[r]]
        st, ops, j = _ready(s, a, done)
        found = [(op, w) for op in ops if (w := _where(s, (st, op, j))) is not None]
        need = " or ".join(f"{st}{op.value}{j}" for op in ([found[0][0]] if found else ops))
        found = [w for _, w in found]
        where = (f"which rank {found[0][0]} has at its step {found[0][1]}, behind where it is "
                 f"stuck (step {pos[found[0][0]]})" if found else "which no rank ever runs")
        lines.append(f"  rank {r} waits at step {pos[r]} on {a}: it needs {need} "
                     f"(stage {st}, on rank {s.stage_to_rank[st]}), {where}")
        marks.add((r, pos[r]))
    lines.append("Reorder the actions so that each one's inputs are produced first.")
    return "\n".join(lines) + "\n\n" + format_table(s, marks=marks)


def _fail(s: Schedule, message: str, marks) -> None:
    raise ValueError(f"schedule {s.name!r}: {message}\n\n" + format_table(s, marks=set(marks)))


def _check_placement(s: Schedule) -> None:
    if len(s.stage_to_rank) != s.num_stages or not all(0 <= r < s.num_ranks for r in s.stage_to_rank):
        raise ValueError(f"schedule {s.name!r}: stage_to_rank={s.stage_to_rank} must give a rank "
                         f"in 0..{s.num_ranks - 1} for each of the {s.num_stages} stages")
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            if not 0 <= a.stage < s.num_stages or not 0 <= a.microbatch < s.num_microbatches:
                _fail(s, f"rank {r} step {step}: {a} is out of range (stages 0..{s.num_stages - 1}, "
                         f"microbatches 0..{s.num_microbatches - 1})", [(r, step)])
            if s.stage_to_rank[a.stage] != r:
                _fail(s, f"rank {r} step {step}: {a} belongs to stage {a.stage}, which lives on "
                         f"rank {s.stage_to_rank[a.stage]}; move it there", [(r, step)])


def _check_counts(s: Schedule) -> None:
    """One F and one backward (B, or I then W) per (stage, microbatch), F before B/I before W."""
    where: dict[tuple, list[tuple[int, int]]] = {}
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            where.setdefault(_key(a), []).append((r, step))
    for st in range(s.num_stages):
        for j in range(s.num_microbatches):
            f, b, i, w = (where.get((st, op, j), []) for op in (Op.F, Op.B, Op.I, Op.W))
            what = f"stage {st} microbatch {j}"
            if len(f) != 1:
                _fail(s, f"{what} has {len(f)} forwards; it needs exactly one {st}F{j}", f)
            if len(b) + len(i) != 1 or len(w) != len(i):
                _fail(s, f"{what} has {len(b)} B, {len(i)} I and {len(w)} W; it needs exactly one "
                         f"backward: one {st}B{j}, or one {st}I{j} followed by one {st}W{j}", b + i + w)
            if (b or i)[0][1] < f[0][1]:
                _fail(s, f"{what} runs its backward before its forward {st}F{j}", (b or i) + f)
            if w and w[0][1] < i[0][1]:
                _fail(s, f"{what} runs {st}W{j} before {st}I{j}: W needs I's output gradient", w + i)


def _describe(msg: tuple) -> str:
    kind, stage, j = msg
    if kind == "act":
        return f"the activation of {stage}F{j} (for stage {stage + 1})"
    return f"the input gradient of stage {stage} microbatch {j} (for stage {stage - 1})"


def _check_channels(s: Schedule, order: str) -> None:
    """Each receiver asks for messages in the order their sender sends them.

    With order="pair", all messages from one rank to another form one queue: point-to-point
    messages between two ranks are matched in the order they are posted (NCCL matches them in
    issue order, whatever the tag), so an executor that posts each receive just before the
    compute that needs it must find them in send order. With order="kind", activations and
    gradients form two queues (an executor that tags them apart, as gloo allows).
    """
    sent: dict[tuple, list] = {}
    recvd: dict[tuple, list] = {}
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            for direction, peer, msg in _messages(s, r, a):
                ch = (r, peer) if direction == "send" else (peer, r)
                ch += (msg[0],) if order == "kind" else ()
                (sent if direction == "send" else recvd).setdefault(ch, []).append((msg, step))
    for ch in sorted(set(sent) | set(recvd)):
        (src, dst), out, inn = ch[:2], sent.get(ch, []), recvd.get(ch, [])
        for k in range(max(len(out), len(inn))):
            if k < len(out) and k < len(inn) and out[k][0] == inn[k][0]:
                continue
            said = f"sends {_describe(out[k][0])} at its step {out[k][1]}" if k < len(out) else "sends nothing more"
            asks = f"expects {_describe(inn[k][0])} at its step {inn[k][1]}" if k < len(inn) else "expects nothing more"
            marks = ([(src, out[k][1])] if k < len(out) else []) + ([(dst, inn[k][1])] if k < len(inn) else [])
            queue = "" if order == "pair" else f" {ch[2]}"
            _fail(s, f"{queue.strip() or 'messages'} from rank {src} to rank {dst} arrive out of order: as "
                     f"message #{k}, rank {src} {said}, but rank {dst} {asks}. Messages{queue} between "
                     f"two ranks are matched in the order they are posted (order={order!r}): reorder "
                     f"one of the two ranks", marks)


ORDERS = ("pair", "kind")


def validate(schedule, *, order: str = "pair", num_microbatches: int | None = None) -> Schedule:
    """Check a schedule can run, or raise a ValueError that prints it with the failing step marked.

    Checks, in order: every action on its stage's rank and in range; each (stage, microbatch)
    forwarded once and backwarded once (B, or I then W), F before B/I before W; for every pair
    of ranks the sender's send order equals the receiver's receive order (receives counted
    where their data is consumed; `order` says which messages share a queue, see
    `_check_channels`); and that playing the schedule never gets stuck (a `ScheduleDeadlock`,
    naming who waits for what). Returns the schedule as a `Schedule`.

    V-shaped schedules (zbv, dualpipe_v) send activations and gradients over the same pair of
    ranks in different orders: they pass with order="kind" only, so their executor must keep
    the two kinds apart (tags) or post receives early in send order, as torch's lowering does.
    """
    if order not in ORDERS:
        raise ValueError(f"validate: order={order!r}; choose one of {ORDERS}")
    s = as_schedule(schedule, num_microbatches=num_microbatches)
    _check_placement(s)
    _check_counts(s)
    _check_channels(s, order)
    _, pos = _run_order(s)
    if any(p < len(acts) for p, acts in zip(pos, s.actions)):
        raise ScheduleDeadlock(deadlock_message(s, pos))
    return s


# --------------------------------------------------------------------------- text and CSV


def format_table(schedule, marks: Iterable[tuple[int, int]] = (), aligned: bool = False) -> str:
    """A fixed-width table, one column per rank, one row per step; `>>` marks (rank, step) cells.

    With `aligned`, rows are unit time slots (every action one slot, as torch's
    `_format_pipeline_order` draws them) and the blanks are the bubbles.
    """
    if isinstance(schedule, Schedule):
        actions = schedule.actions
    elif isinstance(schedule, Mapping):
        actions = tuple(tuple(schedule[r]) for r in sorted(schedule))
    else:
        actions = tuple(tuple(acts) for acts in schedule)
    marks = set(marks)
    rows: dict[int, dict[int, int]] = {}
    if aligned:
        s = as_schedule(schedule)
        slots, pos = _run_order(s, lockstep=True)
        last = 1 + max((t for sl in slots for t, _ in sl), default=-1)
        for r, sl in enumerate(slots):
            placed = sl + [(last + k - pos[r], k) for k in range(pos[r], len(actions[r]))]
            for t, step in placed:
                rows.setdefault(t, {})[r] = step
    else:
        for r, acts in enumerate(actions):
            for step in range(len(acts)):
                rows.setdefault(step, {})[r] = step
    width = max([len(f"rank {len(actions) - 1}")] + [len(str(a)) for acts in actions for a in acts])
    head = ("slot" if aligned else "step") + "".join(f"    {'rank ' + str(r):<{width}}" for r in range(len(actions)))
    lines = [head.rstrip()]
    for t in range(1 + max(rows, default=-1)):
        cells = []
        for r in range(len(actions)):
            step = rows.get(t, {}).get(r)
            text = "" if step is None else str(actions[r][step])
            mark = ">>" if step is not None and (r, step) in marks else "  "
            cells.append(f"  {mark}{text:<{width}}")
        lines.append((f"{t:>4}" + "".join(cells)).rstrip())
    return "\n".join(lines)


_TORCH_LOWERING = re.compile(r"\d+(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)\d*")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")


def _parse_cell(cell: str) -> list[Action]:
    cell = cell.strip()
    if not cell or _TORCH_LOWERING.fullmatch(cell):
        return []  # an idle slot, or a comms/FSDP action torch adds when lowering a schedule
    if match := _OVERLAP.fullmatch(cell):
        return [Action.parse(sub) for sub in match.group(1).split(";")]  # run one after the other
    return [Action.parse(cell)]


def from_csv(text: str, *, num_microbatches: int | None = None, name: str = "csv") -> Schedule:
    """Parse torch.distributed.pipelining's CSV: row r is rank r, each cell an action or empty.

    Empty cells (torch's idle slots) and communication or FSDP actions (SEND_F, RECV_B, UNSHARD,
    REDUCE_GRAD, ...) are skipped; DualPipeV's `(0F7;7B3)OVERLAP_F_B` becomes 0F7 then 7B3.
    """
    rows = list(csv.reader(io.StringIO(text)))
    actions = []
    for r, row in enumerate(rows):
        try:
            actions.append(tuple(a for cell in row for a in _parse_cell(cell)))
        except ValueError as e:
            raise ValueError(f"CSV row {r} (rank {r}): {e}") from None
    return _from_actions(tuple(actions), num_microbatches=num_microbatches, name=name)


def to_csv(schedule) -> str:
    """The schedule in torch's CSV format (`csv.writer` defaults, one row per rank, no idle cells)."""
    out = io.StringIO()
    writer = csv.writer(out)
    for acts in as_schedule(schedule).actions:
        writer.writerow([str(a) for a in acts])
    return out.getvalue()


def read_csv(path, **kw) -> Schedule:
    with open(path, newline="") as f:
        return from_csv(f.read(), **kw)


def write_csv(schedule, path) -> None:
    with open(path, "w", newline="") as f:
        f.write(to_csv(schedule))


from pipelib.pipeline.schedules_zb import dualpipe_v, interleaved_zero_bubble, zbv, zero_bubble_h1  # noqa: E402

GENERATORS: dict[str, Callable[..., Schedule]] = {
    "naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved_1f1b": interleaved_1f1b,
    "zb_h1": zero_bubble_h1, "interleaved_zero_bubble": interleaved_zero_bubble,
    "zbv": zbv, "dualpipe_v": dualpipe_v,
}
