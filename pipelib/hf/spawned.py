"""The Hugging Face Llama's parallel runs on spawned gloo ranks, checked against one process.

`run_spawned(fn, world_size, ...)` (`pipelib.runtime.spawn`, the one launcher-free spawner,
also behind chapter 08's DeepSpeed twin) starts `world_size` fresh processes that meet at a file
in a private directory and make a gloo group; each calls `fn(*args, **kwargs)` and the parent
gets one result per rank. No pipelib `Cluster`, no engine: the strategy cores run under plain
torch.distributed, as they would under torchrun.

`hf_checks(...)` runs the three strategies of `pipelib.hf.parallel` in one spawn (a spawn pays
seconds of imports: torch, then transformers) and checks each against `llama_reference`.

Introduced in chapter 19.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from pipelib.runtime.spawn import run_spawned  # noqa: F401  (chapter 19 imports it from here)


@dataclass(frozen=True)
class HFChecks:
    """What `hf_checks` compared with one process: each run's `Agreement` (max |diff| of the
    loss, gradients and, for ZeRO, parameters after its steps) and what each rank held."""

    pipeline: dict              # schedule name -> pipelib.results.Agreement
    zero: dict                  # ZeRO stage -> Agreement
    tp: object                  # Agreement
    optimizer_state_share: dict  # stage -> rank 0's optimizer elements / the whole model's
    tp_local_share: float       # rank 0's parameter elements under TP / the whole model's
    num_params: int
    seconds: float              # the spawn: process start, imports and every run

    def table(self) -> list[tuple[str, str]]:
        """(run, what was checked) rows for the chapter."""
        rows = [(f"pipeline, {name}", str(a)) for name, a in self.pipeline.items()]
        rows += [(f"ZeRO-{s}", str(a)) for s, a in self.zero.items()]
        return rows + [("tensor parallel", str(self.tp))]


def _all_checks(config, schedules, batch, seq_len, stages, seed):
    from pipelib.hf.parallel import hf_pipeline_step, hf_tp_step, hf_zero_train

    return {"pipeline": [hf_pipeline_step(config, s, batch, seq_len, seed=seed) for s in schedules],
            "zero": {s: hf_zero_train(config, s, batch, seq_len, seed=seed) for s in stages},
            "tp": hf_tp_step(config, batch, seq_len, seed=seed)}


def hf_checks(config=None, *, schedules=None, world_size: int = 2, batch: int = 8, seq_len: int = 16,
              stages=(1, 2, 3), seed: int = 0, timeout: float = 300.0) -> HFChecks:
    """Pipelines (`schedules`, default 1F1B over `world_size` stages and interleaved 1F1B over
    two stages per rank, 4 microbatches each), ZeRO `stages` and tensor parallelism of the Llama
    (`llama_config()` unless given) on `world_size` spawned ranks, each checked against
    `llama_reference` (an AssertionError naming the tensor otherwise)."""
    from pipelib.hf.llama import llama_config, llama_reference
    from pipelib.pipeline.schedules import schedule_info
    from pipelib.results import check_against_reference

    config = config or llama_config()
    schedules = schedules or (schedule_info(name="1f1b").make(world_size, 4),
                              schedule_info(name="interleaved_1f1b").make(world_size, 4, 2))
    t0 = time.perf_counter()
    outs = run_spawned(_all_checks, world_size, (config, tuple(schedules), batch, seq_len, tuple(stages), seed),
                       timeout=timeout)
    seconds = time.perf_counter() - t0
    one = llama_reference(config, batch, seq_len, seed=seed)
    two = llama_reference(config, batch, seq_len, seed=seed, steps=2)
    numel = sum(g.numel() for g in one.grads.values())
    pipes = {s.name: check_against_reference([o["pipeline"][i] for o in outs], one, rtol=1e-5, atol=1e-6)
             for i, s in enumerate(schedules)}
    zero = {}
    for s in stages:
        res = [o["zero"][s] for o in outs]
        zero[s] = check_against_reference(res, two.loss, two.grads, ref_params=two.params, ref_losses=two.losses,
                                          shared=True, rtol=1e-5, atol=1e-6)
    tp = check_against_reference([o["tp"] for o in outs], one, shared=True, rtol=1e-5, atol=1e-6)
    moments = numel  # SGD's momentum buffer over every parameter
    return HFChecks(pipes, zero, tp,
                    {s: outs[0]["zero"][s].stats["optimizer_state_numel"] / moments for s in stages},
                    outs[0]["tp"].stats["local_numel"] / outs[0]["tp"].stats["numel"], numel, seconds)
