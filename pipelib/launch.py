"""Training under torchrun: the same recipe and plan as the book's cluster, one process per device.

    torchrun --standalone --nproc-per-node 4 -m pipelib train --plan plan.json --recipe recipe.json
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 -m pipelib train --plan plan.json --check

`plan.json` is what `Plan.to_dict()` writes (the planner's `to_plan` prints one), `recipe.json`
what `Recipe.to_dict()` writes; flags (`--dp 2 --tp 2 --schedule 1f1b ...`) override either.
Each process reads the rank and world size torchrun puts in its environment, starts
torch.distributed (NCCL on GPUs, gloo on CPUs), takes this rank's GPU (LOCAL_RANK) or the CPU
as its `Device`, builds the plan's `Mesh` and runs `pipelib.trainer.train_plan`: the code the
notebooks run on engines, with no cluster. Rank 0 gathers every rank's step times, bytes and
peak memory, writes them as JSON (`--out`), and with `--check` trains the recipe in one process
(`Recipe.reference()`) and checks the losses, the last gradients and the final parameters
against it (`check_against_reference`), exiting 1 if they differ.

Everything that can be checked before any process group is: the plan's world size against
torchrun's, the plan against the recipe, GPU ranks against the GPUs this node has, NCCL on a
machine without GPUs. Introduced in chapter 19.
"""
from __future__ import annotations

import json
import os
import time

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def torchrun_env(environ=None) -> dict:
    """{RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE} as ints, from torchrun's environment; a
    RuntimeError saying how to launch when they are missing."""
    environ = os.environ if environ is None else environ
    missing = [k for k in ENV if k not in environ]
    if missing:
        raise RuntimeError(f"pipelib train: {', '.join(missing)} not set: run me under torchrun, e.g. "
                           f"torchrun --standalone --nproc-per-node 2 -m pipelib train --plan plan.json")
    return {k: int(environ[k]) for k in ENV}


def choose_device(device: str, env: dict, cuda_count: int) -> str:
    """"cuda" or "cpu" for this rank: `device` ("auto", "cpu" or "cuda") checked against the GPUs
    this node has (`cuda_count`) and the ranks torchrun starts on it."""
    from pipelib.runtime.args import real_device_kind

    device = real_device_kind(device, cuda_count, "pipelib train")
    if device == "cuda" and env["LOCAL_WORLD_SIZE"] > cuda_count:
        raise ValueError(f"pipelib train: {env['LOCAL_WORLD_SIZE']} ranks on this node but {cuda_count} GPU(s): NCCL "
                         f"needs one GPU per rank; use --nproc-per-node {cuda_count} or --device cpu")
    return device


def check_torchrun_world(plan, recipe, env: dict) -> None:
    """The plan against torchrun's world and the recipe: before any process group."""
    size = plan.topology().world_size
    if size != env["WORLD_SIZE"]:
        raise ValueError(f"pipelib train: the plan {plan} needs {size} ranks but torchrun started "
                         f"{env['WORLD_SIZE']}; use --nproc-per-node x --nnodes = {size} or change the plan's degrees")
    plan.check(recipe, env["WORLD_SIZE"])


def preflight(recipe, plan, device: str = "auto", environ=None) -> tuple[dict, str]:
    """Every check before any process group: (torchrun's environment, "cuda" or "cpu")."""
    import torch

    env = torchrun_env(environ)
    device = choose_device(device, env, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    check_torchrun_world(plan, recipe, env)
    return env, device


def _attempt_store(env: dict):
    """torchrun's store under a prefix of this attempt: after a restart (--max-restarts) the
    workers make their groups again, and a key left by the failed attempt must not be read."""
    import datetime

    import torch.distributed as dist
    from torch.distributed.rendezvous import _create_c10d_store

    store = _create_c10d_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), env["RANK"],
                               env["WORLD_SIZE"], datetime.timedelta(minutes=5))
    return dist.PrefixStore(f"pipelib/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def train_from_env(recipe, plan, *, device: str = "auto", check: bool = False, out: str | None = None,
                   checkpoint: str | None = None, save_every: int = 1, crash_after: int | None = None,
                   environ=None) -> int:
    """One rank of a torchrun job: train `recipe` under `plan`; rank 0 reports. The exit code.

    With `checkpoint` (a directory every node can reach), the run saves every `save_every` steps
    and, started again (torchrun --max-restarts restarts every worker after a failure), goes on
    from the last committed step (`pipelib.checkpoint.resume.train_resumable`). `crash_after=k`
    makes the first attempt fail after step k (torchrun's TORCHELASTIC_RESTART_COUNT is 0), to
    see a restart resume."""
    import torch
    import torch.distributed as dist

    from pipelib.runtime.device import Device, DeviceSpec, current, set_current
    from pipelib.trainer import train_plan

    env, device = preflight(recipe, plan, device, environ)
    if device == "cuda":
        torch.cuda.set_device(env["LOCAL_RANK"])
    # NCCL told its GPU (device_id): it need not guess one from the rank, a guess that hangs
    # where ranks and GPUs are mapped otherwise (torch warns so on every barrier)
    gpu = {"device_id": torch.device("cuda", env["LOCAL_RANK"])} if device == "cuda" else {}
    dist.init_process_group("nccl" if device == "cuda" else "gloo", store=_attempt_store(env),
                            rank=env["RANK"], world_size=env["WORLD_SIZE"], **gpu)
    try:
        set_current(Device(env["RANK"], env["WORLD_SIZE"], DeviceSpec(device)))
        t0 = time.perf_counter()
        if checkpoint is None:
            result = train_plan(recipe, plan)
        else:
            result = _resumable(recipe, plan, checkpoint, save_every, crash_after)
        seconds = time.perf_counter() - t0
        mine = {"rank": env["RANK"], "losses": list(result.losses), "times": list(result.times),
                "bytes_sent": list(result.bytes_sent), "peak_bytes": result.peak_bytes, "seconds": seconds}
        everyone = [None] * env["WORLD_SIZE"]
        dist.all_gather_object(everyone, mine)
        results = [None] * env["WORLD_SIZE"] if check else None
        if check:  # every rank's gradients and parameters (a pipeline rank holds its stages' only)
            dist.gather_object(result, results if env["RANK"] == 0 else None, dst=0)
        code = 0
        if env["RANK"] == 0:
            code = _report(recipe, plan, results, everyone, out, device=current().torch_device)
        codes = [None] * env["WORLD_SIZE"]
        dist.all_gather_object(codes, code)
        return max(codes)
    finally:
        dist.destroy_process_group()
        set_current(None)


def _resumable(recipe, plan, root: str, save_every: int, crash_after: int | None):
    """`train_resumable` as a StepResult: the steps this attempt ran (`stats["start"]` is its
    first), the final parameters whole."""
    from pipelib.checkpoint.resume import train_resumable
    from pipelib.results import StepResult

    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    out = train_resumable(recipe, plan, root, save_every=save_every,
                          crash_after=crash_after if first_attempt else None)
    if out is None:
        return StepResult()
    import torch.distributed as dist

    first = dist.get_rank() == 0  # every rank holds the global losses: one reports them
    return StepResult(loss=out.losses[-1] if out.losses and first else None, losses=out.losses if first else (),
                      params=out.params, stats={"start": out.start, "saved": out.saved})


def _report(recipe, plan, results, everyone, out: str | None, device=None) -> int:
    """Rank 0: print and write what every rank measured; with every rank's `results`, the check
    against one process (on rank 0's `device`: a GPU run against one process on the same GPU)."""
    from pipelib.results import check_against_reference

    losses = next((r["losses"] for r in everyone if r["losses"]), [])
    steps = min(len(r["times"]) for r in everyone)  # a resumed run is checked, not timed: none
    report = {"plan": plan.to_dict(), "recipe": recipe.to_dict(), "world_size": len(everyone), "losses": losses,
              "step_seconds": [max(r["times"][s] for r in everyone) for s in range(steps)],
              "bytes_sent": {r["rank"]: r["bytes_sent"] for r in everyone},
              "peak_bytes": {r["rank"]: r["peak_bytes"] for r in everyone},
              "seconds": max(r["seconds"] for r in everyone)}
    print(f"{plan} on {len(everyone)} ranks: losses {', '.join(f'{x:.4f}' for x in losses)}", flush=True)
    code = 0
    if results is not None:
        ref, start = recipe.reference(device), results[0].stats.get("start")
        if start is not None:  # resumed at `start`: its steps' losses and the final parameters
            report["resumed_at"] = start
            print(f"resumed from the checkpoint of step {start}", flush=True)
            ref = ref.__class__(losses=ref.losses[start:], params=ref.params)
        try:
            agreed = check_against_reference(results, ref, shared=True)
            report["check"] = str(agreed)
            print(f"equal to one process: {agreed}", flush=True)
        except AssertionError as e:
            report["check"] = f"DIFFERS: {str(e).splitlines()[0]}"
            print(f"differs from one process: {e}", flush=True)
            code = 1
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return code


def load_plan_and_recipe(plan_path: str | None, recipe_path: str | None, overrides: dict):
    """(Recipe, Plan) from JSON files (defaults when None), with `overrides` (flag name: value,
    None for unset) applied to whichever of the two has the field."""
    import dataclasses

    from pipelib.plan import PLAN_FLAGS, Plan
    from pipelib.recipe import Recipe

    def read(path):
        if path is None:
            return {}
        with open(path) as f:
            return json.load(f)

    plan, recipe = Plan.from_dict(read(plan_path)), Recipe.from_dict(read(recipe_path))
    recipe_fields = {f.name for f in dataclasses.fields(Recipe)}
    for k, v in overrides.items():
        if v is None:
            continue
        if k in PLAN_FLAGS:
            plan = plan.replace(**{k: v})
        elif k in recipe_fields:
            recipe = dataclasses.replace(recipe, **{k: v})
        else:
            raise ValueError(f"pipelib train: --{k.replace('_', '-')} is neither a Plan nor a Recipe field")
    return recipe, plan
