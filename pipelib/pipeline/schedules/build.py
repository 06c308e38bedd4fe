"""Building blocks that the schedule generators share (`generators`, `zero_bubble`).

Generators are pure functions of integers: p (ranks; the stages of a plain pipeline), m
(num_microbatches) and, for looped schedules, v (num_chunks: stages per rank). Here: the checks
of those integers, the two stage placements (looped: stage s on rank s % p; V: down the ranks
and back up), a plain pipeline from one rank's actions, and the looped depth-first order that
interleaved 1F1B and torch's zero-bubble schedules share.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from pipelib.checks import check_int
from pipelib.pipeline.schedules.ir import Action, Op, Schedule


def check_sizes(generator: Callable, p: int, m: int, v: int | None = None) -> None:
    """A ValueError naming `generator` and the value unless p, m (and v) are integers >= 1."""
    where = generator.__name__
    check_int(p, "p", context=where, hint="ranks: the pipeline's stages")
    check_int(m, "m", context=where, hint="num_microbatches")
    if v is not None:
        check_int(v, "v", context=where, hint="num_chunks: stages per rank")


def looped_placement(p: int, v: int) -> tuple[int, ...]:
    """Stage s on rank s % p, for p ranks of v stages each (interleaved: Narayanan et al. 2021)."""
    return tuple(s % p for s in range(p * v))


def v_placement(p: int) -> tuple[int, ...]:
    """Stage s on rank s for s < p, then back down: stage 2p-1-r on rank r (a V: ZB-V, DualPipeV)."""
    return tuple(range(p)) + tuple(reversed(range(p)))


def plain_schedule(p: int, m: int, rank_ops: Callable[[int], list[Action]], *, name: str) -> Schedule:
    """A pipeline of p stages, stage r on rank r, whose rank r runs `rank_ops(r)`."""
    return Schedule(tuple(tuple(rank_ops(r)) for r in range(p)), p, m, tuple(range(p)), name)


def microbatches_per_round(generator: Callable, p: int, m: int) -> int:
    """Microbatches per round of a looped schedule, with torch's rule (rounds = max(1, m // p)).

    m must be a multiple of the number of rounds, else a ValueError lists the m nearby that work.
    """
    rounds = max(1, m // p)
    if m % rounds:
        ok = [k for k in range(max(1, m - p), m + p + 1) if k % max(1, k // p) == 0]
        raise ValueError(
            f"{generator.__name__}: num_microbatches m={m} with p={p} ranks: m must be a multiple "
            f"of the number of rounds max(1, m // p) = {rounds}; choose m among {ok} (any "
            f"multiple of p works, and so does any m <= p)"
        )
    return m // rounds


def looped_rank_ops(p: int, m: int, v: int, rank: int, *, zero_bubble: bool,
                    per_round: int | None = None) -> list[Action]:
    """One rank's actions in the looped depth-first order of Megatron and torch.

    Stage chunk c of rank r is stage c*p + r. Forwards run in rounds of `per_round`
    microbatches per chunk, chunk 0 first; backwards likewise, last chunk first. After the
    warm-up, each forward is followed by one backward. With `zero_bubble` the backward is I and
    the W of the oldest pending I follows it once rank r has done r backwards (torch's ZB1P).
    Call `microbatches_per_round` first: m must be a whole number of rounds. `per_round`
    (default: torch's, `microbatches_per_round`) is Llama 3's tunable N.
    """
    per_round = m // max(1, m // p) if per_round is None else per_round
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
