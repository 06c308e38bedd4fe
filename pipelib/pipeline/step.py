"""One training step of a pipeline on every engine, and the checks that come before it.

    check_step("1f1b", 4, 8, cfg, batch_size=64, world_size=4)   # in the notebook: ValueErrors
    run_train_step(cluster, "1f1b", 4, 8, cfg)                    # per rank: a StepResult
    Recipe(cfg, batch_size=64).first_step()                       # the reference: same loss, grads

Every rank builds the same seeded model, cuts it into the schedule's stages, keeps its own and
runs `execute` (`pipelib.pipeline.executor`, the one executor) on them (`pipelib.pipeline.stage`
cuts the model). `StepOptions` are the keywords every pipeline runner takes; `measured_run` is
the one measurement of a runner's step (a `Device.measure` scope per run and per step; the GPT's
and chapter 14's steps use it too); `prepare_step` and `timed_steps` are also the benchmark's
building blocks (`torch_twin.compare_step_times` runs torch's twin of the same step).

Introduced in chapter 10; chapters 11-13 run every schedule through `run_train_step`.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from pipelib.batches import global_batch
from pipelib.checks import check_int
from pipelib.pipeline.executor import execute
from pipelib.pipeline.schedules import Schedule, resolve_schedule, validate
from pipelib.pipeline.stage import Stage, partition, stage_grads, stage_modules
from pipelib.results import StepResult
from pipelib.runtime.device import current
from pipelib.runtime.place import to_rank_device

__all__ = ["check_step", "StepOptions", "train_step", "run_train_step",
           "timed_steps", "Runner", "prepare_step", "measured_run"]

def check_step(schedule, p=None, m=None, model_config=None, batch_size=None, *,
               num_chunks: int = 2, world_size: int | None = None) -> Schedule:
    """Every check of a training step that needs no engine; run it in the notebook first.

    Raises a ValueError naming the values for: an unknown schedule name, m < 1, a schedule that
    deadlocks or whose messages cannot be matched (`validate`), more stages than layers, a batch
    not divisible by m, more ranks than the cluster has. Returns the Schedule.
    """
    s = validate(resolve_schedule(schedule, p, m, num_chunks), order="kind")
    if model_config is not None:
        partition(model_config.num_layers, s.num_stages)
    if batch_size is not None and batch_size % s.num_microbatches:
        raise ValueError(f"batch_size={batch_size} cannot be split into m={s.num_microbatches} "
                         f"equal microbatches; use a multiple of {s.num_microbatches}")
    if world_size is not None and s.num_ranks > world_size:
        raise ValueError(f"schedule {s.name!r} needs {s.num_ranks} ranks; the cluster has {world_size}")
    return s


@dataclass(frozen=True)
class StepOptions:
    """How a pipeline step is built and run, beyond its schedule, model and batch seed: the
    keywords every pipeline runner takes (`train_step`, `pipeline.gpt.gpt_train_step`, the
    recompute step, torch's twin), checked by name in the notebook (`split`).

    batch_size: rows of the global batch (default 2 per microbatch); model_seed: the model's;
    num_chunks: stages per rank of a named chunked schedule; balance: `stage.partition`'s;
    costs: each op's modelled duration (`simulate.Costs`); dtype: the model's; recv_ahead and
    check: `execute`'s.
    """

    batch_size: int | None = None
    model_seed: int = 0
    num_chunks: int = 2
    balance: object = "layers"
    costs: object = None
    dtype: torch.dtype = torch.float32
    recv_ahead: int = 2
    check: bool = False

    @classmethod
    def split(cls, kw: dict, runner: Callable | None = None) -> tuple[StepOptions, dict]:
        """(the options among `kw`, the other keywords). With `runner`, a keyword that is neither
        an option nor a parameter of `runner` (nor `Cluster.run`'s timeout) raises a TypeError
        naming it and the known ones: in the notebook, before any engine works."""
        names = {f.name for f in fields(cls)}
        if runner is not None:
            params = inspect.signature(runner).parameters.values()
            known = names | {q.name for q in params if q.kind is not q.VAR_KEYWORD} | {"timeout"}
            if set(kw) - known:
                raise TypeError(f"{runner.__name__}: unknown keyword(s) {sorted(set(kw) - known)}; "
                                f"the known ones are {sorted(known)}")
        return cls(**{k: v for k, v in kw.items() if k in names}), {k: v for k, v in kw.items() if k not in names}

    def rows(self, s: Schedule) -> int:
        return 2 * s.num_microbatches if self.batch_size is None else self.batch_size

    def validated(self, kw: dict) -> StepOptions:
        """The options' values, in the notebook: sizes are whole and positive, dtype a torch.dtype."""
        if self.batch_size is not None:
            check_int(self.batch_size, "batch_size", hint="rows of the global batch")
        check_int(self.recv_ahead, "recv_ahead", minimum=0, hint="receives posted ahead")
        if "steps" in kw:
            check_int(kw["steps"], "steps", hint="optimizer steps")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype={self.dtype!r}: pass a torch.dtype, e.g. dtype=torch.float32")
        return self

    def execute_kw(self) -> dict:
        return dict(costs=self.costs, recv_ahead=self.recv_ahead, check=self.check)


def timed_steps(step: Callable, modules, steps: int, group=None, *, barrier: bool = True,
                host: bool = False) -> tuple[object, list[float], list]:
    """Run `step()` `steps` times, gradients zeroed before each: (last result, seconds per step,
    one `Device.measure()` `Measurement` per step: bytes sent, peak memory).

    A step's seconds are its scope's time on the device's clock (virtual on a simulated device,
    wall on real ones); host=True takes the host's clock instead, for torch's twin, whose ops the
    device never sees (a simulated device models none of them). With `barrier`, each step starts
    from a barrier of `group`, so the ranks start together and each one's time is its own share
    of the step (the step time is the slowest rank's). The first step of a pipeline pays one-off
    costs (shape handshake, torch's shape inference): drop it when timing.
    """
    check_int(steps, "steps")
    dev, out, times, scopes = current(), None, [], []
    for _ in range(steps):
        for mod in modules:
            mod.zero_grad(set_to_none=True)
        if barrier:
            dist.barrier(group)
        t0 = time.perf_counter()
        with dev.measure() as m:
            out = step()
        times.append(time.perf_counter() - t0 if host else m.time)
        scopes.append(m)
    return out, times, scopes


class Runner(NamedTuple):
    """One rank's training step, built and ready: `step()` runs it (the loss or None), `modules`
    are this rank's stage modules (to zero between steps), `grads()` their gradients under the
    monolith's names, `stats` what `execute` filled in. `prepare_step` builds pipelib's,
    `pipeline.gpt` the GPT's, `torch_twin.prepare_torch_step` torch's."""

    step: Callable[[], object]
    modules: list
    grads: Callable[[], dict]
    stats: dict | None = None


def prepare_step(s: Schedule, model_config, rank: int, batch_seed: int = 0,
                 opts: StepOptions | None = None, group=None) -> Runner:
    """Build the seeded MLP, keep `rank`'s stages of `s` and the batch: a `Runner` of `execute`."""
    opts = opts or StepOptions()
    bounds, modules = stage_modules(model_config, s.num_stages, model_seed=opts.model_seed,
                                    balance=opts.balance, dtype=opts.dtype)
    mine = [Stage(to_rank_device(modules[k]), k, s.num_stages) for k in s.stages_of(rank)]
    x, y = global_batch(model_config, opts.rows(s), 0, batch_seed)  # on the CPU: one batch per seed
    (x, y), shapes, info = to_rank_device((x.to(opts.dtype), y)), {}, {}

    def step():
        return execute(s, mine, x, y, F.cross_entropy, group, stats=info, shapes=shapes,
                       **opts.execute_kw())

    def grads():
        return {k: g for st in mine for k, g in stage_grads(bounds, st.index, st.module).items()}

    return Runner(step, [st.module for st in mine], grads, info)


def measured_run(prepare: Callable[[], Runner], steps: int = 1, group=None, *,
                 barrier: bool = False) -> StepResult:
    """Build a `Runner` and run it `steps` times, measured: one `StepResult`.

    The whole run is one `Device.measure(fresh_memory=True)` scope (a new model, counted from
    zero: no pointers of an earlier model's parameters hide this step's activations; the
    device's own tracker comes back afterwards), each step one `Device.measure()` inside it
    (`timed_steps`). The result holds the last step's loss and the gradients, `execute`'s stats
    plus base_bytes (what the rank held as the last step began: its stages' parameters and
    buffers), per step its time on the device's clock and its payload bytes sent, and the run's
    peak memory (`peak_bytes`, every category).
    """
    dev = current()
    with dev.measure(fresh_memory=True) as whole:
        run = prepare()
        dev.memory.track_module(nn.ModuleList(run.modules))
        loss, times, scopes = timed_steps(run.step, run.modules, steps, group, barrier=barrier)
    stats = {k: v for k, v in (run.stats or {}).items() if k != "bytes_sent"}  # typed, per step, below
    stats["base_bytes"] = scopes[-1].base_bytes
    return StepResult(loss, run.grads(), stats, tuple(times), peak_bytes=whole.peak_bytes,
                      bytes_sent=tuple(m.bytes_sent for m in scopes))


def train_step(schedule, p: int | None = None, m: int | None = None, model_config=None,
               batch_seed: int = 0, *, group=None, steps: int = 1, timed: bool = False,
               **options) -> StepResult | None:
    """Run on every engine: build the MLP from a seed, keep this rank's stages, run one step.

    Every rank builds the same model (same seed) and the same batch, splits the layers into
    the schedule's stages and keeps its own, then calls `execute`. Returns a `StepResult`
    (`measured_run`): the loss (last stage's rank, else None), the gradients of this rank's
    stages under the monolith's names (compare with `Recipe(...).first_step()` through
    `pipelib.results.check_against_reference`), execute's stats (peak_activation_bytes,
    messages), and per step its device time and bytes sent. Ranks of the group outside the
    schedule return None. `options` are `StepOptions`' (batch_size, costs, balance, ...).

    `steps` > 1 repeats the step on the same stages (gradients zeroed between, the shape
    handshake done once); the result is the last step's. timed=True (the benchmark's timing
    mode) starts every step from a barrier, as does `steps` > 1.
    """
    from pipelib.model import MLPConfig

    opts = StepOptions(**options)
    s = resolve_schedule(schedule, p, m, opts.num_chunks)
    rank = dist.get_rank(group)
    if rank < 0 or rank >= s.num_ranks:
        return None
    return measured_run(lambda: prepare_step(s, model_config or MLPConfig(), rank, batch_seed, opts, group),
                        steps, group, barrier=timed or steps > 1)


def run_train_step(cluster, schedule, p=None, m=None, model_config=None, batch_seed: int = 0,
                   **kw) -> list:
    """Check everything in the notebook process (`check_step`), then `train_step` on every rank."""
    from pipelib.model import MLPConfig

    opts, _ = StepOptions.split(kw, train_step)  # an unknown keyword fails here, as a TypeError
    opts.validated(kw)
    s = check_step(schedule, p, m, model_config or MLPConfig(), opts.batch_size,
                   num_chunks=opts.num_chunks, world_size=cluster.world_size)
    layers = (model_config or MLPConfig()).num_layers
    partition(layers, s.num_stages, opts.balance, [1.0] * layers)  # an unknown balance: here, not on an engine
    return cluster.run(train_step, s, None, None, model_config, batch_seed, **kw)
