"""Running the four DDP steps on a cluster, beside one process and torch's DDP (chapter 07).

    results = run_ddp(cluster, "overlap", cfg, steps=3, batch=8)        # one StepResult per rank
    loss, grads, params, _ = reference_step(cfg, steps=3, batch=8)      # one process, whole batch
    print(check_against_reference(results, loss, grads, ref_params=params, shared=True))

Every run trains `steps` optimizer steps on a global batch of `batch` samples that every rank
draws alike from `seed`; group rank r takes the r-th contiguous slice of batch / N rows, cut
into `accumulate` micro-batches (each loss scaled by 1 / accumulate), so the averaged gradient
equals one process's gradient of the mean loss on the whole batch.
`reference_step` is that one process. Arguments are checked on the notebook's side before any
engine work: a step name, bucket size, comm, a group of ranks larger than the cluster or
outside it, a batch that does not split evenly.

Each rank returns a `pipelib.results.StepResult`: the last step's averaged gradients (before
its optimizer step), the parameters after all steps, the global loss of each step (group rank 0
only), the time of each step on this rank's clock, and stats (bytes this rank sent per step,
buckets). The reported loss is averaged with a raw gloo all-reduce, off the trace.

Introduced in chapter 07.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from pipelib.checks import check_int
from pipelib.results import StepResult

STEPS = ("all_reduce", "buckets", "overlap", "no_sync", "torch")  # chapter 07's steps 1-4, then torch's DDP
OPTIMIZERS = ("adam", "sgd")


def _step_class(step: str):
    from pipelib.data_parallel import ddp

    return {"all_reduce": ddp.AllReduceGrads, "buckets": ddp.BucketedGrads, "overlap": ddp.OverlappedGrads,
            "no_sync": ddp.DDP}[step]


def build_model(config, seed: int = 0):
    """The book's GPT or MLP from its config (pipelib.model), seeded."""
    from pipelib.model import GPT, MLP, GPTConfig

    return GPT(config, seed=seed) if isinstance(config, GPTConfig) else MLP(config, seed=seed)


def global_batch(config, batch: int, step: int, seed: int = 0):
    """Step `step`'s global batch (x, y), the same on every rank and in the single process:
    random token windows for the GPT (B, T), random points and classes for the MLP (B, in)."""
    from pipelib.model import GPTConfig

    g = torch.Generator().manual_seed(seed * 100_003 + step)
    if isinstance(config, GPTConfig):
        xy = torch.randint(config.vocab_size, (batch, config.block_size + 1), generator=g)  # (B, T + 1)
        return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
    x = torch.randn(batch, config.in_features, generator=g)  # (B, in)
    return x, torch.randint(config.out_features, (batch,), generator=g)  # (B,)


def loss_of(model, x, y):
    """The mean loss of `model` (or its wrapper) on (x, y): the GPT's own for token targets
    (B, T), cross-entropy of the MLP's logits for class targets (B,)."""
    if y.dim() == 2:
        return model(x, y)[1]
    return torch.nn.functional.cross_entropy(model(x), y)


def make_optimizer(params, optimizer: str, lr: float):
    return torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)


def check_run(world_size: int, step: str, ranks, batch: int, accumulate: int, steps: int, bucket_bytes,
              comm: str, optimizer: str) -> list[int]:
    """Every argument of `run_ddp` checked before any engine work; returns the group's ranks."""
    from pipelib.data_parallel.buckets import check_bucket_bytes
    from pipelib.data_parallel.overlap import check_comm

    if step not in STEPS:
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
    """Train `steps` steps with DDP step `step` (one of STEPS) on `ranks` of `cluster`; one
    StepResult per rank of the cluster (None outside the group). `model_seeds`: one model seed
    per cluster rank (all `seed` when None): give one rank another to see the replica check.
    `profile`: a device profile (name or `DeviceProfile`, e.g. `efficiency.scaled_profile`) the
    simulated devices use for this run instead of the cluster's (what-if links and devices
    without restarting the cluster)."""
    from pipelib.costmodel import get_profile
    from pipelib.model import GPTConfig

    profile = None if profile is None else get_profile(profile)  # a ValueError names a bad one
    group = check_run(cluster.world_size, step, ranks, batch, accumulate, steps, bucket_bytes, comm, optimizer)
    config = GPTConfig() if config is None else config
    seeds = [seed] * cluster.world_size if model_seeds is None else list(model_seeds)
    if len(seeds) != cluster.world_size:
        raise ValueError(f"run_ddp: model_seeds has {len(seeds)} seeds for {cluster.world_size} ranks")
    if reset:
        cluster.reset()
    return cluster.run(ddp_train, step, config, group, steps, batch, accumulate, bucket_bytes, comm,
                       optimizer, lr, seed, seeds, profile)


_GROUPS: dict = {}  # process groups made so far on this engine, by ranks: new_group is collective and slow


def _group(ranks):
    """The process group of `ranks` (made on every rank the first time: new_group is collective)."""
    if len(ranks) == dist.get_world_size():
        return None
    key = tuple(ranks)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks))
    return _GROUPS[key]


def ddp_train(step, config, ranks, steps, batch, accumulate, bucket_bytes, comm, optimizer, lr, seed, seeds,
              profile=None):
    """On every rank (`Cluster.run`): `run_ddp`'s training, returning this rank's StepResult."""
    from pipelib.runtime.device import current

    group = _group(ranks)
    if dist.get_rank() not in ranks:
        return None
    dev = current()
    before = dev.profile
    dev.profile = profile or before
    try:
        return _train(step, config, ranks, group, steps, batch, accumulate, bucket_bytes, comm, optimizer, lr,
                      seed, seeds)
    finally:
        dev.profile = before


def _train(step, config, ranks, group, steps, batch, accumulate, bucket_bytes, comm, optimizer, lr, seed, seeds):
    from pipelib.comm.p2p import counters
    from pipelib.runtime.device import current

    me = dist.get_rank()
    dev, n, r = current(), len(ranks), ranks.index(me)
    model = build_model(config, seeds[me])
    if step == "torch":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                            bucket_cap_mb=bucket_bytes / 2**20)
    else:
        kw = {} if step == "all_reduce" else {"bucket_bytes": bucket_bytes}
        wrapped = _step_class(step)(model, group, comm=comm, **kw)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    rows, micro = batch // n, batch // n // accumulate
    losses, times, sent, grads = [], [], [], {}
    for s in range(steps):
        x, y = global_batch(config, batch, s, seed)
        x, y = x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
        if not dev.modelled:
            dist.barrier(group=group)  # real devices: every rank starts the timed step together
        t0, b0, total = dev.clock.now(), counters()["bytes_sent"], 0.0
        for m in range(accumulate):
            xm, ym = x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro]
            last = m == accumulate - 1
            ctx = wrapped.no_sync() if (not last and step in ("no_sync", "torch")) else contextlib.nullcontext()
            with ctx:
                with dev.compute("F"):
                    loss = loss_of(wrapped, xm, ym) / accumulate
                if step == "torch":
                    with dev.compute("B"):
                        loss.backward()
                else:
                    wrapped.backward(loss)
            total += loss.item()
        if step != "torch":
            wrapped.finish_gradients()
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
        with dev.compute("optimizer", nbytes=28 * sum(p.numel() for p in model.parameters())):
            opt.step()  # Adam reads p, g, m, v and writes p, m, v: 28 bytes per fp32 parameter
        opt.zero_grad(set_to_none=False)
        times.append(dev.clock.now() - t0)
        sent.append(counters()["bytes_sent"] - b0)
        lt = torch.tensor([total])
        dist.all_reduce(lt, group=group)  # the reported loss: raw gloo, off the trace
        losses.append(lt.item() / n)
    if step != "torch":
        wrapped.close()
    stats = {"bytes_sent": tuple(sent), "num_params": sum(p.numel() for p in model.parameters()),
             "buckets": len(getattr(wrapped, "buckets", ())) or None}
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return StepResult(loss=losses[-1] if r == 0 else None, grads=grads, stats=stats, times=tuple(times),
                      losses=tuple(losses) if r == 0 else (), params=params)


def reference_step(config, *, steps: int = 3, batch: int = 8, optimizer: str = "adam", lr: float = 1e-2,
                   seed: int = 0):
    """One process, the whole batch: (last loss, last step's gradients, parameters after all
    steps, losses), to compare with `run_ddp` through `check_against_reference`."""
    model = build_model(config, seed)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses, grads = [], {}
    for s in range(steps):
        x, y = global_batch(config, batch, s, seed)
        loss = loss_of(model, x, y)
        loss.backward()
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return losses[-1], grads, params, losses
