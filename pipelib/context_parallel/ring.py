"""Ring attention (Liu, Zaharia & Abbeel 2023), forward and backward, on pipelib's messages.

Each of the n ranks of `group` holds its sequence shard of Q, K and V, shaped (B, H, c, D)
with c = S / n (which positions: `pipelib.context_parallel.partition`). Forward, step
s = 0..n-1: rank r holds the K/V block of rank r - s. It first *posts* the send of that block
to rank r + 1 and the receive of the next one from rank r - 1 (non-blocking), then attends its
queries to the block it holds and merges the result (`blockwise.merge_partials`), and only then
waits: the transfer runs while it computes. n - 1 sends of one K/V block each:

    forward bytes per rank  = (n - 1) * 2 B H c D * itemsize

Backward (its own autograd function): the K/V blocks travel the ring again, and with each
block its gradient accumulator dK/dV: rank r adds its queries' share to the accumulator of the
block it holds and passes both on; after n steps the accumulator arrives home complete. n
sends of dK/dV and n - 1 of K/V:

    backward bytes per rank = (2n - 1) * 2 B H c D * itemsize

at input width; for 16-bit inputs the ring accumulates dQ and dK/dV, and sends dK/dV, in fp32
(ring-flash-attention does the same), so there the backward is (n - 1) 2N + n 4N.

Grouped-query attention (Ainslie et al. 2023): k and v may carry H_kv heads for q's H, H_kv
dividing H. Only the H_kv heads travel (H in the formulas above becomes H_kv); each block is
expanded to H heads for compute, and its dK/dV summed back over each group's query heads.

Every message is posted before the compute it should hide behind. The last hop of each dK/dV
accumulator home would have nothing to hide behind (its sender's last block is everyone's last
block), so the last step sends dK/dV first and computes part of its dQ (dS K for its last pair
of pieces, one matmul in five) while that hop flies: with long enough shards (about 4 times the
crossover under causal zigzag, `costs.crossover_shard_len`) every transfer is hidden.

Causal masking skips any block in which no query sees any key (no compute, no compute event);
the messages still flow, since later ranks need them. On a simulated device each block's
compute is charged its FLOPs (4 d per visible (query, key) pair forward, 10 d backward), so the
timeline shows the real overlap of transfer and compute.

Compute events are labelled as on every timeline of the book: "F" (one block forward), "B"
(its backward) and "I" (the deferred dQ of the last step, an input gradient). Messages are
labelled ``"ring_attention forward step s chunk j"`` (j: whose K/V block), so
`pipelib.viz.collective_animation` replays who holds which block after each step.

Introduced in chapter 17.
"""
from __future__ import annotations

import contextlib
from types import MappingProxyType

import torch
import torch.distributed as dist

from pipelib.comm import p2p
from pipelib.comm.agreement import check_same
from pipelib.context_parallel.blockwise import (
    attend_pieces,
    attend_pieces_backward,
    attention_flops,
    last_visible,
    merge_partials,
    pieces_pairs,
)
from pipelib.context_parallel.partition import check_layout, shard_pieces, tile_pieces, visible_pairs
from pipelib.runtime.device import current

TAG_KV, TAG_KV_BACK, TAG_DKV = 170, 171, 172
_FIELDS = MappingProxyType({"stage": None, "microbatch": None})


def check_shards(name: str, q, k, v, group, layout: str | None, grouped_kv: bool = False,
                 causal: bool | None = None) -> tuple[int, int, int]:
    """Every rank agrees on the shard's shape and dtype, and q, k, v agree here; returns
    (n, rank in group, full sequence length). With `grouped_kv` (grouped-query attention, the
    ring only), k and v may carry fewer heads than q, H_kv dividing H. Raises before any message
    is sent. The ranks also agree on `layout` and `causal` in the same header: a rank with
    another layout or mask would return a wrong output without an error."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if me < 0:
        raise ValueError(f"rank {dist.get_rank()}: {name} on a group this rank is not part of")
    if q.dim() != 4 or q.shape[1] < 1 or q.shape[3] < 1:
        raise ValueError(f"rank {dist.get_rank()}: {name}: q has shape {tuple(q.shape)}; pass (B, H, S/n, D) "
                         f"with at least one head (H >= 1) of head_dim D >= 1")
    for t, what in ((k, "k"), (v, "v")):
        heads_ok = t.dim() == 4 and grouped_kv and t.shape[1] > 0 and q.shape[1] % t.shape[1] == 0
        same = t.shape == q.shape or (heads_ok and t.shape[:1] + t.shape[2:] == q.shape[:1] + q.shape[2:])
        if not same or t.dtype != q.dtype or (what == "v" and v.shape != k.shape):
            gqa = ("; k and v may have H_kv heads, H_kv dividing q's H (grouped-query attention)"
                   if grouped_kv else "")
            raise ValueError(f"rank {dist.get_rank()}: {name}: q is {tuple(q.shape)} {q.dtype} but {what} is "
                             f"{tuple(t.shape)} {t.dtype}; pass q, k, v shards of one shape (B, H, S/n, D) "
                             f"and one dtype{gqa}")
    check_same(name, q, group, settings={"layout": layout, "causal": causal})
    if grouped_kv:
        check_same(name + " (k)", k, group)
    if layout is not None:
        check_layout(n * q.shape[2], n, layout, context=f"rank {dist.get_rank()}: {name}")
    return n, me, n * q.shape[2]


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The width dQ and dK/dV are accumulated (and dK/dV sent) at: fp32 for 16-bit inputs, as
    ring-flash-attention does (its `dk = block_dk_buffer.to(torch.float32)`), else the input's."""
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def _expand(kv, group_size: int):
    """(2, B, H_kv, c, D) -> (2, B, H, c, D): each K/V head repeated for its `group_size` query
    heads, in torch's order (query head h reads K/V head h // group_size, `repeat_interleave`)."""
    return kv if group_size == 1 else kv.repeat_interleave(group_size, dim=2)


def _fold(grad, group_size: int):
    """(B, H, c, D) -> (B, H_kv, c, D): the gradients of a repeated K/V head summed over its queries' heads."""
    return grad if group_size == 1 else grad.unflatten(1, (-1, group_size)).sum(2)


DQ_FLOPS_PER_PAIR = 2  # x head_dim x batch x heads: dQ = dS K, the one matmul done after the send


def _deferred_pairs(q_pieces, k_pieces, causal: bool) -> int:
    """Visible pairs of the piece pair whose dQ the last backward step computes after sending."""
    last = last_visible(q_pieces, k_pieces, causal)
    return 0 if last is None else visible_pairs(q_pieces[last[0]][2], k_pieces[last[1]][2], causal)


def _peer(group, p: int) -> int:
    return p if group is None else dist.get_global_rank(group, p)


@contextlib.contextmanager
def held(nbytes: int, what: str):
    """Declare `nbytes` of working buffers on this rank's memory tracker while the block runs
    (a simulated device raises its out-of-memory error here). The sizes are the caller's
    bookkeeping, not an allocator's reading (`ring_buffer_bytes` lists the ring's: every buffer
    it allocates, receive buffers and accumulators included; dO, which autograd owns, and the
    temporaries inside one block's compute are not declared, chapter 17 says so)."""
    mem = current().memory
    mem.add("buffers", nbytes, what)
    try:
        yield
    finally:
        mem.bytes["buffers"] -= nbytes


def ring_buffer_bytes(q, k, n: int, backward: bool) -> int:
    """Bytes of the ring's working buffers on one rank (`costs.ring_memory` is the same count
    from the shapes): the K/V block in hand and, with n > 1, the receive buffer of the next one
    (H_kv heads, input width); with grouped-query attention the block expanded to H heads for
    compute. Backward adds the dK/dV accumulator and, with n > 1, the incoming one (H_kv heads,
    `accumulator_dtype`), the dQ accumulator (H heads, accumulator width) and one block's
    dQ, dK, dV at H heads and input width (`blockwise.attend_pieces_backward`'s result)."""
    kv = 2 * k.numel() * k.element_size()
    ring = n > 1
    total = kv * (1 + ring) + (2 * q.numel() * q.element_size() if k.shape[1] != q.shape[1] else 0)
    if backward:
        acc = torch.empty((), dtype=accumulator_dtype(q.dtype), device=q.device).element_size()
        total += 2 * k.numel() * acc * (1 + ring) + q.numel() * acc + 3 * q.numel() * q.element_size()
    return total


def _exchange(send, recv, group, me, n, tag, label):
    """Post the receive from the left neighbour and the send to the right one, as one exchange
    (one batch under NCCL's rules: on 2 ranks left and right are the same peer); the handles."""
    return p2p.post_batch([("recv", recv, _peer(group, (me - 1) % n), label),
                           ("send", send, _peer(group, (me + 1) % n), label)], group, tag, _FIELDS, False)


def score_bytes(q, pieces, heads: int | None = None) -> int:
    """The largest score block the blockwise routine holds at once: S and P, each
    (B, heads, p, p) for the longest piece p (`heads`: q's unless given)."""
    longest = max(b - a for a, b, _ in pieces)
    return 2 * q.shape[0] * (heads or q.shape[1]) * longest * longest * q.element_size()


class RingAttention(torch.autograd.Function):
    """Ring attention as one autograd function: `ring_attention` is the way to call it."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout, causal, stats, tile):
        n, me, seq = check_shards("ring_attention", q, k, v, group, layout, grouped_kv=True, causal=causal)
        dev, (B, H, _, D), g = current(), q.shape, q.shape[1] // k.shape[1]
        pieces = [tile_pieces(shard_pieces(seq, n, r, layout), tile) for r in range(n)]
        kv = torch.stack([k, v]).detach()                            # (2, B, H_kv, c, D): one message
        out = lse = None
        pairs = 0
        with held(ring_buffer_bytes(q, k, n, False) + score_bytes(q, pieces[me]), "ring K/V buffers and scores"):
            for step in range(n):
                src = (me - step) % n                               # whose K/V block rank me holds
                if step < n - 1:                                    # post first: it flies while we compute
                    nxt = torch.empty_like(kv)
                    hs = _exchange(kv, nxt, group, me, n, TAG_KV, f"ring_attention forward step {step} chunk {src}")
                p = pieces_pairs(pieces[me], pieces[src], causal)   # 0: causal mask hides the block
                if p:
                    with dev.compute("F", flops=attention_flops(p, B, H, D)):      # one bar per block
                        kx = _expand(kv, g)                         # GQA: H_kv heads travel, H compute
                        b_out, b_lse, _ = attend_pieces(q.detach(), kx[0], kx[1], pieces[me], pieces[src], causal)
                        out, lse = merge_partials(out, lse, b_out, b_lse)
                pairs += p
                if step < n - 1:
                    p2p.wait_all(hs)
                    kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = (group, causal, stats, pieces, n, me)
        if stats is not None:
            stats["pairs_forward"] = stats.get("pairs_forward", 0) + pairs
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, stats, pieces, n, me = ctx.setup
        dev, (B, H, _, D), g = current(), q.shape, q.shape[1] // k.shape[1]
        acc = accumulator_dtype(q.dtype)                            # fp32 for 16-bit inputs
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)                                # (B, H, c)
        dq = torch.zeros_like(q, dtype=acc)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv, dtype=acc)                       # the accumulator of the block held
        pairs, d_hs = 0, []
        with held(ring_buffer_bytes(q, k, n, True) + score_bytes(q, pieces[me]), "ring backward buffers"):
            for step in range(n):
                src = (me - step) % n
                if step < n - 1:
                    nxt = torch.empty_like(kv)
                    hs = _exchange(kv, nxt, group, me, n, TAG_KV_BACK,
                                   f"ring_attention_backward kv step {step} chunk {src}")
                p = pieces_pairs(pieces[me], pieces[src], causal)
                last = step == n - 1 and n > 1                      # keep some dQ work for the last hop
                later = _deferred_pairs(pieces[me], pieces[src], causal) if last else 0
                if p:
                    flops = attention_flops(p, B, H, D, backward=True) - DQ_FLOPS_PER_PAIR * later * B * H * D
                    with dev.compute("B", flops=flops):
                        kx = _expand(kv, g)
                        gq, gk, gv, _, *deferred = attend_pieces_backward(
                            dout, q, kx[0], kx[1], lse, delta, pieces[me], pieces[src], causal, defer_last_dq=last)
                        dq += gq
                pairs += p
                if d_hs:                                            # block src's accumulator, from the left
                    p2p.wait_all(d_hs)
                    dkv = incoming  # noqa: F821 (bound before the first wait: d_hs is empty until then)
                if p:
                    dkv[0] += _fold(gk, g)                          # GQA: summed over the group's heads
                    dkv[1] += _fold(gv, g)
                if n > 1:                                           # pass it on: it comes home after n steps
                    incoming = torch.empty_like(dkv)
                    d_hs = _exchange(dkv, incoming, group, me, n, TAG_DKV,
                                     f"ring_attention_backward grads step {step} chunk {src}")
                if later:                                           # while my block's last hop flies
                    qa, qb, finish, _ = deferred[0]
                    with dev.compute("I", flops=DQ_FLOPS_PER_PAIR * later * B * H * D):   # dQ: an input gradient
                        dq[:, :, qa:qb] += finish()
                if step < n - 1:
                    p2p.wait_all(hs)
                    kv = nxt
            if n > 1:
                p2p.wait_all(d_hs)                                  # my own block's gradient, complete
                dkv = incoming
        if stats is not None:
            stats["pairs_backward"] = stats.get("pairs_backward", 0) + pairs
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def ring_attention(q, k, v, group=None, *, layout: str = "zigzag", causal: bool = True, stats: dict | None = None,
                   tile: int | None = None):
    """Attention of this rank's query shard to the whole sequence, the K/V shards passed round
    the ring of `group`. q, k, v: (B, H, S/n, D), this rank's shard under `layout` ("zigzag",
    "contiguous" or "striped"). Returns this rank's output shard; differentiable. `stats`, if
    given, receives the visible (query, key) pairs computed forward and backward. `tile`: rows
    per attention tile inside a shard (flash-attention's blocks; None: whole pieces), which
    bounds the score block at tile^2 entries. Grouped-query attention: k and v may carry H_kv
    heads, H_kv dividing q's H; only those travel round the ring (query head h reads K/V head
    h // (H / H_kv), as `scaled_dot_product_attention(..., enable_gqa=True)`)."""
    return RingAttention.apply(q, k, v, group, layout, causal, stats, tile)

