"""Schedules as data: the `Action`s of every rank, what each waits for, and their table.

A schedule says, for every rank, the order in which it runs its compute actions. An `Action` is
(stage, op, microbatch), printed `2F0` exactly as `torch.distributed.pipelining` prints its
`_Action`, so its CSV schedules load here and its orders can be compared with ours. Ops: F
(forward), B (full backward), I (backward for the input gradient only) and W (backward for the
weight gradient only); the I/W split is Zero Bubble's (Qi et al. 2023).

Idle slots are never written: when a rank waits is an *output* of `pipelib.pipeline.simulate`,
not an input. What an action waits for follows from the actions (`dependencies`): the F of
stage s needs the F of stage s-1, the B or I of stage s its own F and the B or I of stage s+1,
W its own I. `format_table` prints a schedule one column per rank, as the chapters show it.

Introduced in chapter 10.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum


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
    def parse(cls, text: str) -> Action:
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
    return from_actions(actions, num_microbatches=num_microbatches, name=name)


def from_actions(actions, *, num_microbatches: int | None = None, name: str = "custom") -> Schedule:
    """A `Schedule` from each rank's actions alone: stages, microbatches and placement inferred.

    Each stage's rank is where its actions appear (a stage on two ranks is a ValueError that
    marks the second); `num_microbatches` defaults to one more than the largest microbatch.
    """
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


# --------------------------------------------------------------------------- dependencies


def action_key(a: Action) -> tuple:
    """`(stage, op, microbatch)`: how `dependencies` names an action that must be done first."""
    return a.stage, a.op, a.microbatch


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


def first_unmet(s: Schedule, a: Action, done: set) -> tuple | None:
    """The first dependency of `a` not in `done` (a set of `action_key`s), or None: it can run."""
    for st, ops, j in dependencies(s, a):
        if not any((st, op, j) in done for op in ops):
            return st, ops, j
    return None


def unit_step_order(s: Schedule, lockstep: bool = False):
    """Play the schedule with every action one time unit: returns (slots, positions).

    slots[rank] lists (slot, step) of each executed action; positions[rank] is how far the rank
    got (== len(actions[rank]) when it finished; less means it is stuck). With `lockstep`, a
    rank runs at most one action per slot and sees only what finished in earlier slots (the
    aligned table).
    """
    pos, done, slot = [0] * s.num_ranks, set(), 0
    slots: list[list[tuple[int, int]]] = [[] for _ in range(s.num_ranks)]
    while True:
        ran = []
        for r, acts in enumerate(s.actions):
            while pos[r] < len(acts) and first_unmet(s, acts[pos[r]], done) is None:
                ran.append(acts[pos[r]])
                slots[r].append((slot, pos[r]))
                pos[r] += 1
                if lockstep:
                    break
                done.add(action_key(ran[-1]))
        done.update(action_key(a) for a in ran)
        if not ran:
            return slots, pos
        slot += 1


# --------------------------------------------------------------------------- the table


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
        slots, pos = unit_step_order(as_schedule(schedule), lockstep=True)
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
