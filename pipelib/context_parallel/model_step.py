"""Context parallelism across a whole model: a tiny-GPT training step with the sequence sharded.

Attention is the only layer that mixes positions, so everything else runs on a rank's shard of
the sequence as it would on the whole: the embedding, LayerNorms, MLPs and the head are
position-wise. What a whole model adds to chapter 17's attention (Megatron-LM's and
DeepSpeed-Ulysses' context parallelism do the same):

- **positions**: a rank embeds its tokens at their *global* positions, which under the zigzag
  and striped layouts are not 0..c-1 (`partition.shard_positions`; the tiny GPT learns its
  position embeddings, a RoPE model rotates by the same global indices);
- **labels**: the next-token targets are cut with the same permutation as the tokens;
- **the loss**: each rank sums its tokens' cross-entropy and divides by the *global* token
  count, so the ranks' losses add up to the mean over the whole sequence (a mean per shard
  would weight shards, not tokens);
- **weight gradients**: every rank holds the whole model but saw only its tokens, so its
  gradients are partial: one all-reduce (sum) over the cp group completes them (Megatron folds
  the cp group into its data-parallel gradient reduction).

Attention itself is `ring.ring_attention` over the cp group. Every rank then takes the same
optimizer step on the same gradients, so the weights stay identical, and the run equals one
process training on the whole sequence (`reference_train`).

A strategy core: it runs under plain torch.distributed with the group it is given (no cluster).
Introduced in chapter 17.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipelib.comm.collectives import all_reduce
from pipelib.context_parallel.apply import sum_flat
from pipelib.context_parallel.partition import check_layout, shard_positions
from pipelib.context_parallel.ring import ring_attention
from pipelib.model import GPT, GPTConfig
from pipelib.results import StepResult


def token_batch(config: GPTConfig, batch: int, seq_len: int, seed: int = 0):
    """(idx, targets), each (B, S): rows that count modulo the vocabulary from a random start by a
    random stride (token t = start + stride t), and the next token of each, the same on every
    rank for one seed. Predicting the next token needs the two before it, so attention has
    something to learn and the loss falls in a few steps."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(config.vocab_size, (batch, 1), generator=g)
    stride = torch.randint(1, config.vocab_size, (batch, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % config.vocab_size   # (B, S + 1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def shard_batch(idx, targets, n: int, rank: int, layout: str = "zigzag"):
    """Rank `rank`'s (idx, targets, positions): the columns at its global positions under
    `layout`, the targets permuted with the tokens."""
    pos = shard_positions(idx.shape[1], n, rank, layout)
    return idx[:, pos], targets[:, pos], pos


def _attention(attn, x, group, layout: str):
    """`CausalSelfAttention.forward` with its core replaced by ring attention over `group`."""
    B, T, _ = x.shape                                               # T: this rank's shard, c
    q, k, v = attn.c_attn(x).chunk(3, dim=2)                        # 3 x (B, c, nh * hs)
    nh = attn.n_head
    q, k, v = (t.view(B, T, nh, -1).transpose(1, 2) for t in (q, k, v))   # (B, nh, c, hs)
    y = ring_attention(q, k, v, group, layout=layout, causal=True)  # (B, nh, c, hs)
    y = y.transpose(1, 2).contiguous().view(B, T, -1)               # (B, c, nh * hs)
    return attn.resid_dropout(attn.c_proj(y))                       # (B, c, C)


def cp_loss(model: GPT, idx, targets, positions, global_tokens: int, group, layout: str = "zigzag"):
    """This rank's share of the mean next-token loss: the sum of its tokens' cross-entropy over
    the global token count (the shares add up to the whole sequence's mean)."""
    x = model.embed(idx, positions)                                 # (B, c, C) at global positions
    for block in model.blocks:
        x = x + _attention(block.attn, block.ln_1(x), group, layout)
        x = x + block.mlp(block.ln_2(x))
    logits = model.head(x)                                          # (B, c, V)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="sum") / global_tokens


def _optimizer(model, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)


def cp_train(config: GPTConfig, batch: int, seq_len: int, steps: int = 3, *, group=None, layout: str = "zigzag",
             lr: float = 1e-2, seed: int = 0, dtype=torch.float64) -> StepResult | None:
    """`steps` AdamW steps of `GPT(config, seed)` with the sequence split over `group` (None: the
    world) under `layout`; None on a rank outside the group. Every step trains on the same
    batch, `token_batch(config, batch, seq_len, seed)` (this rank's shard of it), so the loss
    visibly falls in a few steps. Returns the global
    loss of each step (all-reduced), the last step's full gradients and the parameters after the
    run, under the single-process model's names."""
    if dist.get_rank(group) < 0:
        return None
    if config.dropout:
        raise ValueError(f"cp_train: dropout={config.dropout} would draw different masks on each rank "
                         f"and in one process; use dropout=0.0 to compare with `reference_train`")
    n, me = dist.get_world_size(group), dist.get_rank(group)
    check_layout(seq_len, n, layout, context=f"rank {dist.get_rank()}: cp_train")
    model = GPT(config, seed=seed).to(dtype)
    opt, losses = _optimizer(model, lr), []
    params = [p for p in model.parameters()]                         # the tied head weight once
    idx, targets, pos = shard_batch(*token_batch(config, batch, seq_len, seed), n, me, layout)
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = cp_loss(model, idx, targets, pos, batch * seq_len, group, layout)
        loss.backward()
        total = loss.detach().reshape(1).clone()
        sum_flat([p.grad for p in params] + [total], group)         # weight gradients and the loss
        losses.append(total.item())
        opt.step()
    names = dict(model.named_parameters())
    return StepResult(loss=losses[-1], losses=tuple(losses),
                      grads={k: p.grad.detach().clone() for k, p in names.items()},
                      params={k: p.detach().clone() for k, p in names.items()},
                      stats={"tokens_per_rank": batch * seq_len // n, "positions": pos})


def cp_first_loss(config: GPTConfig, batch: int, seq_len: int, *, group=None, layout: str = "zigzag",
                  global_positions: bool = True, seed: int = 0, dtype=torch.float64) -> float | None:
    """The global loss of `cp_train`'s first batch before any step (all-reduced); with
    `global_positions=False` each shard is embedded at 0..c-1, the mistake the positions
    argument exists to avoid. None on a rank outside the group."""
    if dist.get_rank(group) < 0:
        return None
    n, me = dist.get_world_size(group), dist.get_rank(group)
    idx, targets, pos = shard_batch(*token_batch(config, batch, seq_len, seed), n, me, layout)
    with torch.no_grad():
        part = cp_loss(GPT(config, seed=seed).to(dtype), idx, targets, pos if global_positions else None,
                       batch * seq_len, group, layout).reshape(1)
    all_reduce(part, "sum", group, label="cp loss all-reduce")
    return part.item()


def check_training(results, reference: StepResult, atol: float = 1e-10) -> float:
    """Assert every rank's losses, last gradients and final parameters equal the single
    process's (`reference_train`) within `atol`; returns the largest |difference|."""
    worst = 0.0
    for r in (r for r in results if r is not None):
        worst = max([worst] + [abs(a - b) for a, b in zip(r.losses, reference.losses, strict=True)])
        for what in ("grads", "params"):
            got, want = getattr(r, what), getattr(reference, what)
            if got.keys() != want.keys():
                raise AssertionError(f"{what}: names differ: {sorted(set(got) ^ set(want))}")
            worst = max([worst] + [(got[k] - want[k]).abs().max().item() for k in want])
    if worst > atol:
        raise AssertionError(f"context-parallel training differs from one process by {worst:.3e} > {atol:g}")
    return worst


def reference_train(config: GPTConfig, batch: int, seq_len: int, steps: int = 3, *, lr: float = 1e-2,
                    seed: int = 0, dtype=torch.float64) -> StepResult:
    """One process, the whole sequence, the same model, data and optimizer as `cp_train`."""
    model = GPT(config, seed=seed).to(dtype)
    opt, losses = _optimizer(model, lr), []
    idx, targets = token_batch(config, batch, seq_len, seed)
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        _, loss = model(idx, targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    names = dict(model.named_parameters())
    return StepResult(loss=losses[-1], losses=tuple(losses),
                      grads={k: p.grad.detach().clone() for k, p in names.items()},
                      params={k: p.detach().clone() for k, p in names.items()})
