"""ZeRO training runs: the same model and batches on the engines, in one process, and in torch's
and DeepSpeed's twins, so every result can be compared with the others.

A run is described by one `pipelib.recipe.Recipe` (the book's one description of what is
trained), so that engines, spawned DeepSpeed processes and the notebook all build the same
model from the same seed and draw the same batches:

    SMALL = Recipe(MLPConfig(in_features=30, hidden=50, out_features=7, num_layers=3), lr=1e-3)
    TEXT = Recipe(GPTConfig(vocab_size=V, block_size=32, n_layer=2), data="corpus", lr=3e-3)
    train_zero(cluster, SMALL, stage=2)            # one StepResult per rank
    SMALL.reference()                               # the single process every run must equal

Rank r of n takes rows [r B/n, (r+1) B/n) of each step's global batch (`Recipe.batch`). Each
rank's loss is the mean over its rows, so the average of the ranks' gradients is the single
process's gradient on the whole batch. With `mixed_precision=True` in the recipe, the reference
keeps the same fp32 master weights (`pipelib.data_parallel.mixed_precision`).

`zero_train` runs on every rank of a cluster and returns a `pipelib.results.StepResult`:
gradients of the last step (as its optimizer reads them, after the stage's reduction) and
parameters after it, gathered to full tensors, the measured bytes per category and the bytes
sent, and the step times.

Introduced in chapter 08.
"""
from __future__ import annotations

from types import MappingProxyType

import torch

from pipelib.results import StepResult


def zero_train(recipe, stage: int, *, accumulate: int = 1, group=None, timed: bool = True,
               **zero_kw) -> StepResult:
    """Train the recipe's `steps` ZeRO steps on this rank (call on every rank of `group`); `zero_kw` go to
    `ZeRO` (reduce_dtype, prefetch, reshard_after_forward).

    Each step runs `accumulate` micro-batches (this rank's rows cut in `accumulate`, each loss
    divided by it) before one optimizer step. Forward and backward are timed in laps around
    ZeRO's own communication (`ZeRO.timed`: modelled on a simulated device); the optimizer
    step is a compute op reading and writing `adam_bytes_moved` of the elements this rank
    updates (memory-bound: N times less from stage 1 on), between the stage's gradient
    collective and its parameter all-gather. The run is one
    `Device.measure(fresh_memory=True)` scope (a new model: its memory starts from nothing,
    and the device's tracker is its own again afterwards), each step one `Device.measure()`.
    `losses`: the whole batch's loss per step (the ranks' means averaged, with an untraced torch.distributed
    all-reduce). stats: "memory" measured after the last step (persistent state), "tracker"
    (the device's memory tracker then, by category), "peak" (the most it held during the
    run), "bytes_sent" per step (this rank's payload bytes, `Measurement.bytes_sent`), "psi",
    "padded", "units", "gathered peak" (the most bytes of unsharded units held at once: stage
    3's transient working set), "optimizer bytes" (the Adam traffic charged per step)."""
    import torch.distributed as dist

    from pipelib.data_parallel.zero import ZeRO
    from pipelib.data_parallel.zero_formulas import adam_bytes_moved
    from pipelib.recipe import OPTIMIZERS, loss_of
    from pipelib.runtime.device import current
    from pipelib.runtime.place import to_rank_device

    dev = current()
    steps, batch, mixed_precision = recipe.steps, recipe.batch_size, recipe.mixed_precision
    n, r = dist.get_world_size(group), dist.get_rank(group)
    replicas = zero_kw.get("replicate_group")  # HSDP: the batch is split over shard group x replicas
    R, q = (1, 0) if replicas is None else (dist.get_world_size(replicas), dist.get_rank(replicas))
    data_n, data_r = n * R, q * n + r
    if (batch // data_n) % accumulate:
        raise ValueError(f"zero_train: {batch // data_n} rows per rank do not split into accumulate={accumulate} "
                         f"micro-batches; use a batch that is a multiple of {data_n * accumulate}")
    losses, times, sent = [], [], []
    grads = {}
    with dev.measure(fresh_memory=True) as run:
        zero = ZeRO(to_rank_device(recipe.build()), group, stage=stage, optimizer=OPTIMIZERS[recipe.optimizer],
                    lr=recipe.lr, mixed_precision=mixed_precision, **zero_kw)
        opt_bytes = adam_bytes_moved(zero.updated_numel, mixed_precision)
        for step in range(steps):
            x, y = to_rank_device(recipe.batch(step, data_r, data_n))  # drawn on the CPU, then moved
            micro = x.shape[0] // accumulate
            total = torch.zeros((), dtype=torch.float64, device=dev.torch_device)  # summed on the device: no
            # host sync between a micro-batch's backward and the next forward (a GPU keeps its queue)
            with dev.measure() as one:
                for k in range(accumulate):
                    rows = slice(k * micro, (k + 1) * micro)
                    with zero.timed("F"):
                        loss = loss_of(zero, x[rows], y[rows]) / accumulate
                    with zero.timed("B"):
                        loss.backward()
                    total += loss.detach().double()
                zero.reduce_gradients()
                grads_now = zero.reduced_gradients() if len(losses) == steps - 1 else None
                with dev.compute("optimizer", flops=0.0, nbytes=opt_bytes):
                    zero.update()
                zero.publish()
                zero.zero_grad()
            times.append(one.time)
            sent.append(one.bytes_sent)
            mean = total.reshape(1).float()
            dist.all_reduce(mean, group=group)  # the backend's own, untraced: the whole batch's loss, for curves
            if replicas is not None:
                dist.all_reduce(mean, group=replicas)
            losses.append(mean.item() / data_n)
            grads = grads_now or grads
        memory, tracker = zero.memory(), dict(dev.memory.bytes)
    stats = {"memory": memory, "tracker": tracker, "peak": run.peak_bytes, "bytes_sent": tuple(sent),
             "psi": sum(u.numel for u in zero.units), "padded": sum(u.padded for u in zero.units),
             "units": len(zero.units), "world_size": n, "stage": stage, "mixed_precision": mixed_precision,
             "gathered peak": zero.gathered_peak, "optimizer bytes": opt_bytes, "accumulate": accumulate}
    return StepResult(loss=losses[-1], grads=grads, stats=stats, times=tuple(times), losses=tuple(losses),
                      params=zero.full_parameters())


def _zero_on_rank(world_size, fn, args, kw):
    """`fn(*args, group=..., **kw)` on ranks 0..world_size-1 of the world, None on the others.
    Every rank calls it: the group is made by all (`Mesh.first(world_size)["dp"]`, once per engine)."""
    from pipelib.runtime.mesh import Mesh

    mesh = Mesh.first(world_size)
    if not mesh.contains:
        return None
    return fn(*args, group=mesh["dp"], **kw)


def check_recipe(recipe, context: str):
    """`recipe` if it is a `pipelib.recipe.Recipe`, else a TypeError that says how to make one."""
    from pipelib.recipe import Recipe

    if not isinstance(recipe, Recipe):
        raise TypeError(f"{context}: got {type(recipe).__name__} {recipe!r}; pass a pipelib.recipe.Recipe, e.g. "
                        f"Recipe(MLPConfig(in_features=6, hidden=9, out_features=4, num_layers=3), "
                        f"batch_size=8, steps=3, lr=1e-3)")
    return recipe


# what a ZeRO run takes beside its recipe: zero_train's own keywords and ZeRO's options
RUN_KEYWORDS = frozenset({"accumulate", "timed", "reduce_dtype", "prefetch", "reshard_after_forward",
                          "param_dtype", "units", "check"})
RECIPE_KEYWORDS = MappingProxyType({"steps": "steps", "batch": "batch_size", "lr": "lr",
                                    "mixed_precision": "mixed_precision", "optimizer": "optimizer"})


def check_keywords(kw: dict, context: str) -> None:
    """A keyword that belongs to the recipe says how to set it there; an unknown one lists the
    known ones: a TypeError in the notebook, before any engine work."""
    for k, v in kw.items():
        if k in RECIPE_KEYWORDS:
            raise TypeError(f"{context}: {k}={v!r} belongs to the recipe: pass "
                            f"recipe.replace({RECIPE_KEYWORDS[k]}={v!r})")
        if k not in RUN_KEYWORDS:
            raise TypeError(f"{context}: unknown keyword {k}={v!r}; use some of {sorted(RUN_KEYWORDS)}")


def check_world(cluster, world_size, batch: int, context: str) -> int:
    """The data-parallel size to use: checked against the cluster and the batch, in the kernel,
    before any engine work."""
    from pipelib.checks import check_int

    n = cluster.world_size if world_size is None else world_size
    check_int(n, "world_size", minimum=1, context=context, hint="ranks of the data-parallel group")
    if n > cluster.world_size:
        raise ValueError(f"{context}: world_size={n} is larger than the cluster, which has "
                         f"{cluster.world_size} ranks; use world_size <= {cluster.world_size} or start "
                         f"Cluster(world_size={n})")
    if batch % n:
        raise ValueError(f"{context}: the global batch {batch} does not divide by world_size={n}; "
                         f"use a multiple of {n}")
    return n


def train_zero(cluster, recipe, stage: int, *, world_size: int | None = None, **kw) -> list:
    """Run `zero_train` on ranks 0..world_size-1 of `cluster` (default: all of them); one
    StepResult per rank, None for ranks outside the group. Bad arguments raise here, before
    any engine works."""
    from pipelib.checks import check_int
    from pipelib.data_parallel.zero_formulas import check_stage

    check_stage(stage, "train_zero")
    check_keywords(kw, "train_zero")
    batch = check_recipe(recipe, "train_zero").batch_size
    n = check_world(cluster, world_size, batch, "train_zero")
    k = check_int(kw.get("accumulate", 1), "accumulate", context="train_zero", hint="micro-batches per step")
    if batch % (n * k):
        raise ValueError(f"train_zero: accumulate={k!r} with a global batch of {batch} on {n} ranks; use a "
                         f"whole number of micro-batches >= 1 that divides the {batch // n} rows per rank")
    return cluster.run(_zero_on_rank, n, zero_train, (recipe, stage), kw)


def _hsdp_on_rank(shard, fn, args, kw):
    """`fn(*args, group=<shard group>, replicate_group=<replica group>, **kw)` on every rank: the
    world cut into shard groups of `shard` consecutive ranks (one node each, in practice) and
    replica groups of the ranks holding the same shard (r, r + shard, ...): the mesh's
    "dp_shard" and "dp_replicate" groups of `Topology(dp=world, dp_replicate=world // shard)`,
    made by every rank, in one order."""
    import torch.distributed as dist

    from pipelib.runtime.mesh import Mesh
    from pipelib.topology import Topology

    world = dist.get_world_size()
    mesh = Mesh(Topology(dp=world, dp_replicate=world // shard))
    return fn(*args, group=mesh["dp_shard"], replicate_group=mesh["dp_replicate"], **kw)


def train_hsdp(cluster, recipe, stage: int = 3, *, shard: int, **kw) -> list:
    """HSDP on the whole cluster: ZeRO `stage` within shard groups of `shard` ranks, replicated
    across the world_size / shard groups (`ZeRO(..., replicate_group=...)`); one StepResult per
    rank. Bad arguments raise here, before any engine works."""
    from pipelib.checks import check_int
    from pipelib.data_parallel.zero_formulas import check_stage

    check_stage(stage, "train_hsdp")
    check_int(shard, "shard", context="train_hsdp", hint="ranks each shard group holds")
    check_keywords(kw, "train_hsdp")
    world, batch = cluster.world_size, check_recipe(recipe, "train_hsdp").batch_size
    if world % shard or batch % world:
        raise ValueError(f"train_hsdp: shard={shard} and batch={batch} on {world} ranks; the shard group "
                         f"size must divide the world ({world}) and the world the global batch")
    return cluster.run(_hsdp_on_rank, shard, zero_train, (recipe, stage), kw)
