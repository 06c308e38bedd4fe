"""torch's FSDP2 (`fully_shard`) on the same model and batches as pipelib's ZeRO-3.

FSDP2 (torch.distributed.fsdp, Zhao et al. 2023 for FSDP) is ZeRO-3 as torch ships it: every
parameter becomes a DTensor sharded on dim 0 over the mesh; `fully_shard(layer)` groups a
layer's parameters into one all-gather before its forward and backward, and one
reduce-scatter of its gradients (averaged) after backward. Each layer of `zero_units.layer_units`
is wrapped, then the root, as torch's documentation recommends. Gradients come back as
DTensors: `full_tensor()` gathers them for the comparison.

Collectives are the backend's own (C++: gloo's, NCCL's on GPUs), not pipelib's: the step-time ratio in
`bench/data_parallel_zero.py` compares pipelib's Python rings against them.

The layouts differ (`shard_layouts`): FSDP2 "chunks each parameter on dim-0 ... whereas FSDP1
flattens, concatenates, and chunks a group of tensors" (torch's FSDP2 docs). So in FSDP2 every
rank holds rows of every parameter, padded per parameter (`dim0_padded_numel`), and a rank's
shard is a set of ordinary tensors (a state dict needs no communication); pipelib's ZeRO is
FSDP1's and DeepSpeed's layout: one flat buffer per unit cut into N equal pieces, so a rank may
hold part of one parameter and none of another, with at most N - 1 padding elements per unit.

Introduced in chapter 08.
"""
from __future__ import annotations

import time


from pipelib.results import StepResult


def _fsdp2_model(recipe, group):
    """`recipe.build()` under FSDP2: each of pipelib's ZeRO units (a layer) and the root
    `fully_shard`-ed on torch's mesh over the very group pipelib's ZeRO uses (no group is made)."""
    from torch.distributed.fsdp import fully_shard

    from pipelib.data_parallel.zero_units import layer_units
    from pipelib.runtime.mesh import device_mesh
    from pipelib.runtime.place import to_rank_device

    mesh = device_mesh(group, "dp")  # on the rank's device type: the GPU's under NCCL
    model = to_rank_device(recipe.build())  # seeded on the CPU, then moved before fully_shard
    for _, layer in layer_units(model):
        if layer is not model:
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp_train(recipe, *, group=None, timed: bool = False) -> StepResult:
    """Train the recipe's `steps` steps with FSDP2 and its optimizer on this rank (every rank of `group` calls
    it); gradients of the last step and parameters after it, as full tensors."""
    import torch.distributed as dist

    from pipelib.recipe import loss_of
    from pipelib.runtime.device import current
    from pipelib.runtime.place import to_rank_device

    n, r, steps = dist.get_world_size(group), dist.get_rank(group), recipe.steps
    model = _fsdp2_model(recipe, group)
    opt = recipe.make_optimizer(model.parameters())
    names = [name for name, _ in model.named_parameters()]
    losses, times, grads = [], [], {}
    for s in range(steps):
        x, y = to_rank_device(recipe.batch(s, r, n))
        t0 = time.perf_counter()
        loss = loss_of(model, x, y)
        loss.backward()
        if s == steps - 1 and not timed:
            grads = {k: p.grad.full_tensor().detach().clone() for k, p in zip(names, model.parameters())}
        opt.step()
        opt.zero_grad()
        current().synchronize()  # on cuda the step is queued, not done: wait before the end stamp
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)  # the whole batch's loss (untimed)
        losses.append(mean.item() / n)
    params = {k: p.full_tensor().detach().clone() for k, p in zip(names, model.parameters())}
    return StepResult(loss=losses[-1], grads=grads, times=tuple(times), losses=tuple(losses), params=params)


def train_fsdp(cluster, recipe, *, world_size: int | None = None, **kw) -> list:
    """`fsdp_train` on ranks 0..world_size-1 of `cluster`; one StepResult per rank (None outside)."""
    from pipelib.data_parallel.zero_runner import _zero_on_rank, check_recipe, check_world

    n = check_world(cluster, world_size, check_recipe(recipe, "train_fsdp").batch_size, "train_fsdp")
    return cluster.run(_zero_on_rank, n, fsdp_train, (recipe,), kw)


def dim0_padded_numel(shapes, world_size: int) -> int:
    """Elements FSDP2 allocates for parameters of `shapes` on N ranks, all shards together: each
    parameter's dim 0 padded to a multiple of N (its own padding, per parameter), where pipelib's
    `zero_formulas.padded_numel` pads each unit's flat buffer once."""
    total = 0
    for shape in shapes:
        shape = tuple(shape) or (1,)
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += -(-shape[0] // world_size) * world_size * rest
    return total


def shard_layouts(recipe, *, group=None) -> dict:
    """On every rank of `group`: how FSDP2 and pipelib's ZeRO-3 cut the same model, per
    parameter: {name: {"shape": full shape, "fsdp2": this rank's local DTensor shape (rows of
    dim 0), "zero": (start, stop) of the flattened parameter in this rank's shard of its unit}}."""
    from pipelib.data_parallel.zero import ZeRO
    from pipelib.runtime.place import to_rank_device

    model = _fsdp2_model(recipe, group)
    local = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}
    ranges = ZeRO(to_rank_device(recipe.build()), group, stage=3).shard_ranges()
    full = {n: tuple(p.shape) for n, p in recipe.build().named_parameters()}
    return {n: {"shape": full[n], "fsdp2": local[n], "zero": ranges[n]} for n in full}


def compare_layouts(cluster, recipe, *, world_size: int | None = None) -> list:
    """`shard_layouts` on ranks 0..world_size-1 of `cluster`; one dict per rank (None outside)."""
    from pipelib.data_parallel.zero_runner import _zero_on_rank, check_recipe, check_world

    check_recipe(recipe, "compare_layouts")
    n = check_world(cluster, world_size, world_size or cluster.world_size, "compare_layouts")
    return cluster.run(_zero_on_rank, n, shard_layouts, (recipe,), {})
