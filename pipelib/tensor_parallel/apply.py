"""`apply_tensor_parallel(model, group, plan)`: the unaware model split from outside.

Every rank of `group` builds the same full model (same seed), then keeps its shard: the plan
(`pipelib.tensor_parallel.plan`) says which module gets which style, and each style
(`pipelib.tensor_parallel.styles`, torch's `ParallelStyle`) swaps the module for its parallel
twin (`layers`, `vocab`) or, for ``heads``, only changes `n_head`. The model's
own forward code is untouched: a column-parallel c_attn gives 3 C/t channels and model.py reads
the head shapes from them.

`apply_tensor_parallel` returns a `TensorParallel` record (`pipelib.applied.Applied`): the
group's `TPComm`, where each split parameter lives, the forward and loss (`tp_forward`: a
vocabulary-parallel cross-entropy under a vocabulary-parallel head), and what runs after backward.
After the backward pass, `sync_sequence_grads` sums the gradients of the replicated parameters
that saw only a sequence shard (layer norms, row biases, positions: one coalesced all-reduce),
and `tp_full_gradients` puts every gradient back together under the unsharded model's names, with
torch's all-gather (untraced: it is the check, not the method).

Dropout: the split model equals one process only with dropout 0 (the book's default), since
each rank draws its own masks; Megatron keeps a separate random state for the split regions so
that replicated dropouts agree across ranks and split ones differ. Introduced in chapter 09.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn

from pipelib.applied import Applied
from pipelib.model import cross_entropy
from pipelib.tensor_parallel.ops import TPComm, all_reduce_tp
from pipelib.tensor_parallel.plan import is_sequence_parallel, validate_plan
from pipelib.tensor_parallel.styles import Applying, style_of


@dataclass
class TensorParallel(Applied):
    """What tensor parallelism leaves on this rank: its `TPComm` (the group, the backend, the
    lanes that time it) and whether the plan is sequence-parallel, besides `Applied`'s calls."""

    comm: TPComm | None = None
    sequence_parallel: bool = False


def apply_tensor_parallel(model: nn.Module, group, plan: dict, *, backend: str = "pipelib",
                          overlap: bool = False, check_inputs: bool = True) -> TensorParallel:
    """Shard `model` in place for this rank of `group` (t = the group's size) following `plan`;
    return what it leaves on the rank (`TensorParallel`). Errors (unknown module or style, sizes not
    divisible by t) are raised before any weight moves. Each module's style
    (`pipelib.tensor_parallel.styles`) then splits it, in the styles' order (the embedding before
    the head tied to it, heads before their c_attn). The model's forward then runs the Megatron
    layer: f, column-parallel, local math, row-parallel, g; under a plan with a ``sequence`` style,
    sequence parallelism. With ``overlap=True`` the column-parallel layers hide dX's backward
    collective behind the weight gradient (`pipelib.tensor_parallel.overlap`; Korthikanti et al.
    §6.2). The record's `comm.lanes` times the compute between collectives on a simulated device
    (`TPLanes.timed`).

    The group's ranks agree once on the plan, backend and overlap (one small exchange); with
    `check_inputs` the first sharded module checks, once per forward, that every rank feeds it
    the same shape (the layers' own collectives skip that check: a rank with another batch would
    otherwise kill its process on a wrong-sized message)."""
    from pipelib.runtime.device import current
    from pipelib.tensor_parallel.overlap import TPLanes

    from pipelib.comm.agreement import agree

    split = [n for n, p in model.named_parameters() if getattr(p, "tp_dim", None) is not None]
    if split:
        raise ValueError(f"apply_tensor_parallel: this {type(model).__name__} is already split ({split[0]} is a "
                         f"shard); build a fresh model to split it again, e.g. re-run the cell that makes it")
    comm = TPComm(group, backend, overlap=overlap, lanes=TPLanes(current()))
    matched = validate_plan(model, plan, comm.size)
    agree("apply_tensor_parallel", group, plan=tuple(sorted((k, str(v)) for k, v in plan.items())),
          backend=backend, overlap=bool(overlap))
    sp = is_sequence_parallel(plan)
    todo = sorted(((style_of(plan[k]), n) for k, names in matched.items() for n in names),
                  key=lambda sn: (sn[0].order, sn[1]))
    ctx = Applying(comm, sp)
    for style, name in todo:
        style.apply(model, name, model.get_submodule(name), ctx)
    # the replicated parameters that see a sequence shard: the layer norms ('sequence' style) and
    # the layers' own (a row-parallel bias, the position shard), which mark themselves
    sequence = frozenset(id(p) for p in ctx.sequence) | frozenset(
        id(p) for p in model.parameters() if getattr(p, "tp_sequence", False))
    if check_inputs and comm.size > 1 and todo:
        order = {n: i for i, (n, _) in enumerate(model.named_modules())}
        first = min((n for _, n in todo), key=lambda n: order.get(n, len(order)))
        model.get_submodule(first).register_forward_pre_hook(_SameInput(f"tensor-parallel input of {first}", group))
    return TensorParallel(axis="tp", placements=tp_placements(model), comm=comm, sequence_parallel=sp,
                          forward_loss=functools.partial(_forward_loss, comm=comm, sequence_parallel=sp),
                          wrap_loss=functools.partial(_wrap_loss, model, comm),
                          after_backward=functools.partial(sync_sequence_grads, comm=comm, sequence=sequence)
                          if sp else None)


def tp_placements(model: nn.Module) -> dict[str, dict]:
    """{name: {"axis": "tp", "dim", "fused"}} of every parameter the styles split (each keeps how
    it was cut: `layers._tp_param`); replicated ones are left out."""
    return {n: {"axis": "tp", "dim": p.tp_dim, "fused": getattr(p, "tp_fused", 1)}
            for n, p in model.named_parameters() if getattr(p, "tp_dim", None) is not None}


def tp_forward(model, idx, targets, comm: TPComm, *, sequence_parallel: bool = False):
    """Embedding, blocks, head, loss of a model split by `apply_tensor_parallel` on `comm`:
    (logits, loss), the logits local to the rank (B, T, V/t) under a vocabulary-parallel head."""
    from pipelib.tensor_parallel.vocab import VocabParallelHead, vocab_parallel_cross_entropy

    head = model.head.lm_head
    if sequence_parallel and not isinstance(head, VocabParallelHead):
        raise ValueError("sequence parallelism on the whole GPT needs the vocabulary-parallel "
                         "embedding and head: use gpt_tp_plan(vocab=True, sequence_parallel=True)")
    x = model.embed(idx)  # (B, T, C), or (B, T/t, C) under sequence parallelism
    for block in model.blocks:
        x = block(x)
    logits = model.head(x)  # (B, T, V/t) or (B, T, V)
    if isinstance(head, VocabParallelHead):
        return logits, vocab_parallel_cross_entropy(logits, targets, comm, head.start)
    return logits, cross_entropy(logits, targets)


def _forward_loss(model, x, y, *, comm, sequence_parallel):
    return tp_forward(model, x, y, comm, sequence_parallel=sequence_parallel)[1]


def _wrap_loss(model, comm, loss_fn):
    """The last stage's loss of its logits: under a vocabulary-parallel head each tp rank holds
    V/t of them, and the cross-entropy is Megatron's, over the tp group."""
    from pipelib.tensor_parallel.vocab import VocabParallelHead, vocab_parallel_cross_entropy

    head = model.head.lm_head
    if not isinstance(head, VocabParallelHead):
        return loss_fn
    return lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, comm, head.start)


class _SameInput:
    """A forward pre-hook: every rank of the group feeds the module the same shape and dtype
    (`check_same`, one small message per forward), or all raise naming each rank's shape."""

    def __init__(self, name: str, group):
        self.name, self.group = name, group

    def __call__(self, module, args):
        from pipelib.comm.agreement import check_same

        if args and isinstance(args[0], torch.Tensor):
            check_same(self.name, args[0], self.group)


def sync_sequence_grads(model: nn.Module, comm: TPComm, sequence: frozenset) -> int:
    """Sum the gradients of `model`'s replicated parameters that saw only a sequence shard (ids in
    `sequence`, collected by the styles; `model` is the whole model or one pipeline stage) over
    `comm`'s group in ONE all-reduce (flattened, concatenated); return the number of elements.
    Megatron does the same for its layer norms."""
    params = [p for p in model.parameters() if id(p) in sequence and p.grad is not None]
    if not params:
        return 0
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = all_reduce_tp(flat, comm, "sequence-parallel parameter gradients")
    i = 0
    for p in params:
        p.grad.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()
    return flat.numel()


def tp_full_gradients(model: nn.Module, group, *, what: str = "grad") -> dict[str, torch.Tensor]:
    """Every gradient (or with what="data", every parameter) of the sharded model, whole, under
    the unsharded model's names: sharded ones all-gathered with torch's built-in, replicated
    ones as they are."""
    from pipelib.placement import Placement, unshard

    local = {name: p.detach() if what == "data" else p.grad if p.grad is not None else torch.zeros_like(p)
             for name, p in model.named_parameters()}
    return unshard(local, {n: Placement(**f) for n, f in tp_placements(model).items()}, {"tp": group})


def check_tp_step(config, b: int, s: int, t: int, world_size: int, *, plan=None, sequence_parallel: bool = False,
                  vocab: bool = True, dtype="float32", backend: str = "pipelib") -> dict:
    """Every argument of chapter 09's `tp_train_step` checked in the notebook process, before any
    engine works: sizes, t against the cluster, the sequence against block_size, the dtype and
    backend by name, the plan against the model (`validate_plan`, on a GPT built here: ms for
    the book's sizes), sequence parallelism's needs. Returns the plan; a ValueError names the
    value and what to change (the engines would raise the same, a step later)."""
    from pipelib.checks import check_int
    from pipelib.model import GPT
    from pipelib.recipe import as_dtype
    from pipelib.tensor_parallel.ops import BACKENDS
    from pipelib.tensor_parallel.plan import check_sequence_divisible, gpt_tp_plan, validate_plan
    from pipelib.tensor_parallel.styles import VocabHeadParallel

    for name, v in (("b", b), ("s", s), ("t", t)):
        check_int(v, name, context="tp_train_step")
    if t > world_size:
        raise ValueError(f"tp_train_step: t={t} is larger than the cluster ({world_size} ranks); use t <= "
                         f"{world_size} or start Cluster(world_size={t})")
    if s > config.block_size:
        raise ValueError(f"tp_train_step: sequence length s={s} exceeds block_size={config.block_size}; use "
                         f"s <= {config.block_size} or a GPTConfig with a larger block_size")
    as_dtype(dtype)
    if backend not in BACKENDS:
        raise ValueError(f"tp_train_step: backend={backend!r}; use one of {BACKENDS}")
    plan = plan if plan is not None else gpt_tp_plan(vocab=vocab, sequence_parallel=sequence_parallel)
    validate_plan(GPT(config), plan, t)
    if is_sequence_parallel(plan):
        check_sequence_divisible(s, t)
        if not any(isinstance(style_of(v), VocabHeadParallel) for v in plan.values()):
            raise ValueError("sequence parallelism on the whole GPT needs the vocabulary-parallel embedding and "
                             "head: use gpt_tp_plan(vocab=True, sequence_parallel=True)")
    return plan
