"""Running the four DDP steps on a cluster, beside one process and torch's DDP (chapter 07).

    results = run_ddp(cluster, "overlap", cfg, steps=3, batch=8)        # one StepResult per rank
    ref = Recipe(cfg, batch_size=8, steps=3).reference()                # one process, whole batch
    print(check_against_reference(results, ref, shared=True))           # every step's loss too

Every run trains `steps` optimizer steps on a global batch of `batch` samples that every rank
draws alike from `seed`; group rank r takes the r-th contiguous slice of batch / N rows, cut
into `accumulate` micro-batches (each loss scaled by 1 / accumulate), so the averaged gradient
equals one process's gradient of the mean loss on the whole batch: the batches are
`pipelib.recipe.Recipe`'s, and its `reference()` is that one process. Arguments are checked
on the notebook's side before any engine work: a step name, bucket size, comm, a group of
ranks larger than the cluster or outside it, a batch that does not split evenly.

Each rank returns a `pipelib.results.StepResult`: the last step's averaged gradients (before
its optimizer step), the parameters after all steps, the global loss of each step (group rank 0
only), the time of each step on this rank's clock, and stats (bytes this rank sent per step,
buckets). The reported loss is averaged with a raw torch.distributed all-reduce (gloo, or NCCL on GPUs), off the trace.

Introduced in chapter 07.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.checks import check_int, check_number
from pipelib.data_parallel.steps import DDP_STEPS, accumulate_context, ddp_step
from pipelib.recipe import OPTIMIZERS as _ALL_OPTIMIZERS
from pipelib.recipe import build_model, global_batch, loss_of  # noqa: F401  (chapter 07 imports them here)
from pipelib.results import StepResult
from pipelib.runtime.place import to_rank_device

STEPS = tuple(DDP_STEPS)  # chapter 07's steps 1-4, then torch's DDP (pipelib.data_parallel.steps)
OPTIMIZERS = ("adam", "sgd")


def make_optimizer(params, optimizer: str, lr: float):
    return _ALL_OPTIMIZERS[optimizer](params, lr=lr)


def check_run(world_size: int, step: str, ranks, batch: int, accumulate: int, steps: int, bucket_bytes,
              comm: str, optimizer: str) -> list[int]:
    """Every argument of `run_ddp` checked before any engine work; returns the group's ranks."""
    from pipelib.data_parallel.buckets import check_bucket_bytes
    from pipelib.data_parallel.overlap import check_comm

    if step not in DDP_STEPS:
        raise ValueError(f"run_ddp: step={step!r}; use one of {STEPS}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"run_ddp: optimizer={optimizer!r}; use one of {OPTIMIZERS}")
    check_bucket_bytes(bucket_bytes, "run_ddp")
    check_comm(comm, "run_ddp")
    for v, name in ((batch, "batch"), (accumulate, "accumulate"), (steps, "steps")):
        check_int(v, name, context="run_ddp")
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        if ranks > world_size:
            raise ValueError(f"run_ddp: a group of {ranks} ranks is larger than the cluster of {world_size}; "
                             f"pass ranks <= {world_size}, or start Cluster(world_size={ranks})")
        ranks = list(range(check_int(ranks, "ranks", context="run_ddp")))
    ranks = list(range(world_size)) if ranks is None else sorted(ranks)
    if len(ranks) > world_size or not ranks or ranks[0] < 0 or ranks[-1] >= world_size or len(set(ranks)) < len(ranks):
        raise ValueError(f"run_ddp: ranks={ranks} is not a group of the cluster's ranks 0..{world_size - 1} "
                         f"(a group larger than the cluster, or ranks outside it); pass distinct ranks "
                         f"below {world_size}")
    n = len(ranks)
    if batch % (n * accumulate):
        raise ValueError(f"run_ddp: batch={batch} does not split into {n} ranks x {accumulate} micro-batches; "
                         f"pass a batch that is a multiple of {n * accumulate}")
    return ranks


def run_ddp(cluster, step: str = "no_sync", config=None, *, ranks=None, steps: int = 3, batch: int = 8,
            accumulate: int = 1, bucket_bytes: int = 25 << 20, comm: str = "pipelib", optimizer: str = "adam",
            lr: float = 1e-2, seed: int = 0, model_seeds=None, profile=None, reset: bool = True) -> list:
    """Train `steps` steps with DDP step `step` (a name in `steps.DDP_STEPS`) on `ranks` of `cluster`; one
    StepResult per rank of the cluster (None outside the group). `model_seeds`: one model seed
    per cluster rank (all `seed` when None): give one rank another to see the replica check.
    `profile`: a device profile (name or `DeviceProfile`, e.g. `efficiency.scaled_profile`) the
    simulated devices use for this run instead of the cluster's (what-if links and devices
    without restarting the cluster)."""
    from pipelib.costmodel import get_profile
    from pipelib.model import GPTConfig, MLPConfig

    profile = None if profile is None else get_profile(profile)  # a ValueError names a bad one
    group = check_run(cluster.world_size, step, ranks, batch, accumulate, steps, bucket_bytes, comm, optimizer)
    check_number(lr, "lr", positive=True, context="run_ddp", hint="the learning rate")
    config = GPTConfig() if config is None else config
    if not isinstance(config, (GPTConfig, MLPConfig)):
        raise TypeError(f"run_ddp: config={config!r}; pass a pipelib.model.GPTConfig or MLPConfig")
    seeds = [seed] * cluster.world_size if model_seeds is None else list(model_seeds)
    if len(seeds) != cluster.world_size:
        raise ValueError(f"run_ddp: model_seeds has {len(seeds)} seeds for {cluster.world_size} ranks")
    if reset:
        cluster.reset()
    return cluster.run(ddp_train, step, config, group, steps, batch, accumulate, bucket_bytes, comm,
                       optimizer, lr, seed, seeds, profile)


def ddp_train(step, config, ranks, steps, batch, accumulate, bucket_bytes, comm, optimizer, lr, seed, seeds,
              profile=None):
    """On every rank (`Cluster.run`): `run_ddp`'s training, returning this rank's StepResult."""
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh
    from pipelib.topology import Topology

    mesh = Mesh(Topology(dp=len(ranks)), on=ranks)  # on every rank (collective), made the first time only
    if not mesh.contains:
        return None
    group = mesh["dp"]
    with current().overrides(profile=profile):
        return _train(ddp_step(step), config, ranks, group, steps, batch, accumulate, bucket_bytes, comm,
                      optimizer, lr, seed, seeds)


def _train(step, config, ranks, group, steps, batch, accumulate, bucket_bytes, comm, optimizer, lr, seed, seeds):
    from pipelib.runtime.device import current

    me, dev = dist.get_rank(), current()
    n, r = len(ranks), ranks.index(me)
    model = to_rank_device(build_model(config, seeds[me]))  # seeded on the CPU, then moved
    wrapped = step.wrap(model, group, comm=comm, bucket_bytes=bucket_bytes)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    rows, micro = batch // n, batch // n // accumulate
    losses, times, sent, grads = [], [], [], {}
    for s in range(steps):
        x, y = global_batch(config, batch, s, seed)
        x, y = to_rank_device((x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]))
        if not dev.modelled:
            dist.barrier(group=group)  # real devices: every rank starts the timed step together
        total = torch.zeros((), dtype=torch.float64, device=dev.torch_device)  # summed on the device: no
        # host sync between a micro-batch's backward and the next forward (a GPU keeps its queue)
        with dev.measure() as m:
            for k in range(accumulate):
                with accumulate_context(step, wrapped, last=k == accumulate - 1):
                    with dev.compute("F"):
                        loss = loss_of(wrapped, x[k * micro:(k + 1) * micro], y[k * micro:(k + 1) * micro]) / accumulate
                    wrapped.backward(loss)
                total += loss.detach().double()
            wrapped.finish_gradients()
            grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
            with dev.compute("optimizer", nbytes=28 * sum(p.numel() for p in model.parameters())):
                opt.step()  # Adam reads p, g, m, v and writes p, m, v: 28 bytes per fp32 parameter
            opt.zero_grad(set_to_none=False)
        times.append(m.time)
        sent.append(m.bytes_sent)
        lt = total.reshape(1).float()
        dist.all_reduce(lt, group=group)  # the reported loss: the backend's own, off the trace
        losses.append(lt.item() / n)
    wrapped.close()
    stats = {"bytes_sent": tuple(sent), "num_params": sum(p.numel() for p in model.parameters()),
             "buckets": len(getattr(wrapped, "buckets", ())) or None}
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return StepResult(loss=losses[-1] if r == 0 else None, grads=grads, stats=stats, times=tuple(times),
                      losses=tuple(losses) if r == 0 else (), params=params, bytes_sent=tuple(sent))


def grade_average(fn, config, batch: int):
    """On every rank: chapter 07's exercise graded. `fn(model, group)` must turn this rank's
    gradients (of its rows of the recipe's batch) into the whole batch's: (max |difference| from
    one process's gradients, payload bytes this rank sent inside `fn`)."""
    from pipelib.recipe import Recipe
    from pipelib.runtime.device import current

    recipe = Recipe(config, batch_size=batch, steps=1)
    x, y = to_rank_device(recipe.global_batch(0))
    whole = to_rank_device(recipe.build())
    loss_of(whole, x, y).backward()  # one process, the whole batch
    mine = to_rank_device(recipe.build())
    loss_of(mine, *to_rank_device(recipe.batch(0, dist.get_rank(), dist.get_world_size()))).backward()
    with current().measure() as span:
        fn(mine, None)
    worst = max((a.grad - b.grad).abs().max().item() for a, b in zip(mine.parameters(), whole.parameters()))
    return worst, span.bytes_sent
