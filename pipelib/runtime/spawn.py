"""Ranks without a launcher: `run_spawned(fn, world_size, ...)` does torchrun's job in a test or a
notebook cell.

`torch.multiprocessing.spawn` starts `world_size` fresh processes with RANK, LOCAL_RANK and
WORLD_SIZE set (plus `env`); they meet at a file in a private directory (`FileStore`, no TCP
port open on any interface) and make a gloo group, which is the default group when `fn` runs.
Each rank calls `fn(*args, **kwargs)` and writes its result; the parent loads them, one per
rank. A rank that raised raises here with its traceback; a rank that died (a signal, `os._exit`
before writing) raises with the tail of its log when `quiet`; a run longer than `timeout`
seconds is killed and raises TimeoutError. No pipelib `Cluster`, no engine: the strategy cores
run under plain torch.distributed, as they would under torchrun.

Used by chapter 08's DeepSpeed twin (`data_parallel.deepspeed_twin`), chapter 19's DeepSpeed
pipeline (`pipeline.deepspeed_pipe`) and Hugging Face checks (`hf.spawned`).
"""
from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
import traceback


def _quiet(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _rank_main(rank, world_size, path, fn, args, kwargs, options):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **options["env"])
    if options["quiet"]:
        _quiet(os.path.join(path, f"rank{rank}.log"))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(path, "store"), world_size), rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=options["group_timeout"]))
    try:
        try:
            out = {"result": fn(*args, **kwargs)}
        except Exception:
            out = {"error": traceback.format_exc()}
        torch.save(out, os.path.join(path, f"rank{rank}.pt"))
        dist.barrier()  # every rank saved before any leaves: a rank's exit cannot fail another's last collective
    finally:
        dist.destroy_process_group()
    if options["hard_exit"]:
        # Leave without the interpreter's teardown: a spawned DeepSpeed rank once died at exit with
        # "terminate called without an active exception" (SIGABRT: a C++ thread object destroyed while
        # running, in the teardown of DeepSpeed's and gloo's state) after its work was saved.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _logs(path: str, world_size: int) -> str:
    files = [os.path.join(path, f"rank{r}.log") for r in range(world_size)]
    return "\n".join(f"rank {r}'s log (end):\n{open(f).read()[-2000:]}" for r, f in enumerate(files)
                     if os.path.exists(f))


def run_spawned(fn, world_size: int = 2, args=(), kwargs=None, *, timeout: float = 300.0, env=None,
                quiet: bool = False, hard_exit: bool = False, group_timeout: float = 120.0,
                what: str | None = None) -> list:
    """`fn(*args, **kwargs)` on `world_size` spawned gloo ranks (the default group is theirs); one
    result per rank. `env`: more environment for every rank (set before `fn`'s imports);
    `quiet`: each rank's output goes to a log, shown only if a rank dies; `hard_exit`: ranks
    leave with `os._exit(0)` once their result is saved (libraries whose threads crash the
    interpreter's teardown); `what` names the run in errors (default: `fn`'s name)."""
    import torch
    import torch.multiprocessing as mp

    from pipelib.checks import check_int

    what = what or f"run_spawned({fn.__name__})"
    check_int(world_size, "world_size", minimum=1, context="run_spawned", hint="processes to spawn")
    options = {"env": dict(env or {}), "quiet": quiet, "hard_exit": hard_exit, "group_timeout": group_timeout}
    with tempfile.TemporaryDirectory(prefix="pipelib-spawn-") as path:  # 0700: the store is private
        ctx = mp.spawn(_rank_main, args=(world_size, path, fn, tuple(args), dict(kwargs or {}), options),
                       nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: {world_size} ranks still running after {timeout} s; raise "
                                       f"timeout= or look for a rank waiting on a peer")
        except mp.ProcessExitedException as e:
            raise RuntimeError(f"{what}: a spawned rank died ({e})\n{_logs(path, world_size)}") from None
        except mp.ProcessRaisedException as e:  # an error outside fn (the group's set-up)
            raise RuntimeError(f"{what}: a spawned rank failed:\n{e}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        outs = [torch.load(os.path.join(path, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
    errors = [f"rank {r}:\n{o['error']}" for r, o in enumerate(outs) if "error" in o]
    if errors:
        raise RuntimeError(f"{what} failed:\n" + "\n".join(errors))
    return [o["result"] for o in outs]
