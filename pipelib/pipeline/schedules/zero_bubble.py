"""Zero-bubble schedules: backward split into I (input gradient) and W (weight gradient).

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (ICLR 2024): only I is on the critical
path between stages, because only the input gradient is sent to the previous stage. W needs no
message, so it can be deferred into what would otherwise be bubbles. ZB-H1 keeps 1F1B's peak
memory (at most p microbatches in flight on any rank) and cuts its bubble to about a third;
ZB-H2 lets up to 2p-1 microbatches be in flight (Qi et al.'s (2p-1) M_B) and turns the step into
a parallelogram: no rank idles between its own first and last action. ZB-V places two stages per rank in a V and, with
equal F, I and W times, does the same at 1F1B's peak memory. DualPipe (DeepSeek-V3, 2024) feeds
microbatches from both ends of the pipeline, pairing one microbatch's forward with another's
backward so their communication can overlap; DualPipeV (Sea AI Lab's "cut-in-half" DualPipe)
keeps one direction by folding the stages into a V.

Orders follow torch.distributed.pipelining (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
ScheduleDualPipeV), so the book can check them against each other; torch has no ZB-H2. Each
schedule has one entry in `registry`. Chapter 13.
"""
from __future__ import annotations

from collections import Counter

from pipelib.pipeline.schedules.build import (
    check_sizes,
    looped_placement,
    looped_rank_ops,
    microbatches_per_round,
    v_placement,
)
from pipelib.pipeline.schedules.ir import Action, Op, Schedule


def zero_bubble_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023): 1F1B with B split into I and W, W deferred on later ranks.

    Rank r does min(p-1-r, m) warm-up forwards, then F, I pairs; from its (r+1)-th backward on,
    each I is followed by the W of the oldest pending I, and the rest of the Ws close the step.
    Deferring W by r steps on rank r fills the drain bubble: the bubble shrinks from
    (p-1)(F+B) to (p-1)(F+I-W), a third of 1F1B's when F = I = W. At most p microbatches are in
    flight on any rank, as in 1F1B. Same order as torch's ScheduleInterleavedZeroBubble with one
    stage per rank (its ZB1P).
    """
    check_sizes(zero_bubble_h1, p, m)
    acts = tuple(tuple(looped_rank_ops(p, m, 1, r, zero_bubble=True)) for r in range(p))
    return Schedule(acts, p, m, tuple(range(p)), name="zb_h1")


def interleaved_zero_bubble(p: int, m: int, num_chunks: int = 2) -> Schedule:
    """ZB1P with v = num_chunks looped stages per rank: interleaved 1F1B with ZB-H1's deferred W.

    Stage s on rank s % p; warm-up (v-1)*round + (p-1-r) forwards. Accepts the same m as
    `interleaved_1f1b`. Same order as torch's ScheduleInterleavedZeroBubble.
    """
    check_sizes(interleaved_zero_bubble, p, m, num_chunks)
    microbatches_per_round(interleaved_zero_bubble, p, m)
    v = num_chunks
    acts = tuple(tuple(looped_rank_ops(p, m, v, r, zero_bubble=True)) for r in range(p))
    return Schedule(acts, p * v, m, looped_placement(p, v), name="interleaved_zero_bubble")


def zero_bubble_h2(p: int, m: int) -> Schedule:
    """ZB-H2 (Qi et al. 2023, section 3.1): ZB-H1 with 2p-1 microbatches in flight, a parallelogram.

    ZB-H1 idles (p-1)F per rank: before its first I, rank r has only its p-1-r warm-up forwards
    to run. ZB-H2 gives it more: up to 2p-1 microbatches may be in flight (forwarded, W not yet
    done), so rank r warms up with 2(p-1-r)+1 forwards, exactly enough to stay busy until its
    first input gradient comes back, and it pushes Ws to the tail. With F = I = W each rank is
    busy from its first action to its last (for m >= 2p-1): the step is a parallelogram whose
    corners, (p-1)F per rank, are the only idle time. Qi et al. call that zero bubble because,
    with their optimizer post-validation (section 4), the corners overlap the previous and next
    iterations; counted in one step's span the bubble is (p-1)/(3m+p-1), as for ZB-H1.

    Built as the paper's handcrafted ZB-H2 is drawn, with every op one time unit: in each slot
    every rank runs the first it can of: I of its oldest forwarded microbatch whose gradient has
    arrived; F of its next microbatch, if its input has arrived and fewer than 2p-1 are in
    flight; W of its oldest pending I. Rank 0 thus starts F0..F(2p-2), I0, W0, as the paper's
    Figure 3 (F1..F7, B1, W1 for p = 4) and its peak of (2p-1) M_B (Table 2); the rule then runs
    I1 before F(2p-1), because that gradient is already there (the figure puts F8 before B2):
    the same peak and the same parallelogram, and with m >= 2p-1 no rank idles inside its own
    span (chapter 13 measures it), so a larger limit could only hold more microbatches: it could
    not remove idle time that is not there. torch.distributed.pipelining has no ZB-H2.
    """
    check_sizes(zero_bubble_h2, p, m)
    limit, done = 2 * p - 1, set()
    nxt = {op: [0] * p for op in (Op.F, Op.I, Op.W)}
    acts: list[list[Action]] = [[] for _ in range(p)]
    while any(n < m for n in nxt[Op.W]):
        ran = []
        for r in range(p):
            i, f = nxt[Op.I][r], nxt[Op.F][r]
            if i < f and (r == p - 1 or (r + 1, Op.I, i) in done):
                op = Op.I
            elif f < m and (r == 0 or (r - 1, Op.F, f) in done) and f - nxt[Op.W][r] < limit:
                op = Op.F
            elif nxt[Op.W][r] < i:
                op = Op.W
            else:
                continue
            ran.append(Action(r, op, nxt[op][r]))
            nxt[op][r] += 1
        if not ran:  # cannot happen: the last rank can always go on; a guard against a loop
            raise AssertionError(f"zero_bubble_h2({p}, {m}) is stuck")
        for a in ran:
            acts[a.stage].append(a)
            done.add((a.stage, a.op, a.microbatch))
    return Schedule(tuple(map(tuple, acts)), p, m, tuple(range(p)), name="zb_h2")


class _Emitter:
    """Appends actions, numbering microbatches per (stage, op) in the order they are emitted."""

    def __init__(self):
        self.ops: list[Action] = []
        self.count: Counter = Counter()

    def __call__(self, stage: int, op: Op, microbatch: int | None = None) -> None:
        if microbatch is None:
            microbatch = self.count[stage, op]
            self.count[stage, op] += 1
        self.ops.append(Action(stage, op, microbatch))


def _zbv_rank_ops(p: int, m: int, r: int) -> list[Action]:
    n = max(2 * p - 1, m)  # torch plans for at least 2p-1 microbatches, then drops the extra
    c0, c1 = r, 2 * p - 1 - r
    e, F, I, W = _Emitter(), Op.F, Op.I, Op.W
    for _ in range(2 * (p - r) - 1):
        e(c0, F)
    for _ in range(r):
        e(c1, F), e(c0, F)
    for _ in range(p - r):
        e(c1, F), e(c1, I), e(c1, W)
    while e.count[c1, F] < e.count[c0, F] or e.count[c0, F] < n:
        if e.count[c0, F] < n:
            e(c0, F)
        e(c0, I), e(c0, W), e(c1, F), e(c1, I), e(c1, W)
    for _ in range(r):
        e(c0, I), e(c1, I)
    for _ in range(p - r):
        e(c0, I), e(c0, W)
    for c in (c1, c0):
        while e.count[c, W] < e.count[c, I]:
            e(c, W)
    return [a for a in e.ops if a.microbatch < m]


def zbv(p: int, m: int) -> Schedule:
    """ZB-V (Qi et al. 2023, section 6): two stages per rank in a V, I and W split.

    Stage s lives on rank s for s < p and on rank 2p-1-s after, so rank 0 holds the first and
    the last stage: the turn at the bottom of the V is local, and the warm-up fills both chunks.
    With F = I = W the bubble all but vanishes as m grows, at 1F1B's peak activation memory.
    Same order as torch's ScheduleZBVZeroBubble (any m >= 1; for m < 2p-1 it plans 2p-1
    microbatches and drops the extra ones, as torch does).
    """
    check_sizes(zbv, p, m)
    acts = tuple(tuple(_zbv_rank_ops(p, m, r)) for r in range(p))
    return Schedule(acts, 2 * p, m, v_placement(p), name="zbv")


def _dualpipe_v_rank_ops(p: int, m: int, r: int) -> list[Action]:
    c0, c1 = r, 2 * p - 1 - r
    e, F, B, I, W = _Emitter(), Op.F, Op.B, Op.I, Op.W
    pending_w: list[tuple[int, int]] = []

    def backward(stage: int, split: bool) -> None:
        j = e.count[stage, "bwd"]
        e.count[stage, "bwd"] += 1
        e(stage, I if split else B, j)
        if split:
            pending_w.append((stage, j))

    def weight() -> None:
        if pending_w:
            e(pending_w[0][0], W, pending_w.pop(0)[1])

    for _ in range(2 * (p - r - 1)):
        e(c0, F)
    for _ in range(r + 1):
        e(c0, F), e(c1, F)
    for _ in range(p - r - 1):
        backward(c1, True), weight(), e(c1, F)
    for _ in range(m - 2 * p + r + 1):  # the steady state: F of one chunk paired with B of the other
        e(c0, F), backward(c1, False), e(c1, F), backward(c0, False)
    for _ in range(p - r - 1):
        backward(c1, False), e(c1, F), backward(c0, False)
    split, half = False, (r + 1) // 2
    for i in range(r + 1):
        split = split or (i == half and r % 2 == 1)
        backward(c1, split)
        split = split or (i == half and r % 2 == 0)
        backward(c0, split)
    for _ in range(p - r - 1):
        weight(), backward(c0, split)
    for _ in range(r + 1):
        weight()
    return e.ops


def dualpipe_v(p: int, m: int) -> Schedule:
    """DualPipeV: DeepSeek-V3's DualPipe (2024) cut in half (Sea AI Lab, 2025), in a V.

    DualPipe runs two pipelines at once, microbatches entering at both ends: each rank holds
    two stages (stage r of one direction, stage p-1-r of the other), so two copies of the
    parameters; its bubble, in the DeepSeek-V3 report's units, is (p/2 - 1)(F&B + B - 3W)
    against 1F1B's (p-1)(F + B). DualPipeV keeps one direction and one copy of the parameters
    by folding the 2p stages into a V, as ZB-V does.

    In the steady state each rank runs a forward of one chunk next to a full backward of the
    other chunk; on GPUs the two overlap so one's all-to-all hides behind the other's compute
    (torch writes the pair as one OVERLAP_F_B action; here they are two actions, F first).
    The cool-down splits backwards into I and W to fill the drain. Needs m >= 2p.
    Same order as torch's ScheduleDualPipeV, with the overlapped pairs written out.
    """
    check_sizes(dualpipe_v, p, m)
    if m < 2 * p:
        raise ValueError(f"dualpipe_v: num_microbatches m={m} < 2p = {2 * p} (p={p}); DualPipeV "
                         f"needs at least as many microbatches as stages: use m >= {2 * p}")
    acts = tuple(tuple(_dualpipe_v_rank_ops(p, m, r)) for r in range(p))
    return Schedule(acts, 2 * p, m, v_placement(p), name="dualpipe_v")
