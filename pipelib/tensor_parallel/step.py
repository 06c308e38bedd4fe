"""Training steps of the tensor-parallel GPT, run on every engine, against the single process.

    results = cluster.run(tp_train_step, cfg, 4, 16, 2)            # t = 2: ranks 0 and 1
    check_against_reference(results, tp_recipe(cfg, 4, 16).first_step())  # same loss and gradients

The group holds ranks 0 .. t-1 of the world (`tp_group`, made on every rank in the same order);
ranks outside it return None. Group rank 0 returns the `StepResult`: the loss, every gradient
put back together under the unsharded model's names, and the logits gathered (for the check
only: training never gathers them). Introduced in chapter 09.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from pipelib.checks import checked_by
from pipelib.recipe import as_dtype
from pipelib.results import StepResult
from pipelib.runtime.place import to_rank_device


def tp_group(t: int):
    """This rank's group of ranks 0..t-1 (`Mesh.first(t, "tp")`: made once per engine, by every
    rank in the same order); None on ranks outside it."""
    from pipelib.checks import check_int
    from pipelib.runtime.mesh import Mesh

    world = dist.get_world_size()
    check_int(t, "t", context="tp_group", hint=f"the tensor-parallel degree, at most world_size={world}")
    if t > world:
        raise ValueError(f"tp_group: t={t} is larger than the world ({world} ranks); use t <= {world}")
    from pipelib.comm.agreement import agree

    agree("tp_group", None, t=t)  # a t that differs on one rank would make different groups: a hang
    mesh = Mesh.first(t, "tp")
    return mesh["tp"] if mesh.contains else None


def tp_recipe(config, b: int, s: int, *, dtype="float32", seed: int = 0, data_seed: int = 1):
    """The recipe of chapter 09's step: b rows of s tokens (`pipelib.batches.global_batch`, the
    same on every rank), the model from `seed`; `.first_step(keep_logits=True)` is its reference."""
    from pipelib.recipe import Recipe

    return Recipe(config, batch_size=b, seq_len=s, seed=seed, data_seed=data_seed, dtype=dtype)


def _tp_measured_forward(model, tp, idx, targets):
    """`tp.forward_loss` (`apply.tp_forward`) with the bytes autograd saves for backward counted
    on a fresh tracker of this rank's device (parameters excluded): (logits, loss, saved
    activation bytes after the forward)."""
    from pipelib.runtime.device import current
    from pipelib.tensor_parallel.apply import tp_forward

    dev = current()
    with dev.measure(fresh_memory=True):
        tracker = dev.memory  # this scope's own, counting activations even on a real device
        tracker.track_activations = True
        tracker.track_module(model)
        with tracker.saved_activations():
            logits, loss = tp_forward(model, idx, targets, tp.comm, sequence_parallel=tp.sequence_parallel)
    return logits, loss, tracker.bytes["activations"]


def build_tp_gpt(config, t: int, *, plan=None, sequence_parallel: bool = False, vocab: bool = True,
                 dtype: str = "float32", seed: int = 0, backend: str = "pipelib", overlap: bool = False):
    """(model, tp) on this rank: the full GPT(config, seed) split by `plan` (default
    `gpt_tp_plan(vocab=..., sequence_parallel=...)`) and what tensor parallelism leaves on the
    rank (`apply.TensorParallel`: its comm, its group); (None, None) outside the group."""
    from pipelib.model import GPT
    from pipelib.tensor_parallel.apply import apply_tensor_parallel
    from pipelib.tensor_parallel.plan import gpt_tp_plan

    group = tp_group(t)
    if group is None:
        return None, None
    model = to_rank_device(GPT(config, seed).to(as_dtype(dtype)))  # seeded on the CPU, then split
    plan = plan if plan is not None else gpt_tp_plan(vocab=vocab, sequence_parallel=sequence_parallel)
    return model, apply_tensor_parallel(model, group, plan, backend=backend, overlap=overlap)


def _check_tp_call(world_size, config, b, s, t, *, plan=None, sequence_parallel=False, vocab=True,
                   dtype="float32", backend="pipelib", **_):
    from pipelib.tensor_parallel.apply import check_tp_step

    check_tp_step(config, b, s, t, world_size, plan=plan, sequence_parallel=sequence_parallel, vocab=vocab,
                  dtype=dtype, backend=backend)


@checked_by(_check_tp_call)
def tp_train_step(config, b: int, s: int, t: int, *, plan=None, sequence_parallel: bool = False,
                  vocab: bool = True, dtype: str = "float32", seed: int = 0, data_seed: int = 1,
                  backend: str = "pipelib", overlap: bool = False, timed: bool = False) -> StepResult | None:
    """One forward and backward of the TP GPT on ranks 0..t-1 (no optimizer step).

    ``overlap``: the column-parallel layers hide dX's backward collective behind the weight
    gradient (`pipelib.tensor_parallel.overlap`). ``timed``: on a simulated device, the matmul
    FLOPs between collectives advance the clock too (COMPUTE events), so the step has a time.

    stats: `logits` (gathered), `sp_grad_numel` (elements of the sequence-parallel gradient
    all-reduce), `local_params` (this rank's parameter elements), `activation_bytes` (what
    autograd saved for backward on this rank, measured by its device's memory tracker),
    `step_time` (timed: the clock's seconds from the forward to the gradients' last sum)."""
    from pipelib.tensor_parallel.apply import tp_full_gradients
    from pipelib.tensor_parallel.plan import check_sequence_divisible

    from pipelib.runtime.device import current

    model, tp = build_tp_gpt(config, t, plan=plan, sequence_parallel=sequence_parallel, vocab=vocab,
                             dtype=dtype, seed=seed, backend=backend, overlap=overlap)
    if model is None:
        return None
    group = tp.comm.group
    if tp.sequence_parallel:
        check_sequence_divisible(s, t)
    idx, targets = to_rank_device(tp_recipe(config, b, s, data_seed=data_seed).global_batch(0))
    clock = current().clock
    start = clock.now()
    with tp.comm.lanes.timed() if timed else contextlib.nullcontext():
        logits, loss, saved = _tp_measured_forward(model, tp, idx, targets)
        loss.backward()
        sp_numel = tp.after_backward(model) if tp.after_backward is not None else 0
    step_time = clock.now() - start
    grads = tp_full_gradients(model, group)
    logits = logits.detach()
    if logits.size(-1) != config.vocab_size:  # vocabulary-parallel: gather for the check only
        parts = [torch.empty_like(logits) for _ in range(t)]
        dist.all_gather(parts, logits.contiguous(), group=group)
        logits = torch.cat(parts, dim=-1)
    first = dist.get_rank(group) == 0
    stats = {"sp_grad_numel": sp_numel, "local_params": sum(p.numel() for p in model.parameters()),
             "activation_bytes": saved}
    if timed:
        stats["step_time"] = step_time
    if first:
        stats["logits"] = logits
    return StepResult(loss=loss.detach() if first else None, grads=grads if first else {}, stats=stats)


def run_tp(cluster, config, b: int, s: int, t: int, **kw):
    """Chapter 09's run: `tp_train_step` on every engine of a reset cluster; (results, trace)."""
    return cluster.measured(tp_train_step, config, b, s, t, **kw)


def tp_train(recipe, t: int, *, sequence_parallel: bool = False) -> StepResult | None:
    """`recipe.steps` optimizer steps of the GPT split over ranks 0..t-1: the trainer's run of
    `Plan(tp=t, tensor=TensorOptions(sequence_parallel=...))` (`pipelib.trainer.train_plan`), to compare with
    `recipe.reference()` (chapter 09 trains on the book's character corpus:
    `Recipe(..., data="corpus")`). Adam is elementwise, so each rank updates its shard alone.
    Every rank returns the last step's gradients and every parameter, whole; the loss rank
    every step's loss. `recipe.model.vocab_size` must be a multiple of t (and at least the
    corpus's: pad it if needed, extra rows are never a target). In fp32, compare parameters
    loosely: a gradient that is zero in exact arithmetic (the key bias: softmax ignores a shift)
    is rounding noise of 1e-9, which Adam divides by its own square root plus eps = 1e-8 and
    turns into steps of lr size; fp64 keeps it below eps."""
    from pipelib.plan import Plan, TensorOptions
    from pipelib.trainer import train_plan

    return train_plan(recipe, Plan(tp=t, tensor=TensorOptions(sequence_parallel=sequence_parallel)))
