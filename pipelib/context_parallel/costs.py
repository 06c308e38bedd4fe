"""The formulas of chapter 17: bytes per rank, the crossover shard length, memory per rank.

With B batch, H heads, c = S / n rows per rank, D head dimension, i bytes per element and
N = B H c D i (one shard of one tensor), bytes sent per rank by one forward and backward:

    ring       forward (n-1) 2N          backward (2n-1) 2N     (K/V blocks; K/V and dK/dV)
    all-gather forward (n-1) 2N          backward (n-1) 2N      (gather K/V; reduce-scatter dK/dV)
    Ulysses    forward (n-1)/n 4N        backward (n-1)/n 4N    (Q, K, V in and O out; reversed)

Overlap: a ring step computes c^2 visible pairs (non-causal; about c^2 / 2 per step under
causal zigzag) at 4 B H D FLOPs each, while one K/V block of 2N bytes crosses the link. The
transfer hides behind compute when 4 B H D c^2 / F >= alpha + 2 B H c D i / beta; ignoring
alpha, when c >= c* = i F / (2 beta): the crossover shard length depends only on the device's
FLOP/s per link byte (`DeviceProfile.flops_per_link_byte`) and the element size, not on B, H
or D. For an H100 over NVLink in bf16 that is about 2,200 rows; over PCIe, 20,000.

Memory, as the memory tracker counts it (`ring.held`: the saved tensors measured, the working
buffers declared by size): a ring rank holds its shard's Q, K, V, O and lse for backward,
3 K/V-sized buffers during backward and one score block (S and P) of its largest piece pair:
all of it a function of c alone, so the longest context grows exactly n-fold with n ranks.
Receive buffers, dO and dQ are not counted (a model of an allocator, not one).

`overlap_stats` reads how much transfer time a measured trace hid behind compute.

Pure: no torch. Introduced in chapter 17.
"""
from __future__ import annotations

import math

from pipelib.context_parallel.layouts import layout_info


def ring_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int) -> dict:
    """Ring attention: n - 1 K/V blocks forward; n - 1 K/V blocks and n dK/dV blocks backward."""
    block = 2 * batch * heads * shard_len * head_dim * itemsize
    return {"forward": (n - 1) * block, "backward": (2 * n - 1) * block if n > 1 else 0}


def allgather_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int) -> dict:
    """All-gather (Llama 3): a ring all-gather of K/V forward, a reduce-scatter of dK/dV backward."""
    block = 2 * batch * heads * shard_len * head_dim * itemsize
    return {"forward": (n - 1) * block, "backward": (n - 1) * block}


def ulysses_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int) -> dict:
    """Ulysses: (n-1)/n of Q, K, V and O forward, of dO, dQ, dK, dV backward (all-to-alls)."""
    N = batch * heads * shard_len * head_dim * itemsize
    return {"forward": (n - 1) * 4 * N // n, "backward": (n - 1) * 4 * N // n}


def _compute(profile, batch: int, heads: int, shard_len: int, head_dim: int, n: int, causal: bool):
    """(forward, backward) compute seconds of one rank: its visible (query, key) pairs, S(S+1)/(2n)
    under causal masking (exact for zigzag shards, the mean otherwise) or c S, at 4 and 10 B H D
    FLOPs each (`blockwise.attention_flops`)."""
    S = n * shard_len
    pairs = S * (S + 1) / (2 * n) if causal else shard_len * S
    flops = pairs * batch * heads * head_dim
    return profile.compute_time(4 * flops), profile.compute_time(10 * flops)


def ring_time(profile, batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int, n: int,
              causal: bool = True) -> float:
    """Predicted seconds of one ring step: each of the n - 1 forward and n - 1 backward ring steps
    lasts the longer of its compute (1/n of the rank's) and one K/V block's message (K/V and
    dK/dV fly side by side backward); the last hop of dK/dV home hides behind the deferred dQ
    (a fifth of one step's backward)."""
    f, b = _compute(profile, batch, heads, shard_len, head_dim, n, causal)
    if n == 1:
        return f + b
    m = profile.message_time(2 * batch * heads * shard_len * head_dim * itemsize)
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
                        itemsize: int, pairs_share: float = 1.0) -> float:
    """The shard length c at which one ring step's compute (pairs_share c^2 visible pairs, 4 B H D
    FLOPs each, at `flops` FLOP/s) equals one K/V block's message time alpha + 2 B H c D i / beta."""
    a = pairs_share * 4 * batch * heads * head_dim / flops     # a c^2 = alpha + b c
    b = 2 * batch * heads * head_dim * itemsize / beta
    return (b + math.sqrt(b * b + 4 * a * alpha)) / (2 * a)


def ring_peak_bytes(batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int,
                    layout: str = "zigzag", tile: int | None = None) -> int:
    """Peak bytes one ring rank holds in forward + backward: Q, K, V, O (4 B H c D) and lse
    (B H c) saved; during backward K/V, its next block and dK/dV (6 B H c D); one score block
    S and P of the largest piece (2 B H p^2, p = c/2 under zigzag, else c; at most `tile`;
    `layouts.Layout.longest_piece`)."""
    p = layout_info(layout).longest_piece(shard_len)
    p = p if tile is None else min(p, tile)
    BH = batch * heads
    return itemsize * BH * (10 * shard_len * head_dim + shard_len + 2 * p * p)


def max_shard_len(capacity: int, batch: int, heads: int, head_dim: int, itemsize: int,
                  layout: str = "zigzag", step: int = 2, tile: int | None = None) -> int:
    """The longest shard (a multiple of `step`) whose `ring_peak_bytes` fits in `capacity`."""
    c = step
    while ring_peak_bytes(batch, heads, c + step, head_dim, itemsize, layout, tile) <= capacity:
        c += step
    return c


def overlap_stats(trace, rank: int | None = None) -> dict:
    """From a measured `Trace`: transfer time, the part of it a rank waited for, the share
    hidden behind compute, and the step (the trace's span) over compute alone; the worst rank
    unless `rank` is given."""
    ranks = range(trace.world_size) if rank is None else [rank]
    rows = []
    for r in ranks:
        transfer = sum(e.duration for e in trace.events if e.rank == r and e.kind.value == "transfer")
        waited = sum(e.duration for e in trace.events if e.rank == r and e.kind.value == "recv-wait")
        busy = trace.busy(r)
        rows.append({"rank": r, "transfer": transfer, "waited": waited, "compute": busy,
                     "hidden": 1 - waited / transfer if transfer else 1.0,
                     "step_over_compute": trace.span / busy if busy else float("inf")})
    return min(rows, key=lambda x: x["hidden"])
