"""DeepSpeed's pipeline engine on chapter 12's MLP, on CPU, without a launcher, beside pipelib's.

DeepSpeed (Rasley et al. 2020) pipelines a model given as a list of layers: `PipelineModule(
layers, num_stages, loss_fn, partition_method)` keeps on each rank the layers of its stage, and
`deepspeed.initialize` wraps it in a `PipelineEngine`, whose `train_batch(data_iter)` pulls
`gradient_accumulation_steps` microbatches and runs its own 1F1B `TrainSchedule` (PipeDream's
one-forward-one-backward order with a flush at the end of the batch, Narayanan et al. 2019 and
2021: at most p microbatches in flight): stage s sends each microbatch's activation to stage s+1
with `dist.send` and receives its gradient back with `dist.recv` (DeepSpeed's
`runtime/pipe/p2p.py`; before the engine's first activation, a message with its shapes). The
microbatches' gradients accumulate, each loss scaled by 1/m, then the optimizer steps. So
DeepSpeed's pipeline configuration is partly in code (the layers, `num_stages`, how layers are
cut into stages) and partly in its JSON (microbatches = `gradient_accumulation_steps`,
microbatch rows = `train_micro_batch_size_per_gpu`); `configs_beside` sets it beside pipelib's
`Plan` and schedule for the same run.

`run_deepspeed_pipe` does the launcher's job as chapter 08's ZeRO twin does
(`pipelib.runtime.spawn.run_spawned`): fresh processes, the gloo group made at a file in a
private directory, `deepspeed.init_distributed` adopting it, nothing compiled. Every
rank builds the same seeded MLP (`pipelib.pipeline.stage.stage_modules`' model) and hands
DeepSpeed all its layers; DeepSpeed keeps its stage's. A post-accumulate-grad hook on each kept
parameter copies its gradient once the last microbatch's is in, before the optimizer step
changes anything, so the gradients are the step's, under the monolith's names, to compare with
pipelib's executor (`pipelib.pipeline.step.train_step`) and the single process.

DeepSpeed's own prints (its seed line and stage table) go to a log file per rank, not to the
notebook. Introduced in chapter 19.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


def pipe_config(num_microbatches: int, micro_batch: int, lr: float = 0.1) -> dict:
    """The JSON DeepSpeed reads for a pipeline of one data-parallel replica: m microbatches of
    `micro_batch` rows (train_batch_size = their product), fp32, ZeRO off (DeepSpeed's pipeline
    takes ZeRO 0 or 1 only). The optimizer is the caller's (torch's SGD, `run_deepspeed_pipe`)."""
    return {"train_batch_size": num_microbatches * micro_batch,
            "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": num_microbatches,
            "zero_optimization": {"stage": 0},
            "gradient_clipping": 0.0,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False}


def _pipe_rank(job):
    """One spawned rank (`pipelib.runtime.spawn.run_spawned`: the gloo group is made, output goes
    to the rank's log): DeepSpeed's pipeline engine, then pipelib's executor when asked."""
    import logging
    import warnings

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    world_size = dist.get_world_size()
    warnings.filterwarnings("ignore")
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.utils import logger

    logger.setLevel(logging.ERROR)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")  # adopts the group made above
    from pipelib.batches import global_batch
    from pipelib.model import MLP

    cfg, m = job["model_config"], job["num_microbatches"]
    model = MLP(cfg, seed=job["model_seed"])
    pipe = PipelineModule(layers=list(model.layers), num_stages=world_size, loss_fn=F.cross_entropy,
                          partition_method="uniform")
    names = {id(p): f"layers.{n}" for n, p in pipe.named_parameters()}  # '2.0.weight': the monolith's index
    grads = {}
    for p in pipe.parameters():
        p.register_post_accumulate_grad_hook(lambda q: grads.__setitem__(names[id(q)], q.grad.detach().clone()))
    engine, _, _, _ = deepspeed.initialize(model=pipe, optimizer=torch.optim.SGD(pipe.parameters(), lr=job["lr"]),
                                           config=job["config"], dist_init_required=False)
    x, y = global_batch(cfg, job["batch"], 0, job["batch_seed"])
    micro = list(zip(x.chunk(m), y.chunk(m)))
    t0 = time.perf_counter()
    loss = engine.train_batch(data_iter=iter(micro))
    seconds = time.perf_counter() - t0
    out = {"loss": loss.detach().clone() if engine.is_last_stage() else None, "grads": grads,
           "parts": list(pipe.parts), "stage": engine.stage_id, "seconds": seconds}
    if job["pipelib"]:  # pipelib's executor on the same ranks, group and batch: its 1F1B
        from pipelib.pipeline.step import train_step

        dist.barrier()
        out["pipelib"] = train_step(schedule="1f1b", p=world_size, m=m, model_config=cfg,
                                    batch_seed=job["batch_seed"], batch_size=job["batch"],
                                    model_seed=job["model_seed"])
    return out


def run_deepspeed_pipe(model_config=None, num_microbatches: int = 4, batch: int = 8, *, world_size: int = 2,
                       model_seed: int = 0, batch_seed: int = 0, lr: float = 0.1, pipelib: bool = False) -> list:
    """One step of DeepSpeed's pipeline engine on `world_size` spawned CPU processes (one stage
    each), chapter 12's MLP (`MLPConfig()` unless given) and the batch pipelib's executor gets
    (`pipelib.batches.global_batch`). Returns one `StepResult` per rank: the loss (the last
    stage's, the mean over microbatches), the gradients of its stage's parameters under the
    monolith's names (before the optimizer step), stats {"stage", "parts" (DeepSpeed's layer
    boundaries), "config", "seconds" (train_batch)}. With `pipelib`, each rank then also runs
    pipelib's executor (`train_step("1f1b", ...)`) on the same group and batch, its
    `StepResult` in stats["pipelib"]."""
    from pipelib.checks import check_int
    from pipelib.model import MLPConfig
    from pipelib.results import StepResult
    from pipelib.runtime.spawn import run_spawned

    cfg = model_config or MLPConfig()
    for name, v in (("world_size", world_size), ("num_microbatches", num_microbatches), ("batch", batch)):
        check_int(v, name, minimum=1, context="run_deepspeed_pipe")
    if batch % num_microbatches:
        raise ValueError(f"run_deepspeed_pipe: batch={batch} does not split into num_microbatches="
                         f"{num_microbatches}; use a multiple of {num_microbatches}")
    if cfg.num_layers < world_size:
        raise ValueError(f"run_deepspeed_pipe: {cfg.num_layers} layers cannot fill {world_size} stages; "
                         f"use world_size <= {cfg.num_layers}")
    config = pipe_config(num_microbatches, batch // num_microbatches, lr)
    job = {"model_config": cfg, "num_microbatches": num_microbatches, "batch": batch, "model_seed": model_seed,
           "batch_seed": batch_seed, "lr": lr, "config": config, "pipelib": pipelib}
    # DeepSpeed's threads can crash the interpreter's teardown: the ranks leave with os._exit once
    # their result is saved (as chapter 08's twin)
    res = run_spawned(_pipe_rank, world_size, (job,), env={"DS_ACCELERATOR": "cpu"}, quiet=True, hard_exit=True,
                      what=f"DeepSpeed's pipeline on {world_size} spawned processes")
    return [StepResult(r["loss"], r["grads"], stats={"stage": r["stage"], "parts": r["parts"], "config": config,
                                                     "seconds": r["seconds"], "pipelib": r.get("pipelib")})
            for r in res]


@dataclass(frozen=True)
class PipeComparison:
    """DeepSpeed's pipeline engine and pipelib's executor on the same ranks, model and batch,
    each checked against one process (`Recipe(...).first_step()`), and against each other."""

    deepspeed: object           # pipelib.results.Agreement against one process
    pipelib: object             # the same for pipelib's executor
    max_abs_diff: float         # between DeepSpeed's and pipelib's gradients
    deepspeed_parts: tuple      # DeepSpeed's layer boundaries per stage, e.g. (0, 2, 4)
    pipelib_parts: tuple        # pipelib's, from `partition`
    config: dict                # the JSON DeepSpeed read


def compare_with_pipelib(model_config=None, num_microbatches: int = 4, batch: int = 8, *,
                         world_size: int = 2, model_seed: int = 0, batch_seed: int = 0) -> PipeComparison:
    """One spawn: DeepSpeed's `PipelineEngine.train_batch` then pipelib's 1F1B `execute` on
    `world_size` ranks; both checked against the single process (AssertionError naming the
    tensor otherwise)."""
    import torch

    from pipelib.model import MLPConfig
    from pipelib.pipeline.stage import partition
    from pipelib.recipe import Recipe
    from pipelib.results import check_against_reference, gather

    cfg = model_config or MLPConfig()
    res = run_deepspeed_pipe(cfg, num_microbatches, batch, world_size=world_size, model_seed=model_seed,
                             batch_seed=batch_seed, pipelib=True)
    ref = Recipe(model=cfg, batch_size=batch, seed=model_seed, data_seed=batch_seed).first_step()
    theirs = check_against_reference(res, ref, rtol=1e-5, atol=1e-6)
    ours_res = [r.stats["pipelib"] for r in res]
    ours = check_against_reference(ours_res, ref, rtol=1e-5, atol=1e-6)
    a, b = gather(res), gather(ours_res)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    bounds = partition(cfg.num_layers, world_size)
    return PipeComparison(theirs, ours, diff, tuple(res[0].stats["parts"]),
                          (0, *(r.stop for r in bounds)), res[0].stats["config"])


def configs_beside(model_config=None, num_microbatches: int = 4, batch: int = 8, world_size: int = 2
                   ) -> list[tuple[str, str, str]]:
    """(concept, pipelib, DeepSpeed) rows for the same pipelined run: where each one says how
    many stages, which schedule, how many microbatches of how many rows, and how layers are cut."""
    from pipelib.model import MLPConfig

    cfg = model_config or MLPConfig()
    ds = pipe_config(num_microbatches, batch // num_microbatches)
    return [
        ("stages", f"Plan(pp={world_size})", f"PipelineModule(layers, num_stages={world_size}) in code"),
        ("schedule", 'Plan(pipeline="1f1b"): any schedule of the registry',
         "TrainSchedule (1F1B) by PipelineEngine; DualPipeVModule/DualPipeVEngine for DualPipeV (0.19.8)"),
        ("microbatches", f"Plan(pipeline=PipelineOptions(microbatches={num_microbatches}))",
         f'"gradient_accumulation_steps": {ds["gradient_accumulation_steps"]}'),
        ("rows per microbatch", f"batch_size / microbatches = {batch // num_microbatches}",
         f'"train_micro_batch_size_per_gpu": {ds["train_micro_batch_size_per_gpu"]}'),
        ("global batch", f"Recipe(batch_size={batch})", f'"train_batch_size": {ds["train_batch_size"]}'),
        ("cutting layers into stages", 'split_into_stages(layers, p, balance="layers")',
         'PipelineModule(partition_method="uniform")'),
        ("the model", f"{cfg.num_layers} layers of MLP({cfg.hidden} wide), cut by pipelib",
         "the same nn.Module layers in a list"),
        ("data parallelism with it", 'Plan(dp=..., data="ddp" or "zero1")',
         '"zero_optimization": {"stage": 0 or 1} (its pipeline refuses 2 and 3)'),
    ]
