"""DeepSpeed-Ulysses (Jacobs et al. 2023): trade the sequence shard for a head shard.

Each rank holds its sequence shard of Q, K, V for all H heads, (B, H, c, D). One all-to-all
(`pipelib.comm.collectives.all_to_all`) turns it into the *whole* sequence for H / n heads:
rank j receives head group j of every rank's shard. Attention heads are independent, so each
rank then runs ordinary attention on its heads, and a second all-to-all brings the output back
to sequence shards. Backward: the same two all-to-alls in reverse. With N = B H c D itemsize
and an all-to-all sending (n-1)/n of its input, bytes sent per rank:

    forward  (n-1)/n (3N + N)   (Q, K, V in; output back)
    backward (n-1)/n (N + 3N)   (dO in; dQ, dK, dV back)

At a fixed sequence length S (N = B H (S/n) D itemsize shrinks as 1/n) traffic per rank
*falls* as n grows, Jacobs et al.'s claim, where the ring's (6n-4)N = (6 - 4/n) B H S D i
grows towards 6 B H S D i; at a fixed shard length c it rises towards 8N (the ring's grows
without bound). n may not exceed the head count (H % n == 0 here: pipelib's choice; DeepSpeed
also splits uneven heads, its PR #6392), and an all-to-all crosses every link at once: good
inside a node, harder across nodes. A rank holds the same numel as its shard, laid out
differently (the whole sequence, H / n heads), and attends it piece by piece like the ring
(score blocks of H / n heads).

Introduced in chapter 17.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.comm.collectives import all_to_all
from pipelib.context_parallel.allgather import gathered_pieces
from pipelib.context_parallel.blockwise import attend_pieces, attend_pieces_backward, attention_flops, pieces_pairs
from pipelib.context_parallel.partition import tile_pieces
from pipelib.context_parallel.ring import check_shards, held, score_bytes
from pipelib.runtime.device import current


def _seq_to_heads(x, n, group):
    """(m, B, H, c, D) sequence shards -> (m, B, H/n, n c, D): all sequence, my heads."""
    m, B, H, c, D = x.shape
    send = x.view(m, B, n, H // n, c, D).permute(2, 0, 1, 3, 4, 5).contiguous()   # chunk j: head group j
    got = all_to_all(send, group, check=False)                                      # slot i: rank i's shard
    return got.permute(1, 2, 3, 0, 4, 5).reshape(m, B, H // n, n * c, D)


def _heads_to_seq(x, n, group):
    """(m, B, H/n, n c, D) -> (m, B, H, c, D): the inverse all-to-all."""
    m, B, h, S, D = x.shape
    c = S // n
    send = x.view(m, B, h, n, c, D).permute(3, 0, 1, 2, 4, 5).contiguous()          # chunk i: rank i's rows
    got = all_to_all(send, group, check=False)                                      # slot j: head group j
    return got.permute(1, 2, 0, 3, 4, 5).reshape(m, B, n * h, c, D)


class UlyssesAttention(torch.autograd.Function):
    """All-to-all to head shards, local attention, all-to-all back (and the reverse backward)."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout, causal, stats, tile):
        n, me, seq = check_shards("ulysses_attention", q, k, v, group, layout, causal=causal)
        B, H, c, D = q.shape
        if H % n:
            raise ValueError(f"rank {dist.get_rank()}: ulysses_attention: {H} heads do not split over {n} "
                             f"ranks ({H} % {n} = {H % n}); use a number of ranks that divides the heads, "
                             f"or ring_attention, which shards the sequence only")
        dev, every = current(), tile_pieces(gathered_pieces(seq, n, layout, c), tile)
        qkv_bytes = 2 * 3 * q.numel() * q.element_size()
        with held(qkv_bytes + score_bytes(q, every, q.shape[1] // n), "Ulysses Q, K, V and scores"):
            qf, kf, vf = _seq_to_heads(torch.stack([q, k, v]).detach(), n, group)
            p = pieces_pairs(every, every, causal)
            with dev.compute("F", flops=attention_flops(p, B, H // n, D)):
                of, lse, _ = attend_pieces(qf, kf, vf, every, every, causal)
            out = _heads_to_seq(of.unsqueeze(0), n, group)[0]
        ctx.save_for_backward(qf, kf, vf, of, lse)
        ctx.setup = (group, causal, every, n, p, me)
        if stats is not None:
            stats["pairs_forward"] = stats.get("pairs_forward", 0) + p
        return out

    @staticmethod
    def backward(ctx, dout):
        qf, kf, vf, of, lse = ctx.saved_tensors
        group, causal, every, n, p, me = ctx.setup
        dev, (B, h, _, D) = current(), qf.shape
        with held(4 * qf.numel() * qf.element_size() + score_bytes(qf, every), "Ulysses gradients and scores"):
            dof = _seq_to_heads(dout.contiguous().unsqueeze(0), n, group)[0]
            with dev.compute("B", flops=attention_flops(p, B, h, D, backward=True)):
                dq, dk, dv, _ = attend_pieces_backward(dof, qf, kf, vf, lse, (dof * of).sum(-1), every, every, causal)
            g = _heads_to_seq(torch.stack([dq, dk, dv]), n, group)
        return g[0], g[1], g[2], None, None, None, None, None


def ulysses_attention(q, k, v, group=None, *, layout: str = "zigzag", causal: bool = True,
                      stats: dict | None = None, tile: int | None = None):
    """DeepSpeed-Ulysses over `group`. Same arguments and result as `ring_attention`; the heads
    must divide over the ranks."""
    return UlyssesAttention.apply(q, k, v, group, layout, causal, stats, tile)
