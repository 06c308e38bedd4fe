"""Recomputation inside pipeline stages: the GPT pipeline step with a policy on every stage.

    run_recompute_gpt_step(cluster, "1f1b", 4, 8, cfg, policy="full")  # a StepResult per rank

The step is `pipelib.pipeline.gpt`'s (chapter 12): every rank builds the same seeded GPT, cuts
it between blocks with `gpt_stages`, keeps its stages and runs `execute`; then the tied
embedding/head gradient is summed. The one difference: `apply_recompute` is applied to each of
this rank's stage modules after the cut, so a segment of every_k never crosses a stage
boundary. The pipeline code knows nothing of it.

A stage of 1F1B holds up to p - r microbatches in flight on rank r (chapter 12); recomputation
shrinks what each of them keeps, and adds, during one backward at a time, the activations of
the piece being rerun. `execute`'s peak_activation_bytes is read after each forward, so it
misses that transient: the tracker's own peak sees every byte (`peak_rerun_bytes` here).

Chapter 14.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from pipelib.model import GPT, GPTConfig, cross_entropy
from pipelib.pipeline.executor import execute
from pipelib.pipeline.gpt import (PIPELINE_GPT, check_gpt_step, gpt_stages, make_tokens,
                                  sum_tied_grads)
from pipelib.pipeline.stage import Stage
from pipelib.pipeline.step import resolve_schedule
from pipelib.recompute.policies import apply_recompute, check_policy
from pipelib.results import StepResult
from pipelib.runtime.device import current


def recompute_gpt_step(schedule, p: int | None = None, m: int | None = None,
                       gpt_config: GPTConfig | None = None, batch_seed: int = 0, *,
                       policy: str = "none", k: int | None = None,
                       batch_size: int | None = None, model_seed: int = 0, group=None,
                       costs=None, capacity: int | None = None,
                       dtype=torch.float32) -> StepResult | None:
    """Run on every engine: `pipelib.pipeline.gpt_train_step` with `policy` on this rank's stages.

    stats: execute's (peak_activation_bytes after forwards, messages...) plus
    peak_rerun_bytes (saved activations at their most, reruns in backward included) and
    peak_total_bytes (parameters and buffers too). `capacity` (bytes) makes this step's
    simulated device that small: going over raises `SimulatedOutOfMemoryError` on the rank.
    """
    cfg = gpt_config or PIPELINE_GPT
    s = resolve_schedule(schedule, p, m)
    rank = dist.get_rank(group)
    if rank < 0 or rank >= s.num_ranks:
        return None
    model = GPT(cfg, seed=model_seed).to(dtype)
    modules = gpt_stages(model, s.num_stages)
    mine = [Stage(apply_recompute(modules[j], policy, k), j, s.num_stages)
            for j in s.stages_of(rank)]
    dev = current()
    dev.memory = dev.fresh_memory()
    before, dev.memory.capacity = dev.memory.capacity, capacity or dev.memory.capacity
    try:
        dev.memory.track_module(nn.ModuleList(st.module for st in mine))
        return _recompute_step_body(s, model, mine, dev, cfg, batch_size, batch_seed, group, costs)
    finally:
        dev.memory.capacity = before  # the next step's fresh tracker gets the device's own


def _recompute_step_body(s, model, mine, dev, cfg, batch_size, batch_seed, group, costs) -> StepResult:
    dev.memory.reset_peak()
    fixed = dev.memory.total  # parameters and buffers
    idx, targets = make_tokens(cfg, batch_size or 2 * s.num_microbatches, None, batch_seed)
    info: dict = {}
    loss = execute(s, mine, idx, targets, cross_entropy, group, costs=costs, stats=info)
    sum_tied_grads(model.embed.wte.weight, s, group)
    info["peak_rerun_bytes"] = dev.memory.peak - fixed
    info["peak_total_bytes"] = dev.memory.peak
    held = {id(q) for st in mine for q in st.module.parameters()}
    grads = {name: q.grad for name, q in model.named_parameters() if id(q) in held}
    return StepResult(loss, grads, info)


def run_recompute_gpt_step(cluster, schedule, p=None, m=None, gpt_config=None,
                           batch_seed: int = 0, **kw) -> list:
    """Check in the notebook process (the schedule, the policy, k), then run on every rank."""
    cfg = gpt_config or PIPELINE_GPT
    s = check_gpt_step(schedule, p, m, cfg, kw.get("batch_size"), world_size=cluster.world_size)
    check_policy(kw.get("policy", "none"), kw.get("k"), cfg.n_layer)
    return cluster.run(recompute_gpt_step, s, None, None, cfg, batch_seed, **kw)
