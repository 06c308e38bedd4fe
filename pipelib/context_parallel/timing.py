"""Wall-clock timing of the attention variants on real CPU engines, and the reference doing one
rank's FLOPs without any message (`bench/context_parallel.py`).

`time_attention` runs on every rank: one warm-up step, then `repeats` steps each started from
a barrier (`pipelib.runtime.alternate.alternate_steps`); a step's time is the slowest rank's
wall time from the barrier to the end of its backward. `rank_work` is rank `rank`'s share of ring attention done
with every K/V shard at hand and no communication: the same blockwise kernels on the same
shards, so ring time / its time is the ring's overhead (`time_alone` times it on every engine at
once, under the same core sharing as the ring; `time_rank_alone` in this process). Predicted
times (alpha-beta and roofline, for a device profile) are the registry's: `variants.Variant.predicted_time`.

`ring_overlap` is the simulated clock's side: one ring step on the book's cluster, from fresh
clocks, and what its trace says about overlap (`costs.overlap_stats`, `costs.forward_wait`).

Introduced in chapter 17 (its overlap sections, its exercise and its benchmark).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from pipelib.context_parallel.blockwise import attend_pieces, attend_pieces_backward, merge_partials
from pipelib.context_parallel.costs import forward_wait, overlap_stats
from pipelib.context_parallel.partition import shard_pieces, split_sequence
from pipelib.context_parallel.partition import attention_inputs
from pipelib.context_parallel.step import attention_step
from pipelib.context_parallel.variants import variant_info
from pipelib.runtime.device import current
from pipelib.runtime.place import to_rank_device


def time_attention(variant: str, seq_len: int, repeats: int = 3, *, group=None, layout: str = "zigzag",
                   warmup: bool = True, **kw) -> list[float]:
    """Seconds per step of `variant` (a name of `variants.REGISTRY`; the slowest rank's),
    `repeats` steps after one warm-up (unless `warmup=False`)."""
    variant_info(variant)   # an unknown name fails here, before any barrier
    n, me = dist.get_world_size(group), dist.get_rank(group)
    shards = to_rank_device([split_sequence(t, n, me, layout) for t in attention_inputs(seq_len, **_inputs(kw))])

    def work():
        attention_step(variant, seq_len, group=group, layout=layout, inputs=shards, **kw)
    return _timed(work, repeats, group, warmup)


def time_alone(seq_len: int, repeats: int = 3, *, group=None, layout: str = "zigzag", warmup: bool = True,
               **kw) -> list[float]:
    """Seconds per step of each rank's own ring work without messages (`rank_work`; the slowest
    rank's), timed as `time_attention` times a variant: from a barrier, under the same core sharing."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    work = rank_work(seq_len, n, me, layout=layout, causal=kw.get("causal", True), **_inputs(kw))
    return _timed(work, repeats, group, warmup)


def _inputs(kw: dict) -> dict:
    return {k: kw[k] for k in ("batch", "heads", "head_dim", "dtype", "seed") if k in kw}


def _timed(work, repeats: int, group, warmup: bool) -> list[float]:
    """Seconds of `work()` from a barrier of `group` (the slowest rank's), `repeats` times after
    one warm-up: the one timing loop, `alternate_steps`, with one side."""
    from pipelib.runtime.alternate import alternate_steps

    return alternate_steps({"work": work}, repeats, warmup=int(warmup), group=group)["work"]


def rank_work(seq_len: int, n: int, rank: int = 0, *, layout: str = "zigzag", causal: bool = True, **kw):
    """A function doing rank `rank`'s ring-attention work, forward and backward, with every K/V
    shard at hand and no message (inputs prepared here, outside what it times)."""
    q, k, v, dout = to_rank_device(attention_inputs(seq_len, **kw))  # drawn on the CPU, then moved
    pieces = [shard_pieces(seq_len, n, r, layout) for r in range(n)]
    qs, dos = split_sequence(q, n, rank, layout), split_sequence(dout, n, rank, layout)
    ks = [split_sequence(k, n, r, layout) for r in range(n)]
    vs = [split_sequence(v, n, r, layout) for r in range(n)]

    def work():
        out = lse = None
        for j in range(n):
            o, l, p = attend_pieces(qs, ks[j], vs[j], pieces[rank], pieces[j], causal)
            if p:
                out, lse = merge_partials(out, lse, o, l)
        delta = (dos * out).sum(-1)
        dq = torch.zeros_like(qs)
        for j in range(n):
            dq += attend_pieces_backward(dos, qs, ks[j], vs[j], lse, delta, pieces[rank], pieces[j], causal)[0]
        return dq
    return work


def time_rank_alone(seq_len: int, n: int, rank: int = 0, repeats: int = 3, **kw) -> list[float]:
    """Seconds per forward + backward of rank `rank`'s ring-attention work, in this process alone
    (one warm-up first)."""
    work = rank_work(seq_len, n, rank, **kw)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        work()
        current().synchronize()  # on cuda: the work done, not only queued
        if i:
            times.append(time.perf_counter() - t0)
    return times


def ring_overlap(cluster, shard_len: int, *, heads: int, head_dim: int, dtype=torch.float32,
                 kv_heads: int | None = None, layout: str = "zigzag") -> dict:
    """One causal ring step of `shard_len` rows per rank on every engine of `cluster` (a
    `pipelib.Cluster`), every clock reset first so the trace holds this step only: the seconds
    its forward waited for K/V blocks, all ranks added (`costs.forward_wait`), and the worst
    rank's `costs.overlap_stats` (transfer, waited, hidden, step_over_compute)."""
    cluster.reset()
    cluster.run(attention_step, "ring", cluster.world_size * shard_len, heads=heads, head_dim=head_dim,
                layout=layout, dtype=dtype, kv_heads=kv_heads)
    trace = cluster.trace()
    return {"shard_len": shard_len, "forward_wait": forward_wait(trace), **overlap_stats(trace)}
