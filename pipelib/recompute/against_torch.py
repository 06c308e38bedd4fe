"""The same model through torch's own activation checkpointing, to compare with ours.

    loss, grads = torch_checkpoint_step(cfg, "full", batch=4)     # torch.utils.checkpoint per block
    loss, grads = torch_checkpoint_step(cfg, "core", batch=4)     # ... around the attention core
    loss, grads = torch_checkpoint_step(cfg, "sac", batch=4)      # selective activation checkpoint

- "full": each block's forward through `torch.utils.checkpoint.checkpoint(use_reentrant=False)`;
- "core": the attention core through it (the selective policy, written with torch's tool);
- "sac": each block through it with `create_selective_checkpoint_contexts` (torch >= 2.4), a
  policy saying which ops' outputs to keep (`KEEP_OPS`: the Linear layers' matmuls, the
  LayerNorms, the GELU, the residual adds); the rest is recomputed: the attention core (its two
  batched matmuls, scaling, mask, softmax, dropout), views and dropout masks. It runs on CPU.
  (A policy that keeps the dropout's `empty_like` fails: CPU dropout fills that tensor in place
  with `bernoulli_`, and torch refuses a cached tensor that was mutated.)

Applied from outside like ours (instance attributes on a model built here). Same seed, batch and
dropout seed as `pipelib.recompute.measure.measure_policy`, so the two compare directly.
torch's checkpoint keeps its tensors behind its own saved-tensor hooks, which hide them from an
outer hook: the memory tracker cannot count them, so only values are compared here.

Chapter 14.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

from pipelib.model import GPT, Block, CausalSelfAttention
from pipelib.recompute.measure import step_tokens

TORCH_MODES = ("full", "core", "sac")
_aten = torch.ops.aten
KEEP_OPS = {_aten.mm.default, _aten.addmm.default, _aten.native_layer_norm.default,
            _aten.gelu.default, _aten.add.Tensor}


def _sac_policy(ctx, op, *args, **kwargs):
    """Keep the outputs of `KEEP_OPS`; recompute the rest (the attention core) in backward."""
    if op in KEEP_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _torch_wrap(fn, **kw):
    def forward(*xs):
        return checkpoint(fn, *xs, use_reentrant=False, **kw)
    return forward


def torch_checkpoint_step(cfg, mode: str, batch: int = 4, seq: int | None = None, *,
                          model_seed: int = 0, batch_seed: int = 0, dropout_seed: int = 0,
                          dtype=torch.float32):
    """One forward and backward with torch's checkpoint in `mode`: (loss, {name: grad})."""
    if mode not in TORCH_MODES:
        raise ValueError(f"unknown torch checkpoint mode {mode!r}; choose one of {TORCH_MODES}")
    model = GPT(cfg, seed=model_seed).to(dtype)
    for m in model.modules():
        if mode in ("full", "sac") and isinstance(m, Block):
            kw = {"context_fn": partial(create_selective_checkpoint_contexts, _sac_policy)} \
                if mode == "sac" else {}
            m.forward = _torch_wrap(type(m).forward.__get__(m), **kw)
        elif mode == "core" and isinstance(m, CausalSelfAttention):
            m.core = _torch_wrap(type(m).core.__get__(m))
    idx, targets = step_tokens(cfg, batch, seq or cfg.block_size, batch_seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(dropout_seed)
        _, loss = model(idx, targets)
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}
