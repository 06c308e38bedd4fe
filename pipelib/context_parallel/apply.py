"""Context parallelism applied to an unaware GPT from outside: `parallelize`'s third step.

    cp = apply_context_parallel(model, mesh["cp"])      # ring attention, global positions
    x, y = cp.shard_batch(x, y)                         # this rank's columns of every row
    loss = loss_of(model, x, y); loss.backward()
    cp.after_backward(model)                            # the mean over the cp ranks

The strategy core of `model_step` (chapter 17), as `parallelize` composes it with the other
axes: every attention's core becomes ring attention over the cp group (`attn.core`, the method
selective recomputation also replaces), the embedding is given each column's global position
by a forward pre-hook (parameter names stay the monolith's), and the rows are cut into the
layout's shards. Every rank holds the same number of tokens, so the global mean loss is the
mean of the ranks' means and the weight gradient the mean of theirs: one all-reduce over cp,
as Megatron-LM folds cp into its data-parallel reduction. Introduced in chapter 15.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from pipelib.applied import Applied
from pipelib.comm.collectives import all_reduce
from pipelib.context_parallel.partition import check_layout, shard_positions
from pipelib.context_parallel.ring import ring_attention


def _global_positions(n: int, rank: int, layout: str, module, args, kwargs):
    idx = args[0]  # (B, c) token ids of this rank's shard
    positions = shard_positions(idx.shape[1] * n, n, rank, layout).to(idx.device)
    return args, {**kwargs, "positions": positions}


def apply_context_parallel(model, group, layout: str = "zigzag", *, global_positions: bool = True):
    """Make `model` (the book's GPT, possibly tensor-parallel) run on a shard of the sequence:
    ring attention over `group` in every block, global positions in the embedding
    (`global_positions=False` leaves each shard at 0..c-1: the mistake chapter 17 shows). Returns
    what it leaves on the rank: how it cuts the batch (`shard_tokens`) and the mean of the
    gradients over the group after backward (`sync_context_grads`)."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if global_positions:
        model.embed.register_forward_pre_hook(functools.partial(_global_positions, n, rank, layout),
                                              with_kwargs=True)
    for block in model.blocks:
        block.attn.core = functools.partial(ring_attention, group=group, layout=layout, causal=True)
    return Applied(axis="cp", shard_batch=functools.partial(shard_tokens, group=group, layout=layout),
                   after_backward=functools.partial(_sync_module, group=group))


def shard_tokens(x: torch.Tensor, y: torch.Tensor, group, layout: str = "zigzag"):
    """This rank's columns of (B, T) tokens and targets under `layout`."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    check_layout(x.shape[1], n, layout, context="shard_tokens")
    pos = shard_positions(x.shape[1], n, rank, layout).to(x.device)
    return x[:, pos].contiguous(), y[:, pos].contiguous()


def sum_flat(tensors, group, label: str = "cp gradient all-reduce") -> int:
    """Sum `tensors` over `group` in one all-reduce of their concatenation, written back in
    place; the number of elements."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    all_reduce(flat, "sum", group, label=label)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat.numel()


def _sync_module(module, group) -> int:
    return sync_context_grads(list(module.parameters()), group)


def sync_context_grads(params, group) -> int:
    """Average the gradients of `params` over the cp group in one all-reduce (flattened); the
    number of elements."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0
    n = sum_flat(grads, group)
    for g in grads:
        g /= dist.get_world_size(group)
    return n
