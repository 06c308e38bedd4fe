"""One training step of a pipeline on every engine, and the checks that come before it.

    check_step("1f1b", 4, 8, cfg, batch_size=64, world_size=4)   # in the notebook: ValueErrors
    run_train_step(cluster, "1f1b", 4, 8, cfg)                    # per rank: a StepResult
    monolith_step(cfg, 64)                                        # the reference: same loss, grads

Every rank builds the same seeded model, cuts it into the schedule's stages, keeps its own and
runs `execute` (`pipelib.pipeline.executor`, the one executor) on them (`pipelib.pipeline.stage`
cuts the model). `timed_steps` and `prepare_step` are the benchmark's
building blocks (`pipeline_torch.compare_step_times` runs torch's twin of the same step).

Introduced in chapter 10; chapters 11-13 run every schedule through `run_train_step`.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from pipelib.checks import check_int
from pipelib.results import StepResult
from pipelib.runtime.device import current
from pipelib.pipeline.executor import execute
from pipelib.pipeline.stage import Stage, partition, stage_grads, stage_modules
from pipelib.pipeline.schedules import Schedule, as_schedule, schedule_info, validate

__all__ = ["resolve_schedule", "check_step", "train_step", "run_train_step", "monolith_step",
           "make_batch", "timed_steps", "Runner", "prepare_step"]

def resolve_schedule(schedule, p: int | None = None, m: int | None = None,
                     num_chunks: int = 2) -> Schedule:
    """A `Schedule` from a name or alias in `pipelib.pipeline.schedules.REGISTRY` (with p, m;
    num_chunks for chunked ones) or a Schedule/dict."""
    if not isinstance(schedule, str):
        return as_schedule(schedule)
    info = schedule_info(schedule)  # an unknown name: a ValueError listing the names
    if p is None or m is None:
        raise ValueError(f"schedule {schedule!r} by name needs p (ranks) and m (microbatches)")
    return info.make(p, m, num_chunks)


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


def make_batch(model_config, batch_size: int, seed: int = 0):
    """A random classification batch for the MLP, from a private generator: (x, y)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, model_config.in_features, generator=g)   # (B, in_features)
    y = torch.randint(0, model_config.out_features, (batch_size,), generator=g)  # (B,)
    return x, y


def monolith_step(model_config, batch_size: int, batch_seed: int = 0, *, model_seed: int = 0,
                  dtype=torch.float32):
    """The reference: one forward and backward of the whole MLP in one process: (loss, grads)."""
    from pipelib.model import MLP

    model = MLP(model_config, seed=model_seed).to(dtype)
    x, y = make_batch(model_config, batch_size, batch_seed)
    loss = F.cross_entropy(model(x.to(dtype)), y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def timed_steps(step: Callable, modules, steps: int, group=None) -> tuple[object, list[float]]:
    """Run `step()` `steps` times, gradients zeroed before each: (last result, seconds per step).

    Each step starts from a barrier of `group`, so the ranks start together and each one's time
    is its own share of the step (the step time is the slowest rank's). The first step of a
    pipeline pays one-off costs (shape handshake, torch's shape inference): drop it when timing.
    """
    check_int(steps, "steps")
    out, times = None, []
    for _ in range(steps):
        for mod in modules:
            mod.zero_grad(set_to_none=True)
        dist.barrier(group)
        t0 = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - t0)
    return out, times


class Runner(NamedTuple):
    """One rank's training step, built and ready: `step()` runs it (the loss or None), `modules`
    are this rank's stage modules (to zero between steps), `grads()` their gradients under the
    monolith's names. `prepare_step` builds pipelib's, `pipeline_torch.prepare_torch_step` torch's."""

    step: Callable[[], object]
    modules: list
    grads: Callable[[], dict]


def prepare_step(s: Schedule, model_config, rank: int, batch_seed: int = 0, *, batch_size: int,
                 model_seed: int = 0, balance="layers", costs=None, group=None,
                 dtype=torch.float32, info: dict | None = None, recv_ahead: int = 2,
                 check: bool = False) -> Runner:
    """Build the seeded MLP, keep `rank`'s stages of `s` and the batch: a `Runner` of `execute`."""
    bounds, modules = stage_modules(model_config, s.num_stages, model_seed=model_seed,
                                    balance=balance, dtype=dtype)
    mine = [Stage(modules[k], k, s.num_stages) for k in s.stages_of(rank)]
    dev = current()
    # A fresh tracker: this step's model is new, and pointers of earlier models' parameters
    # must not hide this step's activations.
    dev.memory = dev.fresh_memory()
    dev.memory.track_module(nn.ModuleList(st.module for st in mine))
    x, y = make_batch(model_config, batch_size, batch_seed)
    x, shapes = x.to(dtype), {}

    def step():
        return execute(s, mine, x, y, F.cross_entropy, group, costs=costs, stats=info,
                       shapes=shapes, recv_ahead=recv_ahead, check=check)

    def grads():
        return {k: g for st in mine for k, g in stage_grads(bounds, st.index, st.module).items()}

    return Runner(step, [st.module for st in mine], grads)


def train_step(schedule, p: int | None = None, m: int | None = None, model_config=None,
               batch_seed: int = 0, *, batch_size: int | None = None, model_seed: int = 0,
               num_chunks: int = 2, balance="layers", costs=None, group=None,
               dtype=torch.float32, steps: int = 1, timed: bool = False,
               recv_ahead: int = 2, check: bool = False) -> StepResult | None:
    """Run on every engine: build the MLP from a seed, keep this rank's stages, run one step.

    Every rank builds the same model (same seed) and the same batch (batch_size rows, default
    2 per microbatch), splits the layers into the schedule's stages and keeps its own, then
    calls `execute`. Returns a `StepResult`: the loss (last stage's rank, else None), the
    gradients of this rank's stages under the monolith's names (compare with `monolith_step`
    through `pipelib.results.check_against_reference`) and the stats `execute` fills. Ranks of
    the group outside the schedule return None.

    `steps` > 1 repeats the step on the same stages (gradients zeroed between, the shape
    handshake done once); the result is the last step's. With timed=True the list of seconds
    per step (`timed_steps`) are the result's `times` (the benchmark's timing mode).
    `recv_ahead` and `check` are `execute`'s.
    """
    from pipelib.model import MLPConfig

    s = resolve_schedule(schedule, p, m, num_chunks)
    rank = dist.get_rank(group)
    if rank < 0 or rank >= s.num_ranks:
        return None
    info: dict = {}
    run = prepare_step(s, model_config or MLPConfig(), rank, batch_seed,
                       batch_size=batch_size or 2 * s.num_microbatches, model_seed=model_seed,
                       balance=balance, costs=costs, group=group, dtype=dtype, info=info,
                       recv_ahead=recv_ahead, check=check)
    if steps == 1 and not timed:
        loss, times = run.step(), []
    else:
        loss, times = timed_steps(run.step, run.modules, steps, group)
    return StepResult(loss, run.grads(), info, tuple(times))


def run_train_step(cluster, schedule, p=None, m=None, model_config=None, batch_seed: int = 0,
                   **kw) -> list:
    """Check everything in the notebook process (`check_step`), then `train_step` on every rank."""
    from pipelib.model import MLPConfig

    s = check_step(schedule, p, m, model_config or MLPConfig(), kw.get("batch_size"),
                   num_chunks=kw.get("num_chunks", 2), world_size=cluster.world_size)
    return cluster.run(train_step, s, None, None, model_config, batch_seed, **kw)
