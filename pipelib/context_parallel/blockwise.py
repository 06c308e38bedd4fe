"""Attention one block of keys at a time, and the online-softmax merge that makes it exact.

For one query row with scores s_j = q.k_j / sqrt(d) the output is sum_j softmax(s)_j v_j.
Split the keys into blocks. A block b alone gives its own output o_b (softmax over its keys
only) and its log-sum-exp lse_b = log sum_{j in b} exp(s_j). Two blocks merge exactly:

    lse = log(exp(lse_a) + exp(lse_b))                 # = logaddexp(lse_a, lse_b)
    o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b   # each block weighted by its share

(the running max of flash-attention, Dao et al. 2022, hides in logaddexp, which subtracts the
larger argument before exponentiating). The merge is associative and commutative, so partial
results from K/V blocks arriving in *any* order, on any rank, give the same answer: ring
attention is this merge applied once per ring step. ring-flash-attention writes the same
update as ``o = o - sigmoid(lse_b - lse_a) (o - o_b)``.

The backward pass needs no softmax matrix from the forward: with the final lse and
delta = rowsum(dO * O), each block recomputes P = exp(S - lse) and gives its share of
dQ, dK, dV (flash-attention's backward): dV = P^T dO, dS = P (dO V^T - delta),
dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d).

Masks come from global positions (`pipelib.context_parallel.partition`), so one routine serves
every layout: a pair of pieces where no query sees any key is skipped, a pair where every
query sees every key needs no mask. Work is counted in visible (query, key) pairs: a forward
pair costs 4 d FLOPs per head (two matmuls), a backward pair 10 d (five).

No process group and no runtime module: tensors in, tensors out. Introduced in chapter 17.
"""
from __future__ import annotations

import math

import torch

from pipelib.context_parallel.partition import visible_pairs

FWD_FLOPS_PER_PAIR = 4   # x head_dim x batch x heads: S = Q K^T and O = P V
BWD_FLOPS_PER_PAIR = 10  # recompute S, then dV, dP, dQ, dK


def merge_partials(out, lse, block_out, block_lse):
    """Merge a block's (output, lse) into the running (out, lse); either may be None (empty).

    Rows no key has reached yet have lse = -inf and output 0; they stay exact."""
    if out is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
    out = torch.exp(lse - safe).unsqueeze(-1) * out + torch.exp(block_lse - safe).unsqueeze(-1) * block_out
    return out, new_lse


def _mask(q_pos, k_pos, causal: bool):
    """None (every pair visible), False (no pair visible: skip) or a (q, k) boolean mask."""
    if not causal or int(k_pos.max()) <= int(q_pos.min()):
        return None
    if int(k_pos.min()) > int(q_pos.max()):
        return False
    return k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)


def block_attention(q, k, v, q_pos, k_pos, causal: bool, scale: float | None = None):
    """Attention of queries `q` (B, H, sq, D) to one block of keys/values (B, H, sk, D):
    (out, lse), or None when causal masking hides the whole block."""
    mask = _mask(q_pos, k_pos, causal)
    if mask is False:
        return None
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale                               # (B, H, sq, sk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)                                        # the running max
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)            # rows with no key
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)                                         # (B, H, sq, 1)
    out = (p @ v) / torch.where(l > 0, l, torch.ones_like(l))
    return out, (m + torch.log(l)).squeeze(-1)                          # lse: (B, H, sq)


def block_attention_backward(dout, q, k, v, lse, delta, q_pos, k_pos, causal: bool, scale: float | None = None,
                             dq_later: bool = False):
    """One block's share of (dQ, dK, dV), from the *final* lse and delta = rowsum(dO * O);
    None when the block is fully masked. With `dq_later`, dQ is a function that computes it
    (dS K, one matmul of the five) when called: ring attention sends dK/dV first."""
    mask = _mask(q_pos, k_pos, causal)
    if mask is False:
        return None
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))                                # the softmax, recomputed
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    dq = (lambda: ds @ k * scale) if dq_later else ds @ k * scale
    return dq, ds.transpose(-2, -1) @ q * scale, dv


def attend_pieces(q, k, v, q_pieces, k_pieces, causal: bool, scale=None):
    """Queries of `q_pieces` against keys of `k_pieces` (lists of (start, stop, positions), see
    `partition.shard_pieces`), merged per query piece: (out, lse, visible pairs). Rows that see
    no key have lse = -inf and output 0."""
    B, H, sq, D = q.shape
    out = q.new_zeros(B, H, sq, v.shape[-1])
    lse = q.new_full((B, H, sq), float("-inf"))
    pairs = 0
    for qa, qb, qp in q_pieces:
        o, l = None, None
        for ka, kb, kp in k_pieces:
            r = block_attention(q[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb], qp, kp, causal, scale)
            if r is not None:
                o, l = merge_partials(o, l, *r)
                pairs += visible_pairs(qp, kp, causal)
        if o is not None:
            out[:, :, qa:qb], lse[:, :, qa:qb] = o, l
    return out, lse, pairs


def attend_pieces_backward(dout, q, k, v, lse, delta, q_pieces, k_pieces, causal: bool, scale=None,
                           defer_last_dq: bool = False):
    """(dQ, dK, dV, visible pairs) of `attend_pieces`' block, given the final lse and delta.
    With `defer_last_dq`, the dQ of the last visible pair of pieces is left out and a fifth item
    returned: (start, stop, function adding it to dQ[start:stop], its visible pairs), or None."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    pairs, deferred = 0, None
    last = last_visible(q_pieces, k_pieces, causal) if defer_last_dq else None
    for i, (qa, qb, qp) in enumerate(q_pieces):
        for j, (ka, kb, kp) in enumerate(k_pieces):
            r = block_attention_backward(dout[:, :, qa:qb], q[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb],
                                         lse[:, :, qa:qb], delta[:, :, qa:qb], qp, kp, causal, scale,
                                         dq_later=(i, j) == last)
            if r is not None:
                n_pairs = visible_pairs(qp, kp, causal)
                if (i, j) == last:
                    deferred = (qa, qb, r[0], n_pairs)
                else:
                    dq[:, :, qa:qb] += r[0]
                dk[:, :, ka:kb] += r[1]
                dv[:, :, ka:kb] += r[2]
                pairs += n_pairs
    return (dq, dk, dv, pairs, deferred) if defer_last_dq else (dq, dk, dv, pairs)


def last_visible(q_pieces, k_pieces, causal: bool):
    """(i, j) of the last pair of pieces with a visible (query, key) pair, or None."""
    hits = [(i, j) for i, (_, _, qp) in enumerate(q_pieces) for j, (_, _, kp) in enumerate(k_pieces)
            if visible_pairs(qp, kp, causal)]
    return hits[-1] if hits else None


def pieces_pairs(q_pieces, k_pieces, causal: bool) -> int:
    """Visible (query, key) pairs between two shards, without computing anything."""
    return sum(visible_pairs(qp, kp, causal) for _, _, qp in q_pieces for _, _, kp in k_pieces)


def attention_flops(pairs: int, batch: int, heads: int, head_dim: int, backward: bool = False) -> int:
    """FLOPs of `pairs` visible (query, key) pairs: 4 d per pair forward, 10 d backward."""
    return (BWD_FLOPS_PER_PAIR if backward else FWD_FLOPS_PER_PAIR) * pairs * batch * heads * head_dim
