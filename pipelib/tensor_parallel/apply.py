"""`apply_tensor_parallel(model, group, plan)`: the unaware model split from outside.

Every rank of `group` builds the same full model (same seed), then keeps its shard: the plan
(`pipelib.tensor_parallel.plan`) says which module gets which style, and each style
(`pipelib.tensor_parallel.styles`, torch's `ParallelStyle`) swaps the module for its parallel
twin (`layers`, `vocab`) or, for ``heads``, only changes `n_head`. The model's
own forward code is untouched: a column-parallel c_attn gives 3 C/t channels and model.py reads
the head shapes from them.

After the backward pass, `sync_sequence_grads` sums the gradients of the replicated parameters
that saw only a sequence shard (layer norms, row biases, positions: one coalesced all-reduce),
and `tp_full_gradients` puts every gradient back together under the unsharded model's names, with
torch's all-gather (untraced: it is the check, not the method).

Dropout: the split model equals one process only with dropout 0 (the book's default), since
each rank draws its own masks; Megatron keeps a separate random state for the split regions so
that replicated dropouts agree across ranks and split ones differ. Introduced in chapter 09.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from pipelib.tensor_parallel.ops import TPComm, all_reduce_tp
from pipelib.tensor_parallel.plan import is_sequence_parallel, validate_plan
from pipelib.tensor_parallel.styles import Applying, style_of


def apply_tensor_parallel(model: nn.Module, group, plan: dict, *, backend: str = "pipelib",
                          overlap: bool = False, check_inputs: bool = True) -> nn.Module:
    """Shard `model` in place for this rank of `group` (t = the group's size) following `plan`;
    return it. Errors (unknown module or style, sizes not divisible by t) are raised before any
    weight moves. Each module's style (`pipelib.tensor_parallel.styles`) then splits it, in the
    styles' order (the embedding before the head tied to it, heads before their c_attn). The
    model's forward then runs the Megatron layer: f, column-parallel, local math, row-parallel,
    g; under a plan with a ``sequence`` style, sequence parallelism. With ``overlap=True`` the
    column-parallel layers hide dX's backward collective behind the weight gradient
    (`pipelib.tensor_parallel.overlap`; Korthikanti et al. §6.2). `model.tp_comm.lanes` times
    the compute between collectives on a simulated device (`TPLanes.timed`).

    The group's ranks agree once on the plan, backend and overlap (one small exchange); with
    `check_inputs` the first sharded module checks, once per forward, that every rank feeds it
    the same shape (the layers' own collectives skip that check: a rank with another batch would
    otherwise kill its process on a wrong-sized message)."""
    from pipelib.runtime.device import current
    from pipelib.tensor_parallel.overlap import TPLanes

    from pipelib.comm.agreement import agree

    if getattr(model, "tp_comm", None) is not None:
        raise ValueError(f"apply_tensor_parallel: this {type(model).__name__} is already split (it has tp_comm, "
                         f"t={model.tp_comm.size}); build a fresh model to split it again, e.g. re-run the cell "
                         f"that makes it")
    comm = TPComm(group, backend, overlap=overlap, lanes=TPLanes(current()))
    matched = validate_plan(model, plan, comm.size)
    agree("apply_tensor_parallel", group, plan=tuple(sorted((k, str(v)) for k, v in plan.items())),
          backend=backend, overlap=bool(overlap))
    sp = is_sequence_parallel(plan)
    model.tp_comm, model.tp_sequence_parallel = comm, sp
    todo = sorted(((style_of(plan[k]), n) for k, names in matched.items() for n in names),
                  key=lambda sn: (sn[0].order, sn[1]))
    ctx = Applying(comm, sp)
    for style, name in todo:
        style.apply(model, name, model.get_submodule(name), ctx)
    if check_inputs and comm.size > 1 and todo:
        order = {n: i for i, (n, _) in enumerate(model.named_modules())}
        first = min((n for _, n in todo), key=lambda n: order.get(n, len(order)))
        model.get_submodule(first).register_forward_pre_hook(_SameInput(f"tensor-parallel input of {first}", group))
    return model


class _SameInput:
    """A forward pre-hook: every rank of the group feeds the module the same shape and dtype
    (`check_same`, one small message per forward), or all raise naming each rank's shape."""

    def __init__(self, name: str, group):
        self.name, self.group = name, group

    def __call__(self, module, args):
        from pipelib.comm.agreement import check_same

        if args and isinstance(args[0], torch.Tensor):
            check_same(self.name, args[0], self.group)


def sequence_parallel_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The replicated parameters whose gradient each rank computes from its sequence shard only."""
    return [(n, p) for n, p in model.named_parameters() if getattr(p, "tp_sequence", False)]


def sync_sequence_grads(model: nn.Module) -> int:
    """Sum the gradients of `sequence_parallel_params` over the group in ONE all-reduce (flattened,
    concatenated); return the number of elements. Megatron does the same for its layer norms."""
    params = [p for _, p in sequence_parallel_params(model) if p.grad is not None]
    if not params or not getattr(model, "tp_sequence_parallel", False):
        return 0
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = all_reduce_tp(flat, model.tp_comm, "sequence-parallel parameter gradients")
    i = 0
    for p in params:
        p.grad.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()
    return flat.numel()


def tp_full_gradients(model: nn.Module, group, *, what: str = "grad") -> dict[str, torch.Tensor]:
    """Every gradient (or with what="data", every parameter) of the sharded model, whole, under
    the unsharded model's names: sharded ones all-gathered with torch's built-in, replicated
    ones as they are."""
    from pipelib.placement import placements, unshard

    local = {name: p.detach() if what == "data" else p.grad if p.grad is not None else torch.zeros_like(p)
             for name, p in model.named_parameters()}
    return unshard(local, placements(model), {"tp": group})


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
