"""The vocabulary split over the group: embedding, tied head, and a cross-entropy that never
gathers the logits (Megatron-LM §3; its VocabParallelEmbedding and vocab-parallel loss).

Rank r holds rows [r V/t, (r+1) V/t) of the token embedding. A token outside its rows looks up
nothing (zeros), so the t lookups are partial sums: one all-reduce (`g`) gives every rank the
embedding, or under sequence parallelism one reduce-scatter gives each its sequence shard.

The GPT's head is tied to the embedding (Press & Wolf 2017): `VocabParallelHead` uses the very
same shard Parameter, so rank r's logits are those of its V/t tokens, and the shard's gradient
sums the embedding's and the head's contributions locally, as the unsharded tie does.

The loss needs softmax over all V logits, yet (B, T, V) never travels: per token, one
all-reduce of the local maxima (op max, B T numbers), one of the local sums of exponentials and
of the target's logit (held by one rank, 0 elsewhere: 2 B T numbers). Backward needs no
communication: d loss / d logit = softmax - onehot, each rank on its own columns.
Introduced in chapter 09.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipelib.tensor_parallel.layers import _tp_param
from pipelib.tensor_parallel.ops import (
    TPComm,
    all_reduce_tp,
    copy_to_tp,
    gather_sequence,
    reduce_from_tp,
    scatter_sequence,
    seq_shard,
)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the embedding; partial lookups summed over the group."""

    def __init__(self, emb: nn.Embedding, comm: TPComm, *, sequence_parallel: bool = False,
                 label: str = "wte"):
        super().__init__()
        t, r = comm.size, comm.rank
        self.comm, self.sequence_parallel, self.label = comm, sequence_parallel, label
        self.num_embeddings, self.embedding_dim = emb.num_embeddings // t, emb.embedding_dim
        self.start = r * self.num_embeddings
        self.weight = _tp_param(emb.weight.detach().chunk(t, dim=0)[r].clone(), 0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) int64
        outside = (idx < self.start) | (idx >= self.start + self.num_embeddings)  # (B, T)
        local = (idx - self.start).masked_fill(outside, 0)  # (B, T), in [0, V/t)
        x = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)  # (B, T, C) partial
        if self.sequence_parallel:
            return scatter_sequence(x, self.comm, self.label)  # (B, T/t, C)
        return reduce_from_tp(x, self.comm, self.label)  # (B, T, C)


class PositionShard(nn.Module):
    """The position embedding under sequence parallelism: rank r keeps positions
    [r T/t, (r+1) T/t) of the lookup; its weight is replicated and its gradient summed later."""

    def __init__(self, emb: nn.Embedding, comm: TPComm):
        super().__init__()
        self.comm, self.num_embeddings = comm, emb.num_embeddings
        self.weight = _tp_param(emb.weight.detach().clone(), None)
        self.weight.tp_sequence = True

    def forward(self, pos: torch.Tensor) -> torch.Tensor:  # (T,)
        return seq_shard(F.embedding(pos, self.weight), self.comm, dim=0)  # (T/t, C)


class VocabParallelHead(nn.Module):
    """Logits of this rank's V/t tokens, x @ W_r^T with W_r the embedding's shard (the tie)."""

    def __init__(self, weight: nn.Parameter, start: int, comm: TPComm, *, sequence_parallel: bool = False,
                 label: str = "lm_head"):
        super().__init__()
        self.comm, self.sequence_parallel, self.label, self.start = comm, sequence_parallel, label, start
        self.weight = weight  # the VocabParallelEmbedding's Parameter: one tensor, two uses

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) or (B, T/t, C)
        if self.sequence_parallel:
            x = gather_sequence(x, self.comm, self.label)  # (B, T, C)
        else:
            x = copy_to_tp(x, self.comm, self.label)  # (B, T, C)
        return F.linear(x, self.weight)  # (B, T, V/t)


class _TPVocabCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, start, comm):  # (N, V/t), (N,)
        n, v = logits.shape
        m = all_reduce_tp(logits.max(dim=-1).values, comm, "cross-entropy max forward", op="max")  # (N,)
        z = logits - m.unsqueeze(-1)  # (N, V/t), <= 0
        mine = (targets >= start) & (targets < start + v)  # (N,)
        local = (targets - start).masked_fill(~mine, 0)  # (N,)
        rows = torch.arange(n, device=logits.device)
        target_logit = z[rows, local].masked_fill(~mine, 0.0)  # (N,), nonzero on one rank
        e = z.exp()  # (N, V/t)
        both = all_reduce_tp(torch.stack([e.sum(dim=-1), target_logit]), comm,
                             "cross-entropy sum-exp and target forward")  # (2, N)
        sum_exp, target_logit = both[0], both[1]
        ctx.save_for_backward(e.div_(sum_exp.unsqueeze(-1)), mine, local)  # softmax (N, V/t)
        return sum_exp.log() - target_logit  # (N,) per-token loss

    @staticmethod
    def backward(ctx, grad):  # (N,)
        softmax, mine, local = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.size(0), device=g.device)
        g[rows, local] -= mine.to(g.dtype)  # softmax - onehot, on this rank's columns only
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, comm: TPComm,
                                 start: int) -> torch.Tensor:
    """Mean cross-entropy of (B, T, V/t) local logits (columns [start, start + V/t)) against
    (B, T) targets, equal to `pipelib.model.cross_entropy` on the gathered logits, which never
    exist anywhere. Sends 2 (t-1)/t (B T + 2 B T) numbers per rank, forward only."""
    per_token = _TPVocabCE.apply(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), start, comm)
    return per_token.mean()
