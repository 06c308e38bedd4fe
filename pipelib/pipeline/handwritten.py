"""The sharded model and the training orchestrator, written out step by step (chapters 10-11).

Pipeline training is usually built in steps (as in the freeCodeCamp course "pipeline
parallelism from scratch"): the monolith, the model cut by hand, a *sharded model* whose ranks
each hold one slice and pass tensors along, and an *orchestrator*, the training loop every rank
runs. This module is those steps, written plainly on top of the book's pieces:

- `ShardedMLP`: this rank's `Stage` of the MLP with the two messages around each compute op,
  sent and received *blocking*, as one first writes them;
- `naive_step` (chapter 10) and `gpipe_step` (chapter 11): the two schedules written as loops.
  Their orders are exactly `schedules.naive(p, m)` and `schedules.gpipe(p, m)`, which
  `pipelib.pipeline.step.execute` runs from data; the chapters check that both give the same
  timeline, loss and gradients;
- `train`: the orchestrator, chapter 02's loop (`pipelib.train.train_mlp`) on every rank with the
  model cut across ranks; its losses equal the monolith's step by step.

Who sends what to whom: after each forward the rank of stage s sends its output activation,
(rows, width) float32, rows * width * 4 bytes, to the rank of stage s+1; after each backward it
sends the gradient of its input, the shape of what it received, to the rank of stage s-1.
"""
from __future__ import annotations

from types import MappingProxyType

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipelib.checks import check_int
from pipelib.comm import p2p as comms
from pipelib.pipeline.executor import execute
from pipelib.pipeline.schedules import Op, gpipe, naive, resolve_schedule, schedule_info
from pipelib.pipeline.stage import Stage, partition, stage_modules
from pipelib.pipeline.step import StepOptions
from pipelib.results import StepResult
from pipelib.runtime.device import current
from pipelib.runtime.place import to_rank_device
from pipelib.trace import Trace

_ACT, _GRAD = 0, 1  # message tags: activations flow up the ranks, gradients down


def _check_stages(num_stages, world_size: int) -> None:
    check_int(num_stages, "num_stages")
    if num_stages > world_size:
        raise ValueError(f"num_stages={num_stages} stages need {num_stages} ranks but the group "
                         f"has {world_size}; use num_stages <= {world_size}")


class ShardedMLP:
    """Rank r's slice of the MLP (stage r of `num_stages`) and the messages around it.

    Every rank builds the whole MLP from the same seed (cheap here; a real model would be built
    slice by slice) and keeps only the layers `partition` gives its stage. `costs` (a
    `pipelib.pipeline.simulate.Costs`) gives each F and B its modelled duration on a simulated device.
    Measuring it is its runner's business (`train`: a `Device.measure` scope that tracks `module`).
    """

    def __init__(self, config, num_stages: int, *, seed: int = 0, balance="layers",
                 group=None, costs=None):
        _check_stages(num_stages, dist.get_world_size(group))
        self.rank, self.group, self.costs = dist.get_rank(group), group, costs
        if self.rank >= num_stages:
            raise ValueError(f"rank {self.rank} has no stage: only ranks 0..{num_stages - 1} "
                             f"hold one of the {num_stages} stages")
        self.bounds, modules = stage_modules(config, num_stages, model_seed=seed, balance=balance)
        self.layers = self.bounds[self.rank]                    # e.g. range(2, 4)
        self.module, self.device = to_rank_device(modules[self.rank]), current().torch_device  # seeded on the CPU
        self.stage = Stage(self.module, self.rank, num_stages)
        self.in_width = config.dims[self.layers.start]           # width of what stage r receives
        self.out_width = config.dims[self.layers.stop]           # width of what it sends on
        self._rows: dict[int, int] = {}

    def __repr__(self) -> str:
        st = self.stage
        return (f"ShardedMLP(rank {self.rank}: stage {st.index} of {st.num_stages}, "
                f"layers {self.layers.start}..{self.layers.stop - 1}, "
                f"receives width {self.in_width}, sends width {self.out_width})")

    def named_parameters(self):
        """(monolith name, parameter) pairs: `layers.3.0.weight` is one tensor's name everywhere."""
        for name, prm in self.module.named_parameters():
            k, _, rest = name.partition(".")
            yield f"layers.{self.layers.start + int(k)}.{rest}", prm

    def _duration(self, op: Op):
        return None if self.costs is None else self.costs.compute(op, self.stage.index)

    def forward(self, microbatch: int, x, target, *, rows: int, scale: float = 1.0):
        """F of one microbatch: receive the input (unless stage 0), compute, send the output on.

        Returns the loss times `scale` on the last stage, None elsewhere.
        """
        st, j = self.stage, microbatch
        self._rows[j] = rows
        if not st.is_first:  # blocks until rank r-1 has sent this microbatch's activation
            x = comms.recv(torch.empty(rows, self.in_width, device=self.device), self.rank - 1, self.group, tag=_ACT,
                           label=f"act for {st.index}F{j}", stage=st.index - 1, microbatch=j)
        with current().compute("F", stage=st.index, microbatch=j, duration=self._duration(Op.F)):
            out = st.forward(j, x, target, F.cross_entropy, scale)  # (rows, out_width) or the loss
        if st.is_last:
            return out
        comms.send(out, self.rank + 1, self.group, tag=_ACT, label="act", stage=st.index,
                   microbatch=j)                                   # rows * out_width * 4 bytes
        return None

    def backward(self, microbatch: int) -> None:
        """B of one microbatch: receive the output's gradient (unless last), backward, send on."""
        st, j = self.stage, microbatch
        grad = None
        if not st.is_last:  # blocks until rank r+1 has sent the gradient of our output
            grad = comms.recv(torch.empty(self._rows[j], self.out_width, device=self.device), self.rank + 1,
                              self.group, tag=_GRAD, label=f"grad for {st.index}B{j}",
                              stage=st.index + 1, microbatch=j)
        with current().compute("B", stage=st.index, microbatch=j, duration=self._duration(Op.B)):
            grad_input = st.backward(j, grad)  # weight gradients accumulate into .grad
        if not st.is_first:
            comms.send(grad_input, self.rank - 1, self.group, tag=_GRAD, label="grad",
                       stage=st.index, microbatch=j)               # rows * in_width * 4 bytes
        del self._rows[j]


def _microbatches(x, y, m: int):
    check_int(m, "num_microbatches")
    if len(y) % m:
        raise ValueError(f"a batch of {len(y)} rows cannot be split into m={m} equal microbatches; "
                         f"use a batch size that is a multiple of {m}")
    return [c.clone() for c in x.chunk(m)], [c.clone() for c in y.chunk(m)], len(y) // m


def naive_step(shard: ShardedMLP, x, y, num_microbatches: int = 1):
    """Stop and wait: each microbatch goes all the way forward and back before the next enters.

    Every rank passes the whole batch (x, y); stage 0 reads x, the last stage reads y. Each
    microbatch's loss is scaled by 1/m, so the returned loss (last rank; None elsewhere) is the
    batch mean and the gradients are the whole batch's.
    """
    xs, ys, rows = _microbatches(x, y, num_microbatches)
    losses = []
    for j in range(num_microbatches):
        losses.append(shard.forward(j, xs[j], ys[j], rows=rows, scale=1 / num_microbatches))
        shard.backward(j)
    return torch.stack(losses).sum() if shard.stage.is_last else None


def gpipe_step(shard: ShardedMLP, x, y, num_microbatches: int):
    """GPipe (Huang et al. 2019): all m forwards, then all m backwards (chapter 11).

    While rank r runs microbatch j's forward, rank r+1 runs microbatch j-1's: the ranks work
    at once. Same arguments and result as `naive_step`.
    """
    xs, ys, rows = _microbatches(x, y, num_microbatches)
    losses = [shard.forward(j, xs[j], ys[j], rows=rows, scale=1 / num_microbatches)
              for j in range(num_microbatches)]
    for j in range(num_microbatches):
        shard.backward(j)
    return torch.stack(losses).sum() if shard.stage.is_last else None


# generator -> its order written as a loop
HAND_WRITTEN = MappingProxyType({naive: naive_step, gpipe: gpipe_step})


def _check_train(num_stages, world_size: int, steps, schedule, hand_written: bool) -> None:
    _check_stages(num_stages, world_size)
    check_int(steps, "steps", hint="training steps to run")
    if hand_written and schedule_info(schedule).generator not in HAND_WRITTEN:
        raise ValueError(f"hand_written=True knows schedules {sorted(g.__name__ for g in HAND_WRITTEN)}, "
                         f"not {schedule!r}; pass hand_written=False to run it with execute")


def train(config, x, y, steps: int, *, num_stages: int | None = None, schedule: str = "naive",
          num_microbatches: int = 1, lr: float = 1e-2, seed: int = 0, hand_written: bool = False,
          group=None, **options):
    """The orchestrator. Run on every rank: chapter 02's training loop, the MLP cut across ranks.

    Each step every rank draws the same minibatch of `batch_size` rows (default: all of x) as
    `pipelib.train.train_mlp` (same generator, same seed), so no rank needs to be sent the data;
    runs one pipelined forward and backward, by the hand-written loop (`hand_written=True`,
    schedules "naive" and "gpipe") or by `execute` on the named schedule; then updates its own
    parameters with its own Adam. Adam is per parameter, so the ranks' updates together are
    exactly the monolith's. `options` are `step.StepOptions`' (batch_size, model_seed, balance, costs).

    Returns a `StepResult`: `losses`, one float per step, and `loss`, the last step's, on the
    last stage's rank (empty and None elsewhere); `grads` of the last step and `params` after
    it, {monolith name: tensor} for this rank's layers; per step its device time and bytes sent,
    and the run's peak memory. None on ranks beyond num_stages. `run_train` checks first.
    """
    num_stages = dist.get_world_size(group) if num_stages is None else num_stages
    _check_train(num_stages, dist.get_world_size(group), steps, schedule, hand_written)
    if dist.get_rank(group) >= num_stages:
        return None
    opts, dev, losses, times, sent = StepOptions(**options), current(), [], [], []
    with dev.measure(fresh_memory=True) as whole:  # a new model, counted from zero
        shard = ShardedMLP(config, num_stages, seed=opts.model_seed, balance=opts.balance, group=group,
                           costs=opts.costs)
        dev.memory.track_module(shard.module)
        opt = torch.optim.Adam(shard.module.parameters(), lr=lr)
        step = _forward_backward(shard, schedule, num_microbatches, hand_written, group, opts)
        for xb, yb in _minibatches(x, y, steps, opts.batch_size, seed):
            opt.zero_grad(set_to_none=True)
            with dev.measure() as m:
                loss = step(xb, yb)
            grads = {n: p.grad.clone() for n, p in shard.named_parameters()}
            opt.step()
            times.append(m.time)
            sent.append(m.bytes_sent)
            losses += [] if loss is None else [loss.item()]
    last = shard.stage.is_last and bool(losses)
    return StepResult(torch.tensor(losses[-1]) if last else None, grads, losses=tuple(losses) if last else (),
                      params={n: p.detach().clone() for n, p in shard.named_parameters()},
                      times=tuple(times), bytes_sent=tuple(sent), peak_bytes=whole.peak_bytes)


def _minibatches(x, y, steps: int, batch_size: int | None, seed: int):
    """`train_mlp`'s minibatches: `batch_size` rows drawn by a seeded generator (None: all rows)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if batch_size is None:
            yield to_rank_device((x, y))
        else:
            ix = torch.randint(len(x), (batch_size,), generator=g)  # (B,) the same on every rank
            yield to_rank_device((x[ix], y[ix]))  # (B, in_features), (B,)


def _forward_backward(shard: ShardedMLP, schedule: str, m: int, hand_written: bool, group, opts):
    """One pipelined forward and backward of a minibatch: the hand-written loop, or `execute`."""
    if hand_written:
        loop = HAND_WRITTEN[schedule_info(schedule).generator]
        return lambda xb, yb: loop(shard, xb, yb, m)
    plan = resolve_schedule(schedule, shard.stage.num_stages, m)
    return lambda xb, yb: execute(plan, [shard.stage], xb, yb, F.cross_entropy, group, **opts.execute_kw())


def run_train(cluster, config, x, y, steps: int, *, timeout: float | None = None, **kw) -> list:
    """Check the arguments in the notebook process, then run `train` on every rank.

    `timeout` bounds the whole run (default: the cluster's); the first run on fresh engines
    also imports the optimizer, seconds on a loaded laptop.

    Raises a ValueError naming the values, before any engine works, for: more stages than
    ranks or than layers, an unknown schedule, a hand-written schedule that does not exist, a
    batch that m microbatches cannot split.
    """
    num_stages = cluster.world_size if kw.get("num_stages") is None else kw["num_stages"]
    m, schedule = kw.get("num_microbatches", 1), kw.get("schedule", train.__kwdefaults__["schedule"])
    _check_train(num_stages, cluster.world_size, steps, schedule, kw.get("hand_written", False))
    opts, _ = StepOptions.split(kw, train)  # an unknown keyword fails here, as a TypeError
    resolve_schedule(schedule, num_stages, m)  # unknown name, m < 1
    partition(config.num_layers, num_stages, opts.balance, [1] * config.num_layers)  # more stages than layers
    rows = opts.batch_size or len(y)
    if rows % m:
        raise ValueError(f"a batch of {rows} rows cannot be split into m={m} equal microbatches; "
                         f"use a batch size that is a multiple of {m}")
    return cluster.run(train, config, x, y, steps, timeout=timeout, **kw)


def stage_flops(config, num_stages: int, balance="layers", rows: int = 1) -> list[int]:
    """Forward matmul FLOPs of each stage for `rows` rows: 2 * rows * d_in * d_out per layer.

    Pure arithmetic (no engine): what a split costs before it runs. Divided by their mean they
    are `Costs(stage_factor=...)`, so a simulated stage takes time in proportion to its work.
    """
    d = config.dims
    bias = 1 if getattr(config, "bias", True) else 0
    model_costs = [(d[i] + bias) * d[i + 1] for i in range(config.num_layers)]  # = layer_cost
    bounds = partition(config.num_layers, num_stages, balance, model_costs)
    return [sum(2 * rows * d[i] * d[i + 1] for i in b) for b in bounds]


def stage_activation_bytes(config, num_stages: int, rows: int, balance="layers",
                           itemsize: int = 4) -> list[int]:
    """Bytes each stage keeps for backward per microbatch of `rows` rows (chapter 11).

    A stage keeps its input (its first Linear needs it for the weight gradient; on stage 0 that
    is the batch) and the output of each of its ReLU layers (the ReLU's derivative, and the
    next Linear's input: one tensor, counted once). The last stage also keeps cross-entropy's
    log-probabilities (rows x out_features), the targets (int64) and one scalar. Summed over the
    stages this is `memory.mlp_activation_bytes(config, rows)` plus the p-1 activations at the
    cuts, which the sender and the receiver both keep.
    """
    from pipelib.memory import INDEX_BYTES

    d, last = config.dims, config.num_layers - 1
    bias = 1 if getattr(config, "bias", True) else 0
    bounds = partition(config.num_layers, num_stages, balance,
                       [(d[i] + bias) * d[i + 1] for i in range(config.num_layers)])
    out = []
    for b in bounds:
        widths = d[b.start] + sum(d[i + 1] for i in b if i < last)  # input + ReLU outputs
        nbytes = itemsize * rows * widths
        if last in b:
            nbytes += itemsize * (rows * config.out_features + 1) + INDEX_BYTES * rows
        out.append(nbytes)
    return out


def pipeline_trace(cluster, num_ranks: int | None = None) -> Trace:
    """Gather the cluster's events, keeping the pipeline's `num_ranks` ranks (the others idled)."""
    return cluster.trace().first_ranks(num_ranks)
