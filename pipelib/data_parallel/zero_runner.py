"""ZeRO training runs: the same model and batches on the engines, in one process, and in torch's
and DeepSpeed's twins, so every result can be compared with the others.

A model is described by a small dict (`zero_model`), so that engines, spawned DeepSpeed
processes and the notebook all build the same one from the same seed:

    {"kind": "mlp", "in_features": 16, "hidden": 30, "out_features": 5, "num_layers": 3}
    {"kind": "gpt", "vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32,
     "data": "corpus"}                    # batches from pipelib.data's char corpus (no download)

`zero_batches` draws step s's global batch from a generator seeded with s; rank r of n takes
rows [r B/n, (r+1) B/n). Each rank's loss is the mean over its rows, so the average of the
ranks' gradients is the single process's gradient on the whole batch.

`zero_train` runs on every rank of a cluster and returns a `pipelib.results.StepResult`:
gradients of the last step (as its optimizer reads them, after the stage's reduction) and
parameters after it, gathered to full tensors, the measured bytes per category and the bytes
sent, and the step times.
`reference_adam` is the single process with the same Adam (and the same fp32 master weights
in mixed precision: `pipelib.data_parallel.mixed_precision`).

Introduced in chapter 08.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pipelib.results import StepResult


def zero_model(spec: dict) -> torch.nn.Module:
    """pipelib's MLP or GPT from a spec dict (keys of MLPConfig / GPTConfig, "kind", "seed")."""
    from pipelib.model import GPT, MLP, GPTConfig, MLPConfig

    spec = dict(spec)
    kind, seed = spec.pop("kind", "mlp"), spec.pop("seed", 0)
    spec.pop("data", None)
    if kind == "mlp":
        return MLP(MLPConfig(**spec), seed=seed)
    if kind == "gpt":
        return GPT(GPTConfig(**spec), seed=seed)
    raise ValueError(f"zero_model: kind={kind!r}; use 'mlp' or 'gpt'")


def zero_loss(model, x, y):
    """Mean loss of `model` on (x, y): a GPT takes token ids and returns (logits, loss)."""
    if x.dtype == torch.long:
        return model(x, y)[1].float()
    return F.cross_entropy(model(x).float(), y)


def zero_batches(spec: dict, steps: int, batch: int, world_size: int = 1, rank: int = 0, first: int = 0):
    """Yield (x, y) of steps first..first+steps-1: rank's rows of the global batch of each step."""
    if batch % world_size:
        raise ValueError(f"global batch {batch} does not divide by world_size {world_size}; "
                         f"use a multiple of {world_size}")
    b = batch // world_size
    corpus = None
    if spec.get("kind", "mlp") == "gpt" and spec.get("data") == "corpus":
        from pipelib.data import char_corpus

        corpus = char_corpus()  # once per run, not per step
    for s in range(first, first + steps):
        g = torch.Generator().manual_seed(1000 + s)
        if spec.get("kind", "mlp") == "gpt":
            T = spec.get("block_size")
            if corpus is not None:
                x, y = corpus.get_batch("train", batch, T, generator=g)
            else:
                x = torch.randint(spec["vocab_size"], (batch, T + 1), generator=g)
                x, y = x[:, :-1].contiguous(), x[:, 1:].contiguous()
        else:
            x = torch.randn(batch, spec["in_features"], generator=g)
            y = torch.randint(spec["out_features"], (batch,), generator=g)
        yield x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]


def reference_adam(spec: dict, steps: int, batch: int, *, lr: float = 1e-3, mixed_precision: bool = False,
                   param_dtype=torch.bfloat16) -> StepResult:
    """One process, the whole batch, torch's Adam: the result every ZeRO run must equal."""
    from pipelib.data_parallel.mixed_precision import MasterWeightAdam

    model = zero_model(spec)
    opt = MasterWeightAdam(model, lr=lr, param_dtype=param_dtype) if mixed_precision else \
        torch.optim.Adam(model.parameters(), lr=lr)
    losses, grads = [], {}
    for x, y in zero_batches(spec, steps, batch):
        if mixed_precision and x.is_floating_point():
            x = x.to(param_dtype)
        opt.zero_grad()
        loss = zero_loss(model, x, y)
        loss.backward()
        grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    params = opt.master_parameters() if mixed_precision else \
        {n: p.detach().clone() for n, p in model.named_parameters()}
    return StepResult(loss=losses[-1], grads=grads, losses=tuple(losses), params=params)


def zero_train(spec: dict, stage: int, steps: int = 3, batch: int = 8, *, lr: float = 1e-3,
               mixed_precision: bool = False, accumulate: int = 1, group=None, timed: bool = True,
               **zero_kw) -> StepResult:
    """Train `steps` ZeRO steps on this rank (call on every rank of `group`); `zero_kw` go to
    `ZeRO` (reduce_dtype, prefetch, reshard_after_forward).

    Each step runs `accumulate` micro-batches (this rank's rows cut in `accumulate`, each loss
    divided by it) before one optimizer step. Forward and backward are timed in laps around
    ZeRO's own communication (`ZeRO.timed`: modelled on a simulated device); the optimizer
    step is a compute op reading and writing `adam_bytes_moved` of the elements this rank
    updates (memory-bound: N times less from stage 1 on), between the stage's gradient
    collective and its parameter all-gather. The run is one
    `Device.measure(fresh_memory=True)` scope (a new model: its memory starts from nothing,
    and the device's tracker is its own again afterwards), each step one `Device.measure()`.
    `losses`: the whole batch's loss per step (the ranks' means averaged, with an untraced gloo
    all-reduce). stats: "memory" measured after the last step (persistent state), "tracker"
    (the device's memory tracker then, by category), "peak" (the most it held during the
    run), "bytes_sent" per step (this rank's payload bytes, `Measurement.bytes_sent`), "psi",
    "padded", "units", "gathered peak" (the most bytes of unsharded units held at once: stage
    3's transient working set), "optimizer bytes" (the Adam traffic charged per step)."""
    import torch.distributed as dist

    from pipelib.data_parallel.zero import ZeRO
    from pipelib.data_parallel.zero_formulas import adam_bytes_moved
    from pipelib.runtime.device import current

    dev = current()
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
        zero = ZeRO(zero_model(spec), group, stage=stage, lr=lr, mixed_precision=mixed_precision, **zero_kw)
        opt_bytes = adam_bytes_moved(zero.updated_numel, mixed_precision)
        for x, y in zero_batches(spec, steps, batch, data_n, data_r):
            micro = x.shape[0] // accumulate
            total = 0.0
            with dev.measure() as one:
                for k in range(accumulate):
                    rows = slice(k * micro, (k + 1) * micro)
                    with zero.timed("F"):
                        loss = zero_loss(zero, x[rows], y[rows]) / accumulate
                    with zero.timed("B"):
                        loss.backward()
                    total += loss.item()
                zero.reduce_gradients()
                grads_now = zero.reduced_gradients() if len(losses) == steps - 1 else None
                with dev.compute("optimizer", flops=0.0, nbytes=opt_bytes):
                    zero.update()
                zero.publish()
                zero.zero_grad()
            times.append(one.time)
            sent.append(one.bytes_sent)
            mean = torch.tensor([total])
            dist.all_reduce(mean, group=group)  # raw gloo, untraced: the whole batch's loss, for curves
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
    Every rank calls it: the group is made by all (`runtime.mesh.make_group`, once per engine,
    the same group as `Mesh.first(world_size)["dp"]`)."""
    import torch.distributed as dist

    from pipelib.runtime.mesh import make_group

    group = make_group(range(world_size), "dp")
    if dist.get_rank() >= world_size:
        return None
    return fn(*args, group=group, **kw)


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


def train_zero(cluster, spec: dict, stage: int, *, world_size: int | None = None, steps: int = 3,
               batch: int = 8, **kw) -> list:
    """Run `zero_train` on ranks 0..world_size-1 of `cluster` (default: all of them); one
    StepResult per rank, None for ranks outside the group. Bad arguments raise here, before
    any engine works."""
    from pipelib.checks import check_int
    from pipelib.data_parallel.zero_formulas import check_stage

    check_stage(stage, "train_zero")
    n = check_world(cluster, world_size, batch, "train_zero")
    k = check_int(kw.get("accumulate", 1), "accumulate", context="train_zero", hint="micro-batches per step")
    if batch % (n * k):
        raise ValueError(f"train_zero: accumulate={k!r} with a global batch of {batch} on {n} ranks; use a "
                         f"whole number of micro-batches >= 1 that divides the {batch // n} rows per rank")
    return cluster.run(_zero_on_rank, n, zero_train, (spec, stage, steps, batch), kw)


def _hsdp_on_rank(shard, fn, args, kw):
    """`fn(*args, group=<shard group>, replicate_group=<replica group>, **kw)` on every rank: the
    world cut into shard groups of `shard` consecutive ranks (one node each, in practice) and
    replica groups of the ranks holding the same shard (r, r + shard, ...). Every rank makes
    every group, in one order (`runtime.mesh.make_group`)."""
    import torch.distributed as dist

    from pipelib.runtime.mesh import make_group

    world, me = dist.get_world_size(), dist.get_rank()
    shards = [make_group(range(i, i + shard), "dp", kind="hsdp-shard") for i in range(0, world, shard)]
    replicas = [make_group(range(j, world, shard), "dp", kind="hsdp-replicate") for j in range(shard)]
    return fn(*args, group=shards[me // shard], replicate_group=replicas[me % shard], **kw)


def train_hsdp(cluster, spec: dict, stage: int = 3, *, shard: int, steps: int = 3, batch: int = 8, **kw) -> list:
    """HSDP on the whole cluster: ZeRO `stage` within shard groups of `shard` ranks, replicated
    across the world_size / shard groups (`ZeRO(..., replicate_group=...)`); one StepResult per
    rank. Bad arguments raise here, before any engine works."""
    from pipelib.checks import check_int
    from pipelib.data_parallel.zero_formulas import check_stage

    check_stage(stage, "train_hsdp")
    check_int(shard, "shard", context="train_hsdp", hint="ranks each shard group holds")
    world = cluster.world_size
    if world % shard or batch % world:
        raise ValueError(f"train_hsdp: shard={shard} and batch={batch} on {world} ranks; the shard group "
                         f"size must divide the world ({world}) and the world the global batch")
    return cluster.run(_hsdp_on_rank, shard, zero_train, (spec, stage, steps, batch), kw)
