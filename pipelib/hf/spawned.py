"""The Hugging Face Llama's parallel runs on spawned gloo ranks, checked against one process.

`run_spawned(fn, world_size, ...)` does a launcher's job the way chapter 08's DeepSpeed twin
does (`pipelib.data_parallel.deepspeed_twin`): `torch.multiprocessing.spawn` starts
`world_size` fresh processes, they meet at a file in a private directory (`FileStore`, no TCP
port open on any interface) and make a gloo group, each calls `fn(*args, **kwargs)` and writes
its result; the parent loads them, one per rank. No pipelib `Cluster`, no engine: the strategy
cores run under plain torch.distributed, as they would under torchrun.

`hf_checks(...)` runs the three strategies of `pipelib.hf.parallel` in one spawn (a spawn pays
seconds of imports: torch, then transformers) and checks each against `llama_reference`.

Introduced in chapter 19.
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass


def _rank_main(rank, world_size, path, fn, args, kwargs):
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(path, "store"), world_size), rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        try:
            out = {"result": fn(*args, **kwargs)}
        except Exception:
            out = {"error": traceback.format_exc()}
        torch.save(out, os.path.join(path, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_spawned(fn, world_size: int = 2, args=(), kwargs=None, *, timeout: float = 300.0) -> list:
    """`fn(*args, **kwargs)` on `world_size` spawned gloo ranks (the default group is theirs);
    one result per rank. A rank that raised raises here with its traceback; a run longer than
    `timeout` seconds is killed and raises TimeoutError."""
    import torch
    import torch.multiprocessing as mp

    from pipelib.checks import check_int

    check_int(world_size, "world_size", minimum=1, context="run_spawned", hint="processes to spawn")
    with tempfile.TemporaryDirectory(prefix="pipelib-hf-") as path:  # 0700: the store is private
        ctx = mp.spawn(_rank_main, args=(world_size, path, fn, tuple(args), dict(kwargs or {})),
                       nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"run_spawned({fn.__name__}): {world_size} ranks still running after "
                                   f"{timeout} s; raise timeout= or look for a rank waiting on a peer")
        outs = [torch.load(os.path.join(path, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
    errors = [f"rank {r}:\n{o['error']}" for r, o in enumerate(outs) if "error" in o]
    if errors:
        raise RuntimeError(f"run_spawned({fn.__name__}) failed:\n" + "\n".join(errors))
    return [o["result"] for o in outs]


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
