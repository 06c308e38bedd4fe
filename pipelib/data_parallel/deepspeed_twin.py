"""DeepSpeed's ZeRO on the same model and data as pipelib's, on CPU, without a launcher.

DeepSpeed (Rasley et al. 2020) is the library ZeRO came from (Rajbhandari et al. 2020). It
expects its own launcher (`deepspeed train.py`), which starts one process per rank and sets
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Here `run_deepspeed` does the
launcher's job with `pipelib.runtime.spawn.run_spawned` (fresh processes, outside the notebook's
engine cluster, which make the gloo process group themselves, meeting at a file in a private
directory rather than at a TCP store open on every interface); DeepSpeed finds it and uses it.

Two things DeepSpeed compiles on first use, and how this twin avoids both:

- CPU FusedAdam (about 59 s): ``"torch_adam": true`` in the optimizer's params uses torch's Adam;
- the shared-memory all-reduce `deepspeed_shm_comm` (about 28 s), built when the communication
  backend starts. It serves only `inference_all_reduce`, which training never calls, so the
  twin marks it unavailable (`deepspeed.ops.__compatible_ops__`) before `deepspeed.initialize`:
  nothing is compiled and no timed figure ever includes a build (``build_shm=True`` lets it
  build, to measure the difference).

Every rank trains `steps` steps on its slice of the same batches as pipelib's ZeRO and the
single process (`Recipe.batch`); rank 0 returns the gradients of the first step and the
parameters after the last one, gathered to full tensors with `deepspeed.utils.safe_get_full_grad`
/ `safe_get_full_fp32_param`.

Introduced in chapter 08.
"""
from __future__ import annotations

import json
import time


def deepspeed_config(stage: int, lr: float = 1e-3, micro_batch: int = 4, *, world_size: int = 2,
                     bf16: bool = False, betas=(0.9, 0.999), eps: float = 1e-8) -> dict:
    """The JSON config DeepSpeed reads: ZeRO `stage`, torch's Adam, no gradient clipping."""
    cfg = {
        "train_batch_size": micro_batch * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "betas": list(betas), "eps": eps,
                                                 "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _deepspeed_rank(job):
    """One spawned rank (`pipelib.runtime.spawn.run_spawned`: the gloo group is made): DeepSpeed
    finds the default group and uses it. Rank 0 returns what the caller compares; the others None."""
    import logging
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")  # deprecations inside DeepSpeed, not the reader's concern
    import deepspeed
    from deepspeed.utils import logger, safe_get_full_fp32_param, safe_get_full_grad

    logger.setLevel(logging.ERROR)
    if not job["build_shm"]:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from pipelib.recipe import Recipe, loss_of

    rank, world_size = dist.get_rank(), dist.get_world_size()
    recipe = Recipe.from_dict(job["recipe"])
    model = recipe.build()
    t0 = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=job["config"], dist_init_required=False)
    init_s = time.perf_counter() - t0
    names = [n for n, _ in model.named_parameters()]
    grads, losses, times = None, [], []
    for step in range(recipe.steps):
        x, y = recipe.batch(step, rank, world_size)  # inputs in bf16 under mixed precision
        t = time.perf_counter()
        loss = loss_of(engine, x, y)
        engine.backward(loss)
        if step == 0:
            grads = {n: safe_get_full_grad(p).detach().float().clone()
                     for n, p in zip(names, engine.module.parameters())}
        engine.step()
        times.append(time.perf_counter() - t)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)  # the global batch's loss, for the curve (not timed)
        losses.append(mean.item() / world_size)
    params = {n: safe_get_full_fp32_param(p).detach().float().clone()
              for n, p in zip(names, engine.module.parameters())}
    inner = engine.optimizer.optimizer  # torch's Adam, on this rank's fp32 partition
    state = {"partition": sum(p.numel() for g in inner.param_groups for p in g["params"]),
             "adam_moments": sum(v.numel() for st in inner.state.values() for k, v in st.items()
                                 if k in ("exp_avg", "exp_avg_sq"))}
    if rank:
        return None
    return {"grads": grads, "params": params, "losses": losses, "times": times, "init_seconds": init_s,
            "state_numel": state}


def run_deepspeed(recipe, stage: int, *, world_size: int = 2, build_shm: bool = False):
    """Train `recipe` (a `pipelib.recipe.Recipe`: its model, global batch, steps, lr; bf16 with
    fp32 master weights when it says mixed_precision) with DeepSpeed ZeRO `stage` on
    `world_size` spawned CPU processes; return rank 0's `StepResult`: grads of the *first* step
    (full tensors), params after `steps`, losses (the whole batch's, averaged over ranks), times
    (seconds per step), stats {"config", "init_seconds" (deepspeed.initialize), "state_numel"
    (rank 0's Adam moments, in elements), "seconds" (the whole run, process start-up
    included)}."""
    from pipelib.checks import check_int
    from pipelib.data_parallel.zero_runner import check_recipe

    batch = check_recipe(recipe, "run_deepspeed").batch_size
    if recipe.optimizer != "adam":
        raise ValueError(f"run_deepspeed: recipe.optimizer={recipe.optimizer!r}; the twin configures "
                         f"DeepSpeed's Adam, so use a recipe with optimizer='adam'")
    check_int(world_size, "world_size", minimum=1, context="run_deepspeed", hint="processes to spawn")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"run_deepspeed: stage={stage!r}; DeepSpeed's ZeRO stages are 0, 1, 2 and 3")
    if batch % world_size:
        raise ValueError(f"run_deepspeed: batch={batch} does not divide by world_size={world_size}; "
                         f"use a multiple of {world_size}")
    config = deepspeed_config(stage, recipe.lr, batch // world_size, world_size=world_size,
                              bf16=recipe.mixed_precision)
    job = {"recipe": recipe.to_dict(), "config": config, "build_shm": build_shm}
    from pipelib.runtime.spawn import run_spawned

    t0 = time.perf_counter()
    # DeepSpeed reads its accelerator from the environment before it is imported; its threads can
    # crash the interpreter's teardown, so the ranks leave with os._exit once their result is saved
    res = run_spawned(_deepspeed_rank, world_size, (job,), env={"DS_ACCELERATOR": "cpu"}, hard_exit=True,
                      what=f"DeepSpeed ZeRO-{stage} on {world_size} spawned processes")[0]
    from pipelib.results import StepResult

    stats = {"config": config, "init_seconds": res["init_seconds"], "state_numel": res["state_numel"],
             "seconds": time.perf_counter() - t0, "first_step_grads": True}
    return StepResult(loss=res["losses"][-1], grads=res["grads"], stats=stats, times=tuple(res["times"]),
                      losses=tuple(res["losses"]), params=res["params"])


def config_json(stage: int = 3, **kw) -> str:
    """`deepspeed_config` as the JSON text a reader would save as ds_config.json."""
    return json.dumps(deepspeed_config(stage, **kw), indent=2)
