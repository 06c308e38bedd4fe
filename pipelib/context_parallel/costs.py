"""The formulas of chapter 17: bytes per rank, the crossover shard length, memory per rank.

With B batch, H heads, c = S / n rows per rank, D head dimension, i bytes per element and
N = B H c D i (one shard of one tensor), bytes sent per rank by one forward and backward:

    ring       forward (n-1) 2N          backward (2n-1) 2N     (K/V blocks; K/V and dK/dV)
    all-gather forward (n-1) 2N          backward (n-1) 2N      (gather K/V; reduce-scatter dK/dV)
    Ulysses    forward (n-1)/n 4N        backward (n-1)/n 4N    (Q, K, V in and O out; reversed)

The ring's backward is at input width; for 16-bit inputs its dK/dV travel in fp32, (n-1) 2N + n 4N
(`grad_width`). With grouped-query attention (`kv_heads`) the ring's N counts H_kv heads.

Overlap: a ring step computes c^2 visible pairs (non-causal; about c^2 / 2 per step under
causal zigzag) at 4 B H D FLOPs each, while one K/V block of 2N bytes crosses the link. The
transfer hides behind compute when 4 B H D c^2 / F >= alpha + 2 B H c D i / beta; ignoring
alpha, when c >= c* = i F / (2 beta): the crossover shard length depends only on the device's
FLOP/s per link byte (`DeviceProfile.flops_per_link_byte`) and the element size, not on B, H
or D (for multi-head attention). Chapter 17 prints it for an H100 over NVLink and over PCIe.

Memory, as the memory tracker counts it (`ring.held`: the saved tensors measured, the working
buffers declared by size): a ring rank holds its shard's Q, K, V, O and lse for backward; during
backward the K/V block in hand and the receive buffer of the next, the dK/dV accumulator and the
incoming one, dQ and one block's dQ, dK, dV (16 B H c D at input width for multi-head
attention); and one score block (S and P) of its largest piece pair (`ring_memory`): all of it
a function of c alone, so from two ranks on the longest context grows exactly n-fold. For
16-bit inputs the accumulators are fp32, which doubles their share. dO and the temporaries
inside one block's compute are not counted (a model of an allocator, not one).

Grouped-query attention (`kv_heads` < heads): K/V blocks and their bytes scale with H_kv, the
compute with H, so without alpha the crossover shrinks by exactly H_kv / H. alpha lengthens
every crossover, a short one's most (the root of a c^2 = alpha + b c lies above b / a, the
further the smaller b), so with it the ratio lies between H_kv / H and H_kv / H times the
stretch alpha gives the grouped-query crossover itself.

`overlap_stats` reads how much transfer time a measured trace hid behind compute, `forward_wait`
how long the ring's forward waited for its blocks.

Pure: no torch. Introduced in chapter 17.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pipelib.checks import check_int, check_ints, check_number
from pipelib.context_parallel.layouts import layout_info
from pipelib.trace import Kind


def check_attention_sizes(context: str, batch, heads, shard_len, head_dim, itemsize, n=1, kv_heads=None) -> int:
    """Every size an integer >= 1 (a ValueError naming the first that is not); `kv_heads` (None:
    `heads`) must divide `heads`. Returns the K/V heads."""
    check_ints(context, batch=batch, heads=heads, shard_len=shard_len, head_dim=head_dim,
               itemsize=itemsize, n=n)
    if kv_heads is None:
        return heads
    check_int(kv_heads, "kv_heads", context=context, hint="K/V heads of grouped-query attention, or None")
    if heads % kv_heads:
        raise ValueError(f"{context}: heads={heads} is not a multiple of kv_heads={kv_heads}; grouped-query "
                         f"attention shares each K/V head among heads / kv_heads query heads")
    return kv_heads


def grad_width(itemsize: int) -> int:
    """Bytes per element of the ring's dQ and dK/dV accumulators: fp32 for 16-bit inputs (as
    ring-flash-attention), else the input's (`ring.accumulator_dtype`)."""
    return 4 if itemsize < 4 else itemsize


def ring_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int,
               kv_heads: int | None = None) -> dict:
    """Ring attention: n - 1 K/V blocks forward; n - 1 K/V blocks and n dK/dV blocks backward,
    the dK/dV at `grad_width` (fp32 for 16-bit inputs). Only the `kv_heads` (default: heads)
    travel: with grouped-query attention the bytes are H_kv / H of multi-head attention's."""
    kvh = check_attention_sizes("ring_bytes", batch, heads, shard_len, head_dim, itemsize, n, kv_heads)
    block = 2 * batch * kvh * shard_len * head_dim * itemsize
    grads = n * block * grad_width(itemsize) // itemsize
    return {"forward": (n - 1) * block, "backward": (n - 1) * block + grads if n > 1 else 0}


def allgather_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int) -> dict:
    """All-gather (Llama 3): a ring all-gather of K/V forward, a reduce-scatter of dK/dV backward."""
    check_attention_sizes("allgather_bytes", batch, heads, shard_len, head_dim, itemsize, n)
    block = 2 * batch * heads * shard_len * head_dim * itemsize
    return {"forward": (n - 1) * block, "backward": (n - 1) * block}


def ulysses_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int) -> dict:
    """Ulysses: (n-1)/n of Q, K, V and O forward, of dO, dQ, dK, dV backward (all-to-alls). The
    heads must split over the n ranks, as `ulysses_attention` requires."""
    check_attention_sizes("ulysses_bytes", batch, heads, shard_len, head_dim, itemsize, n)
    if heads % n:
        raise ValueError(f"ulysses_bytes: {heads} heads do not split over n={n} ranks ({heads} % {n} = "
                         f"{heads % n}); use a number of ranks that divides the heads")
    N = batch * heads * shard_len * head_dim * itemsize
    return {"forward": (n - 1) * 4 * N // n, "backward": (n - 1) * 4 * N // n}


def _compute(profile, batch: int, heads: int, shard_len: int, head_dim: int, n: int, causal: bool):
    """(forward, backward) compute seconds of one rank: its visible (query, key) pairs, S(S+1)/(2n)
    under causal masking (exact for zigzag shards, the mean otherwise) or c S, at 4 and 10 B H D
    FLOPs each (`blockwise.attention_flops`)."""
    check_ints("context parallel time", batch=batch, heads=heads, shard_len=shard_len, head_dim=head_dim, n=n)
    S = n * shard_len
    pairs = S * (S + 1) / (2 * n) if causal else shard_len * S
    flops = pairs * batch * heads * head_dim
    return profile.compute_time(4 * flops), profile.compute_time(10 * flops)


def ring_time(profile, batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int,
              causal: bool = True, kv_heads: int | None = None) -> float:
    """Predicted seconds of one ring step: each of the n - 1 forward and n - 1 backward ring steps
    lasts the longer of its compute (1/n of the rank's, over all `heads`) and one K/V block's
    message (`kv_heads` of them; K/V and dK/dV fly side by side backward, both counted at input
    width); the last hop of dK/dV home hides behind the deferred dQ (a fifth of one step's backward)."""
    kvh = check_attention_sizes("ring_time", batch, heads, shard_len, head_dim, itemsize, n, kv_heads)
    f, b = _compute(profile, batch, heads, shard_len, head_dim, n, causal)
    if n == 1:
        return f + b
    m = profile.message_time(2 * batch * kvh * shard_len * head_dim * itemsize)
    return (n - 1) * (max(f / n, m) + max(b / n, m)) + f / n + b / n + max(0.0, m - b / (5 * n))


def allgather_time(profile, batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int,
                   causal: bool = True) -> float:
    """Predicted seconds: compute, then n - 1 ring steps of K/V blocks each way, not overlapped."""
    f, b = _compute(profile, batch, heads, shard_len, head_dim, n, causal)
    return f + b + 2 * (n - 1) * profile.message_time(2 * batch * heads * shard_len * head_dim * itemsize) * (n > 1)


def ulysses_time(profile, batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int,
                 causal: bool = True) -> float:
    """Predicted seconds: compute, and four pairwise all-to-alls of n - 1 steps each (Q, K, V
    and O forward, dO and dQ, dK, dV backward), not overlapped."""
    f, b = _compute(profile, batch, heads, shard_len, head_dim, n, causal)
    N = batch * heads * shard_len * head_dim * itemsize
    steps = profile.message_time(3 * N // n) + profile.message_time(N // n)
    return f + b + 2 * (n - 1) * steps


def crossover_shard_len(flops: float, alpha: float, beta: float, batch: int, heads: int, head_dim: int,
                        itemsize: int, pairs_share: float = 1.0, kv_heads: int | None = None) -> float:
    """The shard length c at which one ring step's compute (pairs_share c^2 visible pairs, 4 B H D
    FLOPs each, at `flops` FLOP/s) equals one K/V block's message time alpha + 2 B H_kv c D i / beta.
    Without alpha, c* = i F / (2 pairs_share beta) * H_kv / H: grouped-query attention moves
    H_kv heads while computing over H, so its crossover is H_kv / H of multi-head attention's."""
    kvh = check_attention_sizes("crossover_shard_len", batch, heads, 1, head_dim, itemsize, 1, kv_heads)
    for name, v, pos in (("flops", flops, True), ("beta", beta, True), ("alpha", alpha, False),
                         ("pairs_share", pairs_share, True)):
        check_number(v, name, positive=pos, context="crossover_shard_len")
    a = pairs_share * 4 * batch * heads * head_dim / flops     # a c^2 = alpha + b c
    b = 2 * batch * kvh * head_dim * itemsize / beta
    return (b + math.sqrt(b * b + 4 * a * alpha)) / (2 * a)


@dataclass(frozen=True)
class RingMemory:
    """Bytes one ring rank holds at its peak (the backward), by what holds them."""

    saved: int          # Q, O (H heads), K, V (H_kv heads), lse: saved for backward (measured by the tracker)
    kv_blocks: int      # the K/V block in hand, the next one's receive buffer, the GQA expansion to H heads
    accumulators: int   # dK/dV (own and incoming, H_kv heads) and dQ (H heads), at the accumulator width
    block_grads: int    # one block's dQ, dK, dV at H heads and input width
    scores: int         # S and P of the largest piece pair (or tile)
    kv_block: int       # one K/V block at input width (the unit the ring sends)

    @property
    def total(self) -> int:
        return self.saved + self.kv_blocks + self.accumulators + self.block_grads + self.scores


def ring_memory(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, layout: str = "zigzag",
                tile: int | None = None, *, kv_heads: int | None = None, ranks: int = 2) -> RingMemory:
    """What one ring rank holds during its backward (the peak: forward holds a subset), as the
    memory tracker counts it (`ring.ring_buffer_bytes`): with N1 = B c D, Q and O at H heads,
    K, V at H_kv; receive buffers only with `ranks` > 1; accumulators at `grad_width`; the score
    block of the longest piece (c/2 under zigzag, else c; at most `tile`). Not counted: dO
    (autograd's) and the temporaries inside one block's compute."""
    kvh = check_attention_sizes("ring_memory", batch, heads, shard_len, head_dim, itemsize, ranks, kv_heads)
    if tile is not None:
        check_int(tile, "tile", context="ring_memory", hint="rows per attention tile, or None for whole pieces")
    n1, ring = batch * shard_len * head_dim, ranks > 1
    a = grad_width(itemsize)
    p = layout_info(layout).longest_piece(shard_len)
    p = p if tile is None else min(p, tile)
    block = 2 * kvh * n1 * itemsize
    return RingMemory(saved=itemsize * (2 * heads * n1 + 2 * kvh * n1 + batch * heads * shard_len),
                      kv_blocks=block * (1 + ring) + (2 * heads * n1 * itemsize if kvh != heads else 0),
                      accumulators=2 * kvh * n1 * a * (1 + ring) + heads * n1 * a,
                      block_grads=3 * heads * n1 * itemsize,
                      scores=2 * batch * heads * p * p * itemsize, kv_block=block)


def ring_peak_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int,
                    layout: str = "zigzag", tile: int | None = None, **kw) -> int:
    """Peak bytes one ring rank holds in forward + backward: `ring_memory(...).total`. For
    multi-head attention at input width on a ring (n > 1) that is 16 B H c D + B H c elements
    and the score block: Q, K, V, O and lse saved; K/V, the next K/V, dK/dV, the incoming dK/dV,
    dQ and one block's dQ, dK, dV. `kw`: kv_heads, ranks (see `ring_memory`)."""
    return ring_memory(batch, heads, shard_len, head_dim, itemsize, layout, tile, **kw).total


def max_shard_len(capacity: int, batch: int, heads: int, head_dim: int, itemsize: int,
                  layout: str = "zigzag", step: int = 2, tile: int | None = None,
                  count: Callable[[RingMemory], int] | None = None, **kw) -> int:
    """The longest shard (a multiple of `step`) whose `ring_memory` fits in `capacity`: all of it
    (`RingMemory.total`, the default), or what `count` takes from it, to see what a shorter list
    of buffers would promise (`kw`: kv_heads, ranks). A ValueError if not even one `step` fits."""
    check_int(step, "step", context="max_shard_len", hint="the shard length's granularity, e.g. 2 for zigzag")
    check_int(capacity, "capacity", context="max_shard_len", hint="bytes one rank may hold")

    def need(c: int) -> int:
        m = ring_memory(batch, heads, c, head_dim, itemsize, layout, tile, **kw)
        return m.total if count is None else count(m)

    if need(step) > capacity:
        raise ValueError(f"max_shard_len: not even a shard of step={step} rows fits in capacity={capacity} "
                         f"bytes (it needs {need(step)}); give more capacity or a smaller batch, heads or head_dim")
    lo, hi = step, 2 * step  # doubling, then bisection: O(log) calls of `need`, which grows with c
    while need(hi) <= capacity:
        lo, hi = hi, 2 * hi
    while hi - lo > step:
        mid = lo + (hi - lo) // (2 * step) * step
        lo, hi = (mid, hi) if need(mid) <= capacity else (lo, mid)
    return lo


def forward_wait(trace) -> float:
    """Seconds the ranks of a measured `Trace` waited, all added, for K/V blocks of the ring's
    forward (its receives are labelled "ring_attention forward ..."; `ring.RingAttention`)."""
    return sum(e.duration for e in trace.filter(kind=Kind.RECV_WAIT).events
               if e.label.startswith("ring_attention forward "))


def overlap_stats(trace, rank: int | None = None) -> dict:
    """From a measured `Trace`: transfer time, the part of it a rank waited for, the share
    hidden behind compute, and the step (the trace's span) over compute alone; the worst rank
    unless `rank` is given."""
    ranks = range(trace.world_size) if rank is None else [rank]
    rows = []
    for r in ranks:
        transfer = sum(e.duration for e in trace.events if e.rank == r and e.kind == Kind.TRANSFER)
        waited = sum(e.duration for e in trace.events if e.rank == r and e.kind == Kind.RECV_WAIT)
        busy = trace.busy(r)
        rows.append({"rank": r, "transfer": transfer, "waited": waited, "compute": busy,
                     "hidden": 1 - waited / transfer if transfer else 1.0,
                     "step_over_compute": trace.span / busy if busy else float("inf")})
    return min(rows, key=lambda x: x["hidden"])
