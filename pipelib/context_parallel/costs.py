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


def variant_bytes(variant: str, batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int,
                  n: int) -> dict:
    """{"forward", "backward"} bytes one rank sends in one step of `variant` (exact)."""
    N = batch * heads * shard_len * head_dim * itemsize
    if variant == "ring":
        return {"forward": (n - 1) * 2 * N, "backward": (2 * n - 1) * 2 * N if n > 1 else 0}
    if variant == "allgather":
        return {"forward": (n - 1) * 2 * N, "backward": (n - 1) * 2 * N}
    if variant == "ulysses":
        return {"forward": (n - 1) * 4 * N // n, "backward": (n - 1) * 4 * N // n}
    raise ValueError(f"unknown variant {variant!r}; use 'ring', 'allgather' or 'ulysses'")


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
    S and P of the largest piece (2 B H p^2, p = c/2 under zigzag, else c; at most `tile`)."""
    p = shard_len // 2 if layout == "zigzag" else shard_len
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
