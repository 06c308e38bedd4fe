"""The classic schedules (naive, GPipe, 1F1B, interleaved 1F1B, looped BFS, Llama 3's interleaved
with its tunable N), functions of integers.

p = ranks (the stages of a plain pipeline), m = num_microbatches, v = num_chunks (stages per
rank of a looped schedule). Each returns a `Schedule`; its bubble and memory are computed by
`pipelib.pipeline.simulate`, never written in. Each has one entry in `registry` (its name, its
torch class, its closed-form bubble). The orders equal torch.distributed.pipelining's.

Introduced in chapter 10 (naive), 11 (GPipe) and 12 (1F1B, interleaved, looped BFS).
"""
from __future__ import annotations

from pipelib.checks import check_int
from pipelib.pipeline.schedules.build import (
    check_sizes,
    looped_placement,
    looped_rank_ops,
    microbatches_per_round,
    plain_schedule,
)
from pipelib.pipeline.schedules.ir import Action, Op, Schedule


def naive(p: int, m: int) -> Schedule:
    """Stop and wait: microbatch j+1 enters only after microbatch j came all the way back.

    Every rank runs F j then B j for j = 0..m-1; the dependencies do the rest, so one rank
    works at a time and the bubble is (p-1)/p whatever m is (chapter 10).
    """
    check_sizes(naive, p, m)
    return plain_schedule(p, m, lambda r: [Action(r, op, j) for j in range(m) for op in (Op.F, Op.B)],
                          name="naive")


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): all m forwards, then all m backwards, on every rank.

    Bubble (p-1)/(m+p-1) of the step; every rank holds the activations of all m microbatches
    at the turn. Backwards run in microbatch order 0..m-1, as in torch's ScheduleGPipe.
    """
    check_sizes(gpipe, p, m)
    return plain_schedule(p, m, lambda r: [Action(r, Op.F, j) for j in range(m)]
                          + [Action(r, Op.B, j) for j in range(m)], name="gpipe")


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021): same bubble as GPipe, memory of p.

    Rank r runs min(p-r-1, m) warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. It starts backwards as soon as it can, so it holds at
    most min(p-r, m) microbatches' activations (GPipe: m). Same order as torch's Schedule1F1B.
    """
    check_sizes(one_f_one_b, p, m)

    def rank_ops(r: int) -> list[Action]:
        warmup = min(p - r - 1, m)
        ops = [Action(r, Op.F, j) for j in range(warmup)]
        for j in range(m - warmup):
            ops += [Action(r, Op.F, warmup + j), Action(r, Op.B, j)]
        return ops + [Action(r, Op.B, j) for j in range(m - warmup, m)]

    return plain_schedule(p, m, rank_ops, name="1f1b")


def interleaved_1f1b(p: int, m: int, num_chunks: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., SC'21): v = num_chunks stages per rank, looped.

    Stage s lives on rank s % p. Each rank's share of the model is cut into v chunks, so a
    forward costs 1/v as much and the warm-up bubble shrinks by v: (p-1)/(v*m + p-1) of the step
    instead of (p-1)/(m+p-1) once m >= p, for v times more messages. Same order as torch's
    ScheduleInterleaved1F1B, including its accepted m: m must be a multiple of
    max(1, m // p) (so every multiple of p, and every m <= p). With v = 1 this is 1F1B with a
    deeper warm-up of 2(p-1-r) forwards, as in torch.
    """
    check_sizes(interleaved_1f1b, p, m, num_chunks)
    microbatches_per_round(interleaved_1f1b, p, m)
    v = num_chunks
    acts = tuple(tuple(looped_rank_ops(p, m, v, r, zero_bubble=False)) for r in range(p))
    return Schedule(acts, p * v, m, looped_placement(p, v), name="interleaved_1f1b")


def looped_bfs(p: int, m: int, num_chunks: int = 2) -> Schedule:
    """Looped BFS (Lamy-Poirier 2023, Breadth-First Pipeline Parallelism): GPipe, looped.

    v = num_chunks stages per rank, stage s on rank s % p as in interleaved 1F1B, but each rank
    runs *breadth first*: all m forwards of its first chunk, then all of its next chunk, ...;
    then the backwards, last chunk first, each chunk's microbatches in reverse order (the last
    forwarded is the first whose gradient can come back). Like GPipe every rank holds all m
    microbatches at the turn; like interleaving the fill is a chunk's, not a stage's. Same
    order as torch's ScheduleLoopedBFS.
    """
    check_sizes(looped_bfs, p, m, num_chunks)
    v = num_chunks

    def rank_ops(r: int) -> list[Action]:
        stages = [c * p + r for c in range(v)]
        return ([Action(s, Op.F, j) for s in stages for j in range(m)]
                + [Action(s, Op.B, j) for s in reversed(stages) for j in reversed(range(m))])

    return Schedule(tuple(tuple(rank_ops(r)) for r in range(p)), p * v, m, looped_placement(p, v),
                    name="looped_bfs")


def llama3_interleaved(p: int, m: int, num_chunks: int = 2, per_round: int | None = None) -> Schedule:
    """Llama 3's interleaved schedule (Llama 3 paper, section 3.3.2): a tunable N microbatches
    per round, between depth first and breadth first.

    The looped order of interleaved 1F1B (stage s on rank s % p, forwards in rounds of N
    microbatches per chunk, warm-up (v-1) N + 2(p-1-r), then one forward one backward), with N =
    `per_round` free: N = p (default, torch's rule) is `interleaved_1f1b` action for action,
    depth first; larger N keeps more microbatches in flight (more memory) and leaves longer
    between a message's send and its use (latency hidden); N = m is breadth first, every
    chunk's forwards in looped BFS's order. N must divide m, with min(p, m) <= N <= m.
    """
    check_sizes(llama3_interleaved, p, m, num_chunks)
    n = microbatches_per_round(llama3_interleaved, p, m) if per_round is None else per_round
    check_int(n, "per_round", context="llama3_interleaved", hint="N: microbatches per round")
    if not (min(p, m) <= n <= m and m % n == 0):
        ok = [k for k in range(min(p, m), m + 1) if m % k == 0]
        raise ValueError(f"llama3_interleaved: per_round N={n} with p={p}, m={m}: N must divide m "
                         f"and lie in [min(p, m), m]; choose N among {ok}")
    v = num_chunks
    acts = tuple(tuple(looped_rank_ops(p, m, v, r, zero_bubble=False, per_round=n)) for r in range(p))
    return Schedule(acts, p * v, m, looped_placement(p, v), name="llama3_interleaved")
