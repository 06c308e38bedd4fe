"""Recomputation inside pipeline stages: the GPT pipeline step with a policy on every stage.

    run_recompute_gpt_step(cluster, "1f1b", 4, 8, cfg, policy="full")  # a StepResult per rank

The step is `pipelib.pipeline.gpt.gpt_train_step` (chapter 12), unchanged: every rank builds the
same seeded GPT, cuts it between blocks with `gpt_stages`, keeps its stages and runs `execute`;
then the tied embedding/head gradient is summed. Recomputation is composed from outside: the
step's `prepare` hook applies `apply_recompute` to each of this rank's stage modules after the
cut, so a segment of every_k never crosses a stage boundary. The pipeline code knows nothing
of it. A smaller simulated device is a scoped `Device.overrides(capacity=...)` around the step.

A stage of 1F1B holds up to p - r microbatches in flight on rank r (chapter 12); recomputation
shrinks what each of them keeps, and adds, during one backward at a time, the activations of
the piece being rerun. `execute`'s peak_activation_bytes is read after each forward, so it
misses that transient: the step's measured peak sees every byte (`StepResult.peak_bytes`, all
categories; `peak_rerun_bytes` here is that peak above the parameters and buffers).

Chapter 14.
"""
from __future__ import annotations

from dataclasses import replace

from pipelib.checks import check_int
from pipelib.pipeline.gpt import PIPELINE_GPT, check_gpt_step, gpt_train_step
from pipelib.pipeline.step import StepOptions
from pipelib.recompute.policies import apply_recompute, check_policy
from pipelib.results import StepResult
from pipelib.runtime.device import current


def recompute_gpt_step(schedule, p: int | None = None, m: int | None = None, gpt_config=None,
                       batch_seed: int = 0, *, policy: str = "none", k: int | None = None,
                       capacity: int | None = None, **step) -> StepResult | None:
    """Run on every engine: `gpt_train_step` with `policy` applied to this rank's stages.

    `step` are gpt_train_step's keywords (batch_size, costs, group, ...). The result is its
    StepResult, with stats peak_rerun_bytes: the step's peak above what the rank held before
    it (parameters and buffers), reruns in backward included. `capacity` (bytes) makes this
    step's simulated device that small: going over raises `SimulatedOutOfMemoryError`.
    """
    with current().overrides(capacity=capacity):
        res = gpt_train_step(schedule, p, m, gpt_config, batch_seed,
                             prepare=lambda module: apply_recompute(module, policy, k), **step)
    if res is None:
        return None
    return replace(res, stats={**res.stats, "peak_rerun_bytes": res.peak_bytes - res.stats["base_bytes"]})


def run_recompute_gpt_step(cluster, schedule, p=None, m=None, gpt_config=None,
                           batch_seed: int = 0, **kw) -> list:
    """Check in the notebook process (the schedule, the policy, k), then run on every rank."""
    cfg = gpt_config or PIPELINE_GPT
    if kw.get("capacity") is not None:  # 0 is a capacity a reader may mean: refused, not ignored
        check_int(kw["capacity"], "capacity", hint="bytes the simulated device holds")
    StepOptions.split({k: v for k, v in kw.items() if k not in ("policy", "k", "capacity")}, gpt_train_step)
    s = check_gpt_step(schedule, p, m, cfg, kw.get("batch_size"), world_size=cluster.world_size)
    check_policy(kw.get("policy", "none"), kw.get("k"), cfg.n_layer)
    return cluster.run(recompute_gpt_step, s, None, None, cfg, batch_seed, **kw)
