"""Context parallelism across a whole model: a tiny-GPT training step with the sequence sharded.

Attention is the only layer that mixes positions, so everything else runs on a rank's shard of
the sequence as it would on the whole: the embedding, LayerNorms, MLPs and the head are
position-wise. What a whole model adds to chapter 17's attention (Megatron-LM's and
DeepSpeed-Ulysses' context parallelism do the same):

- **positions**: a rank embeds its tokens at their *global* positions, which under the zigzag
  and striped layouts are not 0..c-1 (`partition.shard_positions`; the tiny GPT learns its
  position embeddings, a RoPE model rotates by the same global indices);
- **labels**: the next-token targets are cut with the same permutation as the tokens;
- **the loss**: every rank holds the same number of tokens, so the mean over the whole
  sequence is the mean of the ranks' means (with uneven shards it would have to weight them);
- **weight gradients**: every rank holds the whole model but saw only its tokens, so its
  gradients are partial: one all-reduce over the cp group averages them (Megatron folds the
  cp group into its data-parallel gradient reduction).

The model is made context-parallel from outside by `apply.apply_context_parallel` (ring
attention over the cp group in every block, global positions in the embedding), the same
function `pipelib.parallelize` composes with the other axes: this runner is that core on the
group it is given. Every rank then takes the same optimizer step on the same gradients, so the
weights stay identical, and the run equals one process training on the whole sequence
(`cp_recipe(...).reference()`).

A strategy core: it runs under plain torch.distributed with the group it is given (no cluster).
Introduced in chapter 17.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.comm.collectives import all_reduce
from pipelib.context_parallel.apply import apply_context_parallel, shard_tokens, sum_flat
from pipelib.context_parallel.partition import check_layout, shard_positions
from pipelib.model import GPTConfig
from pipelib.results import StepResult
from pipelib.runtime.place import to_rank_device


def cp_recipe(config: GPTConfig, batch: int, seq_len: int, steps: int = 3, *, lr: float = 1e-2, seed: int = 0,
              dtype=torch.float64):
    """The recipe of `cp_train`: AdamW on `GPT(config, seed)`, `batch` rows of `seq_len` tokens per
    step that count modulo the vocabulary (`pipelib.batches`' "counting" data: predicting a token
    needs the two before it, so attention has something to learn and the loss falls in a few
    steps). Its `reference()` is the single process on the whole sequence."""
    from pipelib.recipe import Recipe

    return Recipe(config, batch_size=batch, steps=steps, seed=seed, data_seed=seed, optimizer="adamw", lr=lr,
                  dtype=dtype, seq_len=seq_len, data="counting")


def _context_parallel_model(recipe, group, layout: str, context: str, global_positions: bool = True):
    n = dist.get_world_size(group)
    if recipe.model.dropout:
        raise ValueError(f"{context}: dropout={recipe.model.dropout} would draw different masks on each rank "
                         f"and in one process; use dropout=0.0 to compare with `cp_recipe(...).reference()`")
    check_layout(recipe.seq_len, n, layout, context=f"rank {dist.get_rank()}: {context}")
    model = to_rank_device(recipe.build())
    apply_context_parallel(model, group, layout, global_positions=global_positions)
    return model


def cp_train(config: GPTConfig, batch: int, seq_len: int, steps: int = 3, *, group=None, layout: str = "zigzag",
             lr: float = 1e-2, seed: int = 0, dtype=torch.float64) -> StepResult | None:
    """`steps` AdamW steps of `GPT(config, seed)` with the sequence split over `group` (None: the
    world) under `layout`; None on a rank outside the group. Step k trains on this rank's shard
    of the recipe's batch k (`cp_recipe`). Returns the global loss of each step (the mean of the
    ranks', all-reduced with the gradients), the last step's full gradients and the parameters
    after the run, under the single-process model's names."""
    from pipelib.recipe import loss_of

    if dist.get_rank(group) < 0:
        return None
    n, me = dist.get_world_size(group), dist.get_rank(group)
    recipe = cp_recipe(config, batch, seq_len, steps, lr=lr, seed=seed, dtype=dtype)
    model = _context_parallel_model(recipe, group, layout, "cp_train")
    opt, losses = recipe.make_optimizer(model.parameters()), []
    params = [p for p in model.parameters()]                         # the tied head weight once
    for step in range(steps):
        x, y = shard_tokens(*to_rank_device(recipe.global_batch(step)), group, layout)
        opt.zero_grad(set_to_none=False)
        loss = loss_of(model, x, y)                                  # the mean over this rank's tokens
        loss.backward()
        total = loss.detach().reshape(1).clone()
        sum_flat([p.grad for p in params] + [total], group)         # weight gradients and the loss
        for p in params:
            p.grad /= n
        losses.append(total.item() / n)
        opt.step()
    names = dict(model.named_parameters())
    return StepResult(loss=losses[-1], losses=tuple(losses),
                      grads={k: p.grad.detach().clone() for k, p in names.items()},
                      params={k: p.detach().clone() for k, p in names.items()},
                      stats={"tokens_per_rank": batch * seq_len // n,
                             "positions": shard_positions(seq_len, n, me, layout)})


def cp_first_loss(config: GPTConfig, batch: int, seq_len: int, *, group=None, layout: str = "zigzag",
                  global_positions: bool = True, seed: int = 0, dtype=torch.float64) -> float | None:
    """The global loss of `cp_train`'s first batch before any step (all-reduced); with
    `global_positions=False` each shard is embedded at 0..c-1, the mistake the positions
    argument exists to avoid. None on a rank outside the group."""
    from pipelib.recipe import loss_of

    if dist.get_rank(group) < 0:
        return None
    recipe = cp_recipe(config, batch, seq_len, seed=seed, dtype=dtype)
    model = _context_parallel_model(recipe, group, layout, "cp_first_loss", global_positions)
    with torch.no_grad():
        part = loss_of(model, *shard_tokens(*to_rank_device(recipe.global_batch(0)), group, layout)).reshape(1)
    all_reduce(part, "sum", group, label="cp loss all-reduce")
    return part.item() / dist.get_world_size(group)


def check_training(results, reference: StepResult, atol: float = 1e-10) -> float:
    """Assert every rank's losses, last gradients and final parameters equal the single
    process's (`cp_recipe(...).reference()`) within `atol`; returns the largest |difference|."""
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
