"""Context parallelism by all-gather (Llama 3, Dubey et al. 2024, section 3.3.2): every rank
gathers the whole sequence's K and V, then attends its own queries to all of it.

Each rank holds its (zigzag, contiguous or striped) shard of Q, K, V, (B, H, c, D). Forward:
one ring all-gather of the stacked K/V (`pipelib.comm.collectives.all_gather`), then local
attention; backward: the full dK/dV this rank's queries produced are summed onto their owners
with one reduce-scatter. With N = B H c D itemsize, bytes sent per rank:

    forward  (n - 1) 2N  (all-gather of K/V)      backward  (n - 1) 2N  (reduce-scatter of dK/dV)

The ring's bytes forward, fewer backward (4(n-1)N in all against the ring's (6n-4)N), and
simple; but the rank must hold the whole sequence's K/V (2 n N bytes, growing with S, not S/n)
and the gather is not overlapped with compute here. Llama 3 chose it because with grouped-query
attention K/V are small beside Q, and it makes masks of any shape (document masks) easy.

Introduced in chapter 17.
"""
from __future__ import annotations

import torch

from pipelib.comm.collectives import all_gather, reduce_scatter
from pipelib.context_parallel.blockwise import attend_pieces, attend_pieces_backward, attention_flops, pieces_pairs
from pipelib.context_parallel.partition import shard_pieces, tile_pieces
from pipelib.context_parallel.ring import check_shards, held, score_bytes
from pipelib.runtime.device import current


def gathered_pieces(seq_len: int, n: int, layout: str, shard_len: int):
    """The pieces of the n shards laid end to end (rank order), as after an all-gather."""
    return [(j * shard_len + a, j * shard_len + b, pos)
            for j in range(n) for a, b, pos in shard_pieces(seq_len, n, j, layout)]


def _to_sequence(x, n):
    """(n, B, H, c, D) in rank order -> (B, H, n c, D)."""
    _, B, H, c, D = x.shape
    return x.permute(1, 2, 0, 3, 4).reshape(B, H, n * c, D)


class AllGatherAttention(torch.autograd.Function):
    """All-gather K/V, attend locally; reduce-scatter dK/dV backward."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout, causal, stats, tile):
        n, me, seq = check_shards("allgather_attention", q, k, v, group, layout, causal=causal)
        dev, (B, H, c, D) = current(), q.shape
        mine = tile_pieces(shard_pieces(seq, n, me, layout), tile)
        every = tile_pieces(gathered_pieces(seq, n, layout, c), tile)
        kv = torch.stack([k, v]).detach().unsqueeze(0)                 # (1, 2, B, H, c, D)
        full_bytes = n * kv.numel() * kv.element_size()
        with held(full_bytes + score_bytes(q, mine), "all-gathered K/V and scores"):
            kv_all = all_gather(kv, group, check=False)               # (n, 2, B, H, c, D)
            K, V = _to_sequence(kv_all[:, 0], n), _to_sequence(kv_all[:, 1], n)
            p = pieces_pairs(mine, every, causal)
            with dev.compute("F", flops=attention_flops(p, B, H, D)):
                out, lse, _ = attend_pieces(q.detach(), K, V, mine, every, causal)
        ctx.save_for_backward(q, K, V, out, lse)
        ctx.setup = (group, causal, mine, every, n, p)
        if stats is not None:
            stats["pairs_forward"] = stats.get("pairs_forward", 0) + p
        return out

    @staticmethod
    def backward(ctx, dout):
        q, K, V, out, lse = ctx.saved_tensors
        group, causal, mine, every, n, p = ctx.setup
        dev, (B, H, c, D) = current(), q.shape
        dout = dout.contiguous()
        with held(2 * K.numel() * K.element_size() + score_bytes(q, mine), "full dK/dV and scores"):
            with dev.compute("B", flops=attention_flops(p, B, H, D, backward=True)):
                dq, dK, dV, _ = attend_pieces_backward(dout, q, K, V, lse, (dout * out).sum(-1), mine, every, causal)
            dkv = torch.stack([dK, dV]).view(2, B, H, n, c, D).permute(3, 0, 1, 2, 4, 5).contiguous()
            mine_dkv = reduce_scatter(dkv, "sum", group, check=False)[0]    # (2, B, H, c, D)
        return dq, mine_dkv[0], mine_dkv[1], None, None, None, None, None


def allgather_attention(q, k, v, group=None, *, layout: str = "zigzag", causal: bool = True,
                        stats: dict | None = None, tile: int | None = None):
    """Llama 3's context parallelism: all-gather K/V over `group`, attend locally. Same
    arguments and result as `ring_attention`."""
    return AllGatherAttention.apply(q, k, v, group, layout, causal, stats, tile)
