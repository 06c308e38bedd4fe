"""The GPT split by pipelib and by torch's DTensor, side by side (chapter 09).

`dtensor_tp_gpt_step` is the twin of `tp_train_step` on the whole GPT (vocabulary-parallel
embedding and head, torch's `loss_parallel`); the functions below on the blocks alone also
give the input's gradient, and time the steps of the bench.

torch's `torch.distributed.tensor.parallel` splits a module with a plan of styles:
`ColwiseParallel` (Megatron's column-parallel linear), `RowwiseParallel` (row-parallel, the
sum all-reduced, or reduce-scattered with ``output_layouts=Shard(1)``) and `SequenceParallel`
(a norm on sequence shards). Both versions here run the same blocks of `GPT(config, seed)` on
the same input x (B, T, C) and take the gradient of sum(y * w) for a fixed w, so outputs,
gradients and the input's gradient can be compared with each other and with one process.

DTensor's ColwiseParallel cuts c_attn's 3C rows in t contiguous pieces, which would give rank
0 all of q and half of k: its rows are first permuted so that piece r is [q_r; k_r; v_r]
(`pipelib.tensor_parallel.layers.tp_shard_rows`), and the gradient permuted back. Under sequence
parallelism the norm's output is a DTensor of the global shape, so model.py's attention reads
the whole T, exactly what pipelib's `gather_sequence_before` achieves with a hook.

`timed_tp_steps` times forward + backward of the same blocks for the bench
(`bench/tensor_parallel.py`): pipelib with its ring collectives, pipelib with torch's
collectives, DTensor.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.recipe import as_dtype
from pipelib.results import StepResult
from pipelib.runtime.place import to_rank_device

IMPLS = ("pipelib", "pipelib-torch", "dtensor")


def _tp_inputs(config, b, s, dtype, data_seed):
    g = torch.Generator().manual_seed(data_seed)
    x = torch.randn(b, s, config.n_embd, generator=g).to(as_dtype(dtype))
    w = torch.randn(b, s, config.n_embd, generator=g).to(as_dtype(dtype))
    return x, w


def tp_blocks_reference(config, b: int, s: int, *, dtype: str = "float32", seed: int = 0, data_seed: int = 2):
    """One process: (output y, {blocks.* name: gradient}, dx) of sum(blocks(x) * w)."""
    from pipelib.model import GPT

    model = GPT(config, seed).to(as_dtype(dtype))
    x, w = _tp_inputs(config, b, s, dtype, data_seed)
    x.requires_grad_(True)
    y = x
    for blk in model.blocks:
        y = blk(y)
    (y * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if n.startswith("blocks.")}
    return y.detach(), grads, x.grad.clone()


def _dtensor_tp_blocks(model, group, sequence_parallel: bool):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    from pipelib.runtime.mesh import device_mesh
    from pipelib.tensor_parallel.layers import tp_shard_rows

    t = dist.get_world_size(group)
    mesh = device_mesh(group, "tp")
    for blk in model.blocks:
        with torch.no_grad():  # piece r of the contiguous split = [q_r; k_r; v_r]
            for p in (blk.attn.c_attn.weight, blk.attn.c_attn.bias):
                if p is not None:
                    p.copy_(torch.cat([tp_shard_rows(p, t, r, 3) for r in range(t)]))
        if sequence_parallel:
            plan = {"ln_1": SequenceParallel(), "attn.c_attn": ColwiseParallel(input_layouts=Shard(1)),
                    "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)), "ln_2": SequenceParallel(),
                    "mlp.c_fc": ColwiseParallel(input_layouts=Shard(1)),
                    "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1))}
        else:
            plan = {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                    "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
        parallelize_module(blk, mesh, plan)
        blk.attn.n_head //= t
    model.tp_mesh = mesh
    return model


def _tp_build(config, t, impl, sequence_parallel, dtype, seed):
    from pipelib.model import GPT
    from pipelib.tensor_parallel.apply import apply_tensor_parallel
    from pipelib.tensor_parallel.plan import gpt_tp_plan
    from pipelib.tensor_parallel.step import tp_group

    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; use one of {IMPLS}")
    group = tp_group(t)
    if group is None:
        return None, None, None
    model = to_rank_device(GPT(config, seed).to(as_dtype(dtype)))  # seeded on the CPU, then moved
    if impl == "dtensor":
        return _dtensor_tp_blocks(model, group, sequence_parallel), group, None
    plan = gpt_tp_plan(vocab=False, sequence_parallel=sequence_parallel)
    backend = "torch" if impl == "pipelib-torch" else "pipelib"
    return model, group, apply_tensor_parallel(model, group, plan, backend=backend)


def _after_backward(model, tp) -> None:
    """pipelib's tensor parallelism's sums after backward (sequence-parallel parameters)."""
    if tp is not None and tp.after_backward is not None:
        tp.after_backward(model)


def _run_tp_blocks(model, x, w, group, sequence_parallel):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    if sequence_parallel:
        x, w = x.chunk(t, dim=1)[r], w.chunk(t, dim=1)[r]
    x = x.detach().clone().requires_grad_(True)
    y = x
    for blk in model.blocks:
        y = blk(y)
    (y * w).sum().backward()
    return x, y


def _gather_tp_seq(x, group):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _tp_step(config, b, s, t, impl, sequence_parallel, dtype, seed, data_seed):
    from pipelib.placement import join_shards
    from pipelib.tensor_parallel.apply import tp_full_gradients

    model, group, tp = _tp_build(config, t, impl, sequence_parallel, dtype, seed)
    if model is None:
        return None
    x, w = to_rank_device(_tp_inputs(config, b, s, dtype, data_seed))
    x, y = _run_tp_blocks(model, x, w, group, sequence_parallel)
    if impl == "dtensor":
        grads = {}
        for n, p in model.named_parameters():
            if n.startswith("blocks."):
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                if n.endswith("c_attn.weight") or n.endswith("c_attn.bias"):
                    g = join_shards(list(g.chunk(t, dim=0)), 0, 3)
                grads[n] = g.detach().clone()
    else:
        _after_backward(model, tp)
        grads = {n: g for n, g in tp_full_gradients(model, group).items() if n.startswith("blocks.")}
    dx, y = x.grad, y.detach()
    if sequence_parallel:
        dx, y = _gather_tp_seq(dx, group), _gather_tp_seq(y, group)
    first = dist.get_rank(group) == 0
    return StepResult(grads=grads if first else {}, stats={"y": y, "dx": dx} if first else {})


def tp_blocks_step(config, b: int, s: int, t: int, *, sequence_parallel: bool = False, dtype: str = "float32",
                seed: int = 0, data_seed: int = 2, backend: str = "pipelib") -> StepResult | None:
    """pipelib's TP (or TP + SP) blocks: gradient of sum(y * w); stats `y` and `dx` gathered."""
    impl = "pipelib-torch" if backend == "torch" else "pipelib"
    return _tp_step(config, b, s, t, impl, sequence_parallel, dtype, seed, data_seed)


def dtensor_tp_blocks_step(config, b: int, s: int, t: int, *, sequence_parallel: bool = False,
                        dtype: str = "float32", seed: int = 0, data_seed: int = 2) -> StepResult | None:
    """The same with torch's DTensor ColwiseParallel / RowwiseParallel (/ SequenceParallel)."""
    return _tp_step(config, b, s, t, "dtensor", sequence_parallel, dtype, seed, data_seed)


def _dtensor_tp_gpt(model, group, sequence_parallel: bool):
    """The whole GPT by DTensor: blocks as `_dtensor_tp_blocks`, the embedding split by rows
    (RowwiseParallel), the head by vocabulary (ColwiseParallel, logits left sharded for
    `loss_parallel`), the tie restored on the shard; under sequence parallelism the embedding's
    output and the positions are sequence shards and ln_f a SequenceParallel norm."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = _dtensor_tp_blocks(model, group, sequence_parallel).tp_mesh
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {"embed.wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "head.lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
    if sequence_parallel:
        plan["embed.wpe"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
        plan["head.ln_f"] = SequenceParallel()
    parallelize_module(model, mesh, plan)
    model.head.lm_head.weight = model.embed.wte.weight  # the tie, on the same Shard(0) DTensor
    return model


def dtensor_tp_gpt_step(config, b: int, s: int, t: int, *, sequence_parallel: bool = False,
                        dtype: str = "float32", seed: int = 0, data_seed: int = 1) -> StepResult | None:
    """One forward and backward of the whole GPT split by DTensor, the loss under torch's
    `loss_parallel` (no logits gathered): the twin of `pipelib.tensor_parallel.step.tp_train_step`."""
    from torch.distributed.tensor.parallel import loss_parallel

    from pipelib.model import GPT
    from pipelib.placement import join_shards
    from pipelib.tensor_parallel.step import tp_group, tp_recipe

    group = tp_group(t)
    if group is None:
        return None
    model = _dtensor_tp_gpt(to_rank_device(GPT(config, seed).to(as_dtype(dtype))), group, sequence_parallel)
    idx, targets = to_rank_device(tp_recipe(config, b, s, data_seed=data_seed).global_batch(0))
    logits, _ = model(idx)
    with loss_parallel():
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if n.endswith("c_attn.weight") or n.endswith("c_attn.bias"):
            g = join_shards(list(g.chunk(t, dim=0)), 0, 3)
        grads[n] = g.detach().clone()
    first = dist.get_rank(group) == 0
    loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    logits = logits.full_tensor().detach()
    return StepResult(loss=loss.detach() if first else None, grads=grads if first else {},
                      stats={"logits": logits} if first else {})


def _tp_gpt_step_fn(config, t, impl, sequence_parallel, seed):
    """(model, group, one_step) for the whole GPT: pipelib's plan, or DTensor's with loss_parallel."""
    from torch.distributed.tensor.parallel import loss_parallel

    from pipelib.model import GPT
    from pipelib.tensor_parallel.step import build_tp_gpt, tp_group

    if impl == "dtensor":
        group = tp_group(t)
        if group is None:
            return None, None, None
        model = _dtensor_tp_gpt(to_rank_device(GPT(config, seed)), group, sequence_parallel)

        def one_step(x, y):
            logits, _ = model(x)
            with loss_parallel():
                torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).backward()
        return model, group, one_step
    model, tp = build_tp_gpt(config, t, sequence_parallel=sequence_parallel, seed=seed,
                             backend="torch" if impl == "pipelib-torch" else "pipelib")
    if model is None:
        return None, None, None

    def one_step(x, y):
        tp.forward_loss(model, x, y).backward()
        _after_backward(model, tp)
    return model, tp.comm.group, one_step


def _tp_timed_setup(config, b, s, t, impl, sequence_parallel, seed, whole):
    """(model, group, one_step, args) for `timed_tp_steps`; (None, ...) outside the group."""
    from pipelib.tensor_parallel.step import tp_recipe

    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; use one of {IMPLS}")
    if whole:
        model, group, one_step = _tp_gpt_step_fn(config, t, impl, sequence_parallel, seed)
        return model, group, one_step, to_rank_device(tp_recipe(config, b, s).global_batch(0))
    model, group, tp = _tp_build(config, t, impl, sequence_parallel, "float32", seed)

    def one_step(x, w):
        _run_tp_blocks(model, x, w, group, sequence_parallel)
        _after_backward(model, tp)
    return model, group, one_step, to_rank_device(_tp_inputs(config, b, s, "float32", 2))


def timed_tp_steps(config, b: int, s: int, t: int, impls=IMPLS, *, steps: int = 5, warmup: int = 1,
                   sequence_parallel: bool = False, seed: int = 0, whole: bool = False) -> StepResult | None:
    """Seconds per forward + backward of each implementation in `impls`, built side by side on
    the same ranks and run in turn, step by step (the order rotating every step), so a drifting
    load hits all of them alike (`pipelib.runtime.alternate.alternate_steps`: a step's time is the
    slowest rank's, on the device's clock). The model:
    the blocks (gradient of sum(y * w)), or with `whole` the whole GPT with its vocabulary-parallel
    embedding, head and loss. Group rank 0 returns {impl: [seconds per step]} in `stats`."""
    built = {impl: _tp_timed_setup(config, b, s, t, impl, sequence_parallel, seed, whole) for impl in impls}
    group = next(iter(built.values()))[1]
    if group is None:
        return None
    from pipelib.runtime.alternate import alternate_steps

    def side(impl):
        model, _, one_step, args = built[impl]

        def step():
            model.zero_grad(set_to_none=True)
            one_step(*args)
        return step
    times = alternate_steps({impl: side(impl) for impl in impls}, steps, warmup=warmup, group=group)
    return StepResult(stats={"times": times}) if dist.get_rank(group) == 0 else None
