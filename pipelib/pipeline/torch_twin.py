"""The same training step through torch.distributed.pipelining, to check pipelib's executor.

    run_torch_train_step(cluster, "zbv", 4, 8, cfg)   # per rank: a StepResult (or None)
    run_train_step(cluster, "zbv", 4, 8, cfg)         # pipelib's, the same type of result

Both build the same MLP (same seed), cut it at the same layer boundaries (`stage_modules`) and
put stage k on the same rank: stage k on rank k % p for looped schedules (GPipe, 1F1B,
interleaved, zero bubble), a V for ZB-V and DualPipeV (stage k on rank k for k < p, then back
down). The difference is who runs the schedule: pipelib's `execute`, or torch's
`PipelineStage` + schedule class, which infers shapes on its first step, batches its p2p
messages and lowers the schedule to compute and communication actions. Who sends what is the
same on both sides: the F of stage s sends its output (rows x width floats) to stage s+1's
rank, the B or I of stage s its input gradient (the same bytes) to stage s-1's rank; torch
sends each as one gloo message on tag 0, pipelib on a tag per (kind, stage), with `comms`'
small header only on simulated devices or with check=True. So the two gradients, and the
monolith's (`Recipe(...).first_step()`), can be compared with `assert_close`, and the two step times set
side by side (`compare_step_times`, bench/pipelines.py). Two steps must not overlap on a rank
pair (torch's tag 0 is also pipelib's first activation queue): one `cluster.run` per step, or
a barrier between them, as `timed_steps` does.

`torch_pipeline_order` returns torch's own action order as a pipelib `Schedule`, so the book
can print both tables side by side (`format_table`).

Chapter 13 (pipelines IV: zero bubble, DualPipeV, against PyTorch).
"""
from __future__ import annotations

import csv
import io
from types import MappingProxyType

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipelib.pipeline.schedules import ALIASES, REGISTRY, Schedule, from_csv, resolve_schedule, schedule_info
from pipelib.pipeline.stage import stage_grads, stage_modules
from pipelib.batches import global_batch
from pipelib.pipeline.step import Runner, StepOptions, check_step, timed_steps
from pipelib.results import StepResult

__all__ = ["TORCH_SCHEDULES", "check_torch_step", "prepare_torch_step", "torch_train_step",
           "run_torch_train_step", "compare_step_times", "run_compare_step_times",
           "torch_pipeline_order"]

# pipelib's schedule name -> torch's class (torch.distributed.pipelining), from each schedule's
# registry entry (`ScheduleInfo.torch_class`). zb_h1 is torch's ZB1P with one stage per rank.
# pipelib's naive has no torch counterpart, torch's LoopedBFS none in pipelib.
TORCH_SCHEDULES = MappingProxyType({name: info.torch_class for name, info in REGISTRY.items() if info.torch_class})


def _torch_name(schedule) -> str:
    if not isinstance(schedule, str):
        raise ValueError(f"torch.distributed.pipelining runs its own schedules, chosen by name: "
                         f"pass one of {sorted(TORCH_SCHEDULES)}, not {type(schedule).__name__}")
    name = ALIASES.get(schedule, schedule)
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"schedule {schedule!r} has no counterpart in torch.distributed.pipelining; "
                         f"choose one of {sorted(TORCH_SCHEDULES)}")
    return name


def _torch_placement(name: str, p: int, num_stages: int) -> tuple[int, ...]:
    """torch's stage -> rank map: looped (stage % p), or V for ZB-V and DualPipeV."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    style = "v" if schedule_info(name).v_shaped else "loop"
    mapping = generate_stage_to_rank_mapping(p, num_stages, style)
    return tuple(mapping[k] for k in range(num_stages))


def check_torch_step(schedule, p, m, model_config=None, batch_size=None, *, num_chunks: int = 2,
                     world_size: int | None = None) -> Schedule:
    """`check_step`, plus what torch refuses; run it in the notebook before any engine work.

    Raises a ValueError naming the values for: a schedule torch lacks (naive, a custom
    Schedule), m < p with 1F1B (torch's Schedule1F1B needs m >= p; pipelib's runs any m), and a
    stage placement that differs from torch's (then the comparison would be meaningless).
    Returns pipelib's Schedule of the same name.
    """
    name = _torch_name(schedule)
    s = check_step(name, p, m, model_config, batch_size, num_chunks=num_chunks, world_size=world_size)
    info = schedule_info(name)
    if info.torch_needs_m_ge_p and m < p:
        raise ValueError(f"torch's {info.torch_class} refuses m={m} microbatches with p={p} stages "
                         f"(it needs m >= p; pipelib's {name} runs any m): use m >= {p}")
    theirs = _torch_placement(name, p, s.num_stages)
    if theirs != s.stage_to_rank:
        raise ValueError(f"{name}: pipelib puts stages on ranks {list(s.stage_to_rank)} but torch "
                         f"on {list(theirs)}; the two runs would not be comparable")
    return s


def _pipeline_group(p: int, group):
    """The p ranks of the pipeline. torch's stages need a group of exactly p ranks: `group`
    itself, or on a bigger world without one the mesh's pp group of ranks 0..p-1 (made once per
    engine and kept on the device: `runtime.mesh`; every rank must call this). Ranks outside it
    get NON_GROUP_MEMBER."""
    from pipelib.runtime.mesh import Mesh

    size = dist.get_world_size(group)
    if size == p:
        return group
    if group is not None:
        raise ValueError(f"torch's pipelining needs a group of exactly p={p} ranks; this one has {size}")
    mesh = Mesh.first(p, "pp")
    return mesh["pp"] if mesh.contains else dist.GroupMember.NON_GROUP_MEMBER


def _torch_options(options: dict) -> StepOptions:
    """`StepOptions` for torch's side: its schedule runs its own ops, so pipelib's executor's
    options (costs, recv_ahead, check) do not apply."""
    opts = StepOptions(**options)
    mine = {k: getattr(opts, k) for k in ("costs", "recv_ahead", "check")}
    if mine != {k: getattr(StepOptions(), k) for k in mine}:
        raise ValueError(f"torch.distributed.pipelining runs its own ops: {mine} are options of "
                         f"pipelib's executor only; leave them out for torch's twin")
    return opts


def _torch_pipeline(name: str, s: Schedule, modules, rank: int, group, device):
    """This rank's torch PipelineStages (same modules as pipelib's) and torch's schedule object."""
    import torch.distributed.pipelining as pp

    stages = [pp.PipelineStage(modules[k], k, s.num_stages, device, group=group)
              for k in s.stages_of(rank)]
    cls = getattr(pp, TORCH_SCHEDULES[name])
    single = issubclass(cls, pp.schedules.PipelineScheduleSingle)
    # loss_fn gives each microbatch's mean loss; scale_grads (default) divides the summed
    # gradients by m, so they equal the whole batch's mean, as pipelib's 1/m per microbatch.
    return stages, cls(stages[0] if single else stages, s.num_microbatches, loss_fn=F.cross_entropy)


def prepare_torch_step(name: str, s: Schedule, model_config, rank: int, batch_seed: int = 0,
                       opts: StepOptions | None = None, group=None) -> Runner:
    """`pipeline.prepare_step`'s twin: the same stages of the same MLP, run by torch's schedule."""
    from pipelib.runtime.device import current
    from pipelib.runtime.place import to_rank_device

    opts = opts or StepOptions()
    device = current().torch_device
    bounds, modules = stage_modules(model_config, s.num_stages, model_seed=opts.model_seed,
                                    balance=opts.balance, dtype=opts.dtype)
    mine = s.stages_of(rank)
    to_rank_device([modules[k] for k in mine], device)
    stages, sched = _torch_pipeline(name, s, modules, rank, group, device)
    x, y = global_batch(model_config, opts.rows(s), 0, batch_seed)
    args = (to_rank_device(x.to(opts.dtype), device),) if 0 in mine else ()
    target = to_rank_device(y, device) if s.num_stages - 1 in mine else None

    def step():
        losses: list = []
        sched.step(*args, target=target, losses=losses)
        return torch.stack(losses).mean().detach().cpu() if losses else None

    def grads():
        return {n: g for k in mine for n, g in stage_grads(bounds, k, modules[k]).items()}

    return Runner(step, [modules[k] for k in mine], grads)


def torch_train_step(schedule: str, p: int, m: int, model_config=None, batch_seed: int = 0, *,
                     group=None, steps: int = 1, timed: bool = False, **options):
    """Run on every engine: `pipeline.train_step`'s step, run by torch.distributed.pipelining.

    Same model, batch, stage boundaries and placement as pipelib's `train_step` (`options`:
    `StepOptions`' batch_size, model_seed, num_chunks, balance, dtype); torch's `PipelineStage`
    wraps each of this rank's stage modules and torch's schedule class of the same name runs
    `step(x, target=y, losses=...)`. Returns a `StepResult` (loss or None, {monolith parameter
    name: gradient} for this rank's stages), like `train_step`; ranks outside the pipeline
    return None. `steps` > 1 repeats the step on the same schedule object (torch infers shapes
    on the first only). `times` are seconds per step on the host's clock (`timed_steps`):
    torch's ops are not the device's, so a simulated device would model none of them.
    timed=True starts each step from a barrier. On a world bigger than p, every rank must call
    it (the pipeline's group is the mesh's pp group of ranks 0..p-1).
    """
    import torch.distributed.pipelining  # noqa: F401 (seconds on a loaded machine: before any message)

    from pipelib.model import MLPConfig

    name, opts = _torch_name(schedule), _torch_options(options)
    s = resolve_schedule(name, p, m, opts.num_chunks)
    group = _pipeline_group(s.num_ranks, group)
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    run = prepare_torch_step(name, s, model_config or MLPConfig(), dist.get_rank(group), batch_seed,
                             opts, group)
    loss, times, _ = timed_steps(run.step, run.modules, steps, group, barrier=timed or steps > 1,
                                 host=True)
    return StepResult(loss, run.grads(), times=tuple(times))


def compare_step_times(schedule: str, p: int, m: int, model_config=None, batch_seed: int = 0, *,
                       steps: int = 5, group=None, **options):
    """Run on every engine: pipelib's and torch's step alternately: {"pipelib": [s], "torch": [s]}.

    Both are built once (same model, batch, stages and placement; `options` are `StepOptions`',
    recv_ahead and check for pipelib's side only), then run in turn, step by step, `steps` times
    each after one warm-up (shape inference), by `pipelib.runtime.alternate.alternate_steps`:
    each step from a barrier, its time the slowest rank's on the host's clock (torch's ops are
    not the device's). Alternating step by step keeps the two sides' samples close in time on a
    shared machine. The last steps' gradients must agree (torch.testing.assert_close), so both
    did the same work.
    """
    import torch.distributed.pipelining  # noqa: F401

    from pipelib.model import MLPConfig
    from pipelib.pipeline.step import prepare_step
    from pipelib.runtime.alternate import alternate_steps
    from pipelib.runtime.device import current

    model_config, opts = model_config or MLPConfig(), StepOptions(**options)
    name, torch_opts = _torch_name(schedule), _torch_options({**options, "recv_ahead": 2, "check": False})
    s = resolve_schedule(name, p, m, opts.num_chunks)
    group = _pipeline_group(s.num_ranks, group)
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    rank, dev = dist.get_rank(group), current()
    with dev.measure(fresh_memory=True):  # new models: no pointers of earlier ones
        runs = {"pipelib": prepare_step(s, model_config, rank, batch_seed, opts, group),
                "torch": prepare_torch_step(name, s, model_config, rank, batch_seed, torch_opts, group)}
        dev.memory.track_module(*runs["pipelib"].modules)

        def side(run):
            def step():
                for mod in run.modules:
                    mod.zero_grad(set_to_none=True)
                run.step()
            return step
        times = alternate_steps({k: side(r) for k, r in runs.items()}, steps, warmup=1, group=group)
    mine, theirs = runs["pipelib"].grads(), runs["torch"].grads()
    for k in mine:
        torch.testing.assert_close(mine[k], theirs[k], msg=lambda e, k=k: f"rank {rank} {k}: {e}")
    return times


def run_torch_train_step(cluster, schedule: str, p: int, m: int, model_config=None,
                         batch_seed: int = 0, **kw) -> list:
    """Check in the notebook (`check_torch_step`), then `torch_train_step` on every rank."""
    from pipelib.model import MLPConfig

    opts, _ = StepOptions.split(kw, torch_train_step)  # an unknown keyword fails here, as a TypeError
    check_torch_step(schedule, p, m, model_config or MLPConfig(), opts.batch_size,
                     num_chunks=opts.num_chunks, world_size=cluster.world_size)
    return cluster.run(torch_train_step, schedule, p, m, model_config, batch_seed, **kw)


def run_compare_step_times(cluster, schedule: str, p: int, m: int, model_config=None,
                           batch_seed: int = 0, **kw) -> dict:
    """Check in the notebook, run `compare_step_times` on every rank: per side the step times
    (the slowest rank's, warm-up dropped) and their median."""
    import statistics

    from pipelib.model import MLPConfig

    opts, _ = StepOptions.split(kw, compare_step_times)
    check_torch_step(schedule, p, m, model_config or MLPConfig(), opts.batch_size,
                     num_chunks=opts.num_chunks, world_size=cluster.world_size)
    per_rank = [r for r in cluster.run(compare_step_times, schedule, p, m, model_config,
                                       batch_seed, **kw) if r is not None]
    out = {}
    for side in ("pipelib", "torch"):
        steps = per_rank[0][side]  # every rank holds the slowest rank's times
        out[side] = {"steps_s": steps, "median_s": statistics.median(steps)}
    out["ratio"] = out["pipelib"]["median_s"] / out["torch"]["median_s"]
    return out


def torch_pipeline_order(schedule: str, p: int, m: int, num_chunks: int = 2) -> Schedule:
    """torch's own compute order for `schedule` as a pipelib Schedule (no process group needed).

    torch computes every rank's order when a schedule object is built; like torch's
    `_schedule_visualizer.get_schedule_ops`, a stand-in stage (a mock) gives it p and the
    number of stages. Idle slots and REDUCE_GRAD are dropped and DualPipeV's OVERLAP_F_B pairs
    written as two actions (`schedules.from_csv`). Note torch's Schedule1F1B *draws* its last
    rank's order off by one (starting at F1) while its runtime runs F0 first, as pipelib does.
    """
    from unittest import mock

    import torch.distributed.pipelining as pp

    name = _torch_name(schedule)
    s = resolve_schedule(name, p, m, num_chunks)
    cls = getattr(pp, TORCH_SCHEDULES[name])
    stage = mock.create_autospec(pp.PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, s.num_stages
    single = issubclass(cls, pp.schedules.PipelineScheduleSingle)
    order = cls(stage if single else [stage] * s.num_chunks, m).pipeline_order
    out = io.StringIO()
    writer = csv.writer(out)
    for r in range(p):
        writer.writerow(["" if a is None else repr(a) for a in order[r]])
    return from_csv(out.getvalue(), num_microbatches=m, name=f"torch {cls.__name__}")
