"""DualPipeV with an MoE layer in every stage: chapter 13's executor runs chapter 16's all-to-alls.

    costs = exchange_costs(alpha, ep=2, F=1e-3, B=2e-3, I=1e-3, W=1e-3)
    cluster.run(moe_pipeline_step, "dualpipe_v", 2, 4, spec, ep=2, costs=costs,
                profile=latency_only(profile, alpha))   # a StepResult per rank
    moe_pipeline_reference("dualpipe_v", 2, 4, spec, ep=2)   # one process, all experts

On a pp x ep mesh (`Topology(pp=p, dp=ep, ep=ep)`: ep replicas of the pipeline, each on its own
share of the batch) every stage is one residual MoE layer (`MoEStage`: h + MoE(h)) whose experts
are split over the ep group: the ep ranks at the same pipeline position, which run the same
actions in the same order, so each F, B and I of a stage meets its peers in the same dispatch
and combine (`pipelib.expert_parallel.dispatch`). The stages are `Stage(per_module=True)`: W
differentiates each expert, router alone and runs no all-to-all, I runs the backward's two.

`pipelib.pipeline.executor.execute` runs the schedule unchanged. On a simulated device with a
virtual clock it plays each of DualPipeV's F&B pairs as `simulate` does (`Costs.overlaps`): the
all-to-alls of both on a communication lane beside the compute. `exchange_costs` gives
`simulate` the same all-to-all time from the link: each uneven all-to-all is ep - 1 pairwise
rounds (`pipelib.comm.uneven`), three in a forward (counts, dispatch, combine), two in a
backward. On a link with a latency and no bandwidth term (`latency_only`) that time does not
depend on the routing, as simulate's one number per action assumes; with a bandwidth term each
all-to-all would last as long as its largest message, different per microbatch.

Gradients: a replica's loss is the mean over its microbatches; an expert's gradient already
sums over the replicas (backward's all-to-alls bring every token's gradient home), the rest is
all-reduced over the ep group; both are divided by ep, so they equal one process on the whole
batch with the same (dropless) routing. Chapter 16.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from pipelib.expert_parallel.experts import expert_seed, init_expert
from pipelib.expert_parallel.gpt import is_expert_param
from pipelib.expert_parallel.layer import MoE, MoESpec
from pipelib.results import StepResult
from pipelib.trace import Kind, Trace


@dataclass(frozen=True)
class PipeSizes:
    """The toy model: `n_embd` features (and classes) per token, `seq` tokens per row, `rows`
    rows per microbatch on each replica, the seed of the weights and the batch."""

    n_embd: int = 8
    seq: int = 4
    rows: int = 2
    seed: int = 0


class MoEStage(nn.Module):
    """One pipeline stage: h = mix(x), then h + MoE(h), on (B, T, C); MoE layer `index` of
    `num_stages`. `mix` (a linear map, replicated, attention's place in a block) makes the
    experts' input need a gradient on stage 0 too, so every backward runs both all-to-alls."""

    def __init__(self, spec: MoESpec, sizes: PipeSizes, index: int, num_stages: int):
        super().__init__()
        self.mix = nn.Linear(sizes.n_embd, sizes.n_embd)
        init_expert(self.mix, expert_seed(sizes.seed, index, -2), num_stages)
        self.moe = MoE(spec, sizes.n_embd, index, sizes.seed, num_stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        h = self.mix(x)  # (B, T, C)
        return h + self.moe(h)  # (B, T, C)


def token_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every token: out (B, T, C) logits, y (B, T) classes."""
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def pipeline_batch(sizes: PipeSizes, m: int, ep: int, replica: int | None = None):
    """(x, y) of the whole batch (ep replicas x m microbatches x rows), or of one replica."""
    g = torch.Generator().manual_seed(sizes.seed + 1)
    n = ep * m * sizes.rows
    x = torch.randn(n, sizes.seq, sizes.n_embd, generator=g)
    y = torch.randint(0, sizes.n_embd, (n, sizes.seq), generator=g)
    if replica is None:
        return x, y
    part = slice(replica * m * sizes.rows, (replica + 1) * m * sizes.rows)
    return x[part], y[part]


def latency_only(profile, alpha: float):
    """`profile` with a link whose every message costs `alpha` seconds, whatever its bytes."""
    from pipelib.costmodel import Link, get_profile

    profile = get_profile(profile)
    return replace(profile, name=f"{profile.name}, {alpha:g} s a message",
                   link=Link(f"latency {alpha:g} s", alpha, math.inf))


def exchange_costs(alpha: float, ep: int, **compute):
    """`simulate.Costs` of the MoE pipeline on a latency-only link (module docstring): `compute`
    gives F, B, I, W; a pipeline message costs alpha, a forward's all-to-alls 3 (ep - 1) alpha,
    a backward's 2 (ep - 1) alpha."""
    from pipelib.pipeline.simulate import Costs

    return Costs(**compute, p2p=alpha, all_to_all=3 * (ep - 1) * alpha,
                 all_to_all_backward=2 * (ep - 1) * alpha)


def action_trace(trace: Trace) -> Trace:
    """Every rank's pipeline actions on a measured trace, as `simulate` draws them: a `Trace` of
    the F, B, I and W compute events, each starting at its action's start. A COMPUTE event is the
    math alone, so an action that ran alone starts at its first collective (its all-to-alls
    precede its math on the clock); an overlapped pair's collectives ran on the lane beside it and
    change nothing. Measured ranks keep their global numbers: match them against the prediction
    with each rank's pp coordinate, `action_trace(measured).matches(simulate(...).events,
    ranks={r: topo.coords(r).pp for r in range(topo.world_size)})`."""
    by_rank: dict[int, list] = {}
    for e in trace:
        by_rank.setdefault(e.rank, []).append(e)
    out = []
    for events in by_rank.values():
        events.sort(key=lambda e: (e.start, e.end))
        colls = [e for e in events if e.kind == Kind.COLLECTIVE]
        prev = float("-inf")
        for e in events:
            if e.kind == Kind.COMPUTE and e.label in ("F", "B", "I", "W"):
                out.append(replace(e, start=min([e.start] + [c.start for c in colls
                                                             if c.start >= prev and c.end <= e.start])))
                prev = e.end
    return Trace(out, trace.world_size)


def action_spans(trace: Trace, rank: int) -> list[tuple[str, int, int, float, float]]:
    """`rank`'s actions of `action_trace` as (op, stage, microbatch, start, end) tuples."""
    return [(e.label, e.stage, e.microbatch, e.start, e.end) for e in action_trace(trace.filter(rank=rank))]


def _named_grads(modules: dict) -> dict:
    return {f"stages.{k}.{name}": p.grad.detach().clone()
            for k, mod in modules.items() for name, p in mod.named_parameters() if p.grad is not None}


def moe_pipeline_step(schedule, p: int, m: int, spec: MoESpec, sizes: PipeSizes = PipeSizes(), *,
                      ep: int, costs=None, profile=None, builtin: bool = False) -> StepResult | None:
    """One step of `schedule` (a name or a Schedule on p ranks, m microbatches) on a pp x ep
    mesh, on every engine (module docstring); None on ranks beyond p x ep. The result's loss is
    the step's (mean over the replicas) on the ranks of the last stage, its gradients this
    rank's stages' under `moe_pipeline_reference`'s names; `profile` replaces the device's
    inside the step."""
    from pipelib.comm.registry import collective_info
    from pipelib.expert_parallel.gpt import sync_grads
    from pipelib.pipeline.executor import execute
    from pipelib.pipeline.stage import Stage
    from pipelib.pipeline.schedules import resolve_schedule
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh
    from pipelib.runtime.place import to_rank_device
    from pipelib.topology import Topology

    mesh = Mesh(Topology(pp=p, dp=ep, ep=ep))
    if not mesh.contains:
        return None
    s = resolve_schedule(schedule, p, m)
    mine = {k: to_rank_device(MoEStage(spec, sizes, k, s.num_stages)) for k in s.stages_of(mesh.local_rank("pp"))}
    for mod in mine.values():
        mod.moe.shard(mesh["ep"], builtin=builtin)
    x, y = to_rank_device(pipeline_batch(sizes, m, ep, mesh.local_rank("dp")))
    stages = [Stage(mod, k, s.num_stages, per_module=True) for k, mod in mine.items()]
    dev = current()
    with dev.overrides(profile=profile) if profile is not None else contextlib.nullcontext():
        loss = execute(s, stages, x, y, token_loss, mesh["pp"], costs=costs)
    named = [(k, prm) for mod in mine.values() for k, prm in mod.named_parameters()]
    sync_grads([prm for k, prm in named if not is_expert_param(k)], mesh["ep"], ep, "ep grads")
    sync_grads([prm for k, prm in named if is_expert_param(k)], None, ep, "expert grads")
    if loss is not None:
        loss = loss.detach().reshape(1)
        collective_info("all_reduce").run(loss, mesh["ep"], label="loss")
        loss = loss[0] / ep
    sent = {k: mod.moe.last.sent_rows for k, mod in mine.items()}
    return StepResult(loss=loss, grads=_named_grads(mine), stats={"sent_rows": sent})


def moe_pipeline_reference(schedule, p: int, m: int, spec: MoESpec, sizes: PipeSizes = PipeSizes(), *,
                           ep: int) -> StepResult:
    """One process: every stage with all its experts, run in order on the whole batch."""
    from pipelib.pipeline.schedules import resolve_schedule

    s = resolve_schedule(schedule, p, m)
    modules = {k: MoEStage(spec, sizes, k, s.num_stages) for k in range(s.num_stages)}
    x, y = pipeline_batch(sizes, m, ep)
    h = x
    for k in range(s.num_stages):
        h = modules[k](h)
    loss = token_loss(h, y)
    loss.backward()
    return StepResult(loss=loss.detach(), grads=_named_grads(modules))
