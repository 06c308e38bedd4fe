"""The same model through torch's own activation checkpointing, to compare with ours.

    loss, grads = torch_checkpoint_step(cfg, "full", batch=4)      # torch.utils.checkpoint per block
    loss, grads = torch_checkpoint_step(cfg, "every_k", 2)         # ... per segment of 2 blocks
    loss, grads = torch_checkpoint_step(cfg, "selective")          # ... around the attention core
    loss, grads = torch_checkpoint_step(cfg, "selective", sac=True)  # selective activation checkpoint

Each policy's twin (its `twin` in `pipelib.recompute.registry`) is one of the functions below:

- `torch_keep_all` (none): nothing;
- `torch_checkpoint_segments` (full, every_k): each segment of k blocks through
  `torch.utils.checkpoint.checkpoint(use_reentrant=False)`, run by its first block as ours is;
- `torch_checkpoint_core` (selective): the attention core through it, or with ``sac=True`` each
  block through it with `create_selective_checkpoint_contexts` (torch >= 2.4), a policy saying
  which ops' outputs to keep (`KEEP_OPS`: the Linear layers' matmuls, the LayerNorms, the GELU,
  the residual adds); the rest is recomputed: the attention core (its two batched matmuls,
  scaling, mask, softmax, dropout), views and dropout masks. It runs on CPU. (A policy that
  keeps the dropout's `empty_like` fails: CPU dropout fills that tensor in place with
  `bernoulli_`, and torch refuses a cached tensor that was mutated.)

Applied from outside like ours (instance attributes on a model built here). Same seed, batch and
dropout seed as `pipelib.recompute.measure.measure_policy`, so the two compare directly.
torch's checkpoint keeps its tensors behind its own saved-tensor hooks, which hide them from an
outer hook: the memory tracker cannot count them, so only values are compared here.

Chapter 14.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from pipelib.model import GPT, Block, CausalSelfAttention
from pipelib.batches import global_batch
from pipelib.recompute.registry import policy_info
from pipelib.runtime.place import rng_devices

_aten = torch.ops.aten
KEEP_OPS = frozenset({_aten.mm.default, _aten.addmm.default, _aten.native_layer_norm.default,
            _aten.gelu.default, _aten.add.Tensor})


def _sac_policy(ctx, op, *args, **kwargs):
    """Keep the outputs of `KEEP_OPS`; recompute the rest (the attention core) in backward."""
    if op in KEEP_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _torch_wrap(fn, **kw):
    def forward(*xs):
        return checkpoint(fn, *xs, use_reentrant=False, **kw)
    return forward


def _no_sac(name: str, sac: bool) -> None:
    if sac:
        raise ValueError(f"sac=True is torch's selective activation checkpoint, the twin of the "
                         f"'selective' policy; policy {name!r} has none")


def torch_keep_all(model, blocks, k, name: str, sac: bool = False) -> None:
    """none's twin: the model as built."""
    _no_sac(name, sac)


def torch_checkpoint_segments(model, blocks, k: int, name: str, sac: bool = False) -> None:
    """full's and every_k's twin: each segment of k blocks under torch's checkpoint, in its first block."""
    _no_sac(name, sac)
    for i in range(0, len(blocks), k):
        members = blocks[i:i + k]
        runs = [type(b).forward.__get__(b) for b in members]

        def segment(x, runs=runs):
            for f in runs:
                x = f(x)
            return x

        members[0].forward = _torch_wrap(segment)
        for b in members[1:]:
            b.forward = _identity


def _identity(x):
    return x


def torch_checkpoint_core(model, blocks, k, name: str, sac: bool = False) -> None:
    """selective's twin: the attention core under torch's checkpoint, or with `sac` every block
    under torch's selective activation checkpoint keeping `KEEP_OPS`."""
    if sac:
        for b in blocks:
            b.forward = _torch_wrap(type(b).forward.__get__(b),
                                    context_fn=partial(create_selective_checkpoint_contexts, _sac_policy))
        return
    for m in model.modules():
        if isinstance(m, CausalSelfAttention):
            m.core = _torch_wrap(type(m).core.__get__(m))


def torch_checkpoint_step(cfg, policy: str, k: int | None = None, batch: int = 4, seq: int | None = None, *,
                          sac: bool = False, model_seed: int = 0, batch_seed: int = 0, dropout_seed: int = 0,
                          dtype=torch.float32):
    """One forward and backward with torch's checkpoint applied as `policy` (with k, as
    `apply_recompute` takes it) is ours: (loss, {name: grad})."""
    model = GPT(cfg, seed=model_seed).to(dtype)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    info = policy_info(policy)
    info.twin(model, blocks, info.segment_length(k, len(blocks)), info.name, sac=sac)
    idx, targets = global_batch(cfg, batch, 0, batch_seed, seq_len=seq)
    with torch.random.fork_rng(devices=rng_devices()):
        torch.manual_seed(dropout_seed)
        _, loss = model(idx, targets)
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}
