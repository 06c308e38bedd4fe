"""What runs on the engines: each rank's start-up, and the wrappers `Cluster.run` sends.

An engine is a bare ipyparallel kernel; `Cluster.start` turns it into rank r of world_size:
same import path and working directory as the notebook, one thread (4-8 engines share 2 cores
sanely), its `Device` (`pipelib.runtime.device.current()`), a thread that exits if the kernel
disappears, then `torch.distributed` (gloo for ``sim`` and ``cpu``, NCCL for ``cuda``), meeting
at a file in the cluster's run directory (or, for engines that mpiexec or srun started, at a TCP
store on the controller's address), with its sockets on loopback (`pipelib.runtime.rendezvous`).
Under mpiexec or srun, its rank is the one its launcher gave it (`pipelib.runtime.launchers`).

These functions are pickled by reference, so they live in a module the engines import at start
(the cluster's `--IPEngine.startup_command` names this one). The notebook process imports it
too, but nothing here imports torch until it runs on an engine.

Introduced in chapter 04.
"""
from __future__ import annotations

import os
import socket
import sys
import time

from pipelib.runtime.device import Device, current, set_current
from pipelib.runtime.launchers import launcher_rank
from pipelib.runtime.place import to_cpu
from pipelib.runtime.watchdog import kernel_alive


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bench/cluster_startup.py's reference cluster meets at
    tcp://127.0.0.1:PORT; pipelib's own cluster opens no port for its rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_init(rank, world_size, meeting, spec, epoch, activity_path, timeout, parent_pid, parent_ctime,
                 sys_path, cwd, rank_variables=(), parent_host=None):
    """Runs on each engine: import path, device, parent watch, then torch.distributed.

    `meeting`: a `pipelib.runtime.rendezvous` FileMeeting or TcpMeeting. `rank_variables`: where
    the engine's launcher put its rank, which must be `rank` (a RuntimeError naming both if not).
    `parent_host`: the notebook's host; the engine watches the kernel's pid only on that host."""
    import gc
    import threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    given = launcher_rank(rank_variables)
    if rank_variables and given != rank:
        raise RuntimeError(f"engine {socket.gethostname()}:{os.getpid()} is rank {given} for its launcher "
                           f"({'/'.join(rank_variables)}) but the cluster made it rank {rank}")
    # Same import path and working directory as the notebook: functions defined in a module
    # beside it (or in a test module) are pickled by reference and must import on the engine.
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    os.chdir(cwd)
    torch.set_num_threads(1)
    dev = set_current(Device(rank, world_size, spec, epoch, activity_path))

    def watch_parent():  # second line of defence behind the watchdog
        while kernel_alive(parent_pid, parent_ctime):
            time.sleep(1.0)
        os._exit(1)

    if parent_host in (None, socket.gethostname()):  # a kernel on another host has no pid here: the
        # controller's heartbeat is what stops such an engine (ipyparallel's max_heartbeat_misses)
        threading.Thread(target=watch_parent, daemon=True, name="pipelib-parent-watch").start()
    backend = "nccl" if spec.kind == "cuda" else "gloo"
    # NCCL aborts the engine when an op outlives its timeout (TORCH_NCCL_ASYNC_ERROR_HANDLING's
    # default): give it twice the cluster's, so the cluster's own error, naming what each rank was
    # doing, comes first; and its GPU, so NCCL does not guess (the review's W7 and M1)
    nccl = {"device_id": dev.torch_device} if backend == "nccl" else {}
    with dev.activity.doing(f"init_process_group({backend})"):
        dist.init_process_group(backend, store=meeting.open(world_size, timeout), rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout * (2 if nccl else 1)), **nccl)
    # torch's import leaves ~200k objects for every full collection to scan again (10-17 ms,
    # measured, on one rank in the middle of a pipeline step, where the others wait for it):
    # move them out of the collector's sight, as long-running services do (gc.freeze)
    gc.collect()
    gc.freeze()
    if spec.kind == "sim":  # only simulated ops count FLOPs; real ones must not be disturbed
        threading.Thread(target=_warm_flop_counter, daemon=True, name="pipelib-warm").start()
    return {"pid": os.getpid(), "host": socket.gethostname(), "backend": backend,
            "threads": torch.get_num_threads(), "device": str(dev.torch_device)}


def _warm_flop_counter():
    """The first FlopCounterMode imports torch._dynamo and sympy (2-4 s of CPU): do it now.

    A simulated op without a given duration counts its FLOPs; the first one on a fresh engine
    would otherwise take seconds, enough to trip a short timeout. Only imports, in a thread
    while the engine waits: an op that needs them meanwhile waits on the import lock.
    """
    try:
        import torch._dynamo  # noqa: F401
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
    except Exception:  # pragma: no cover - a warm-up only
        pass


def _run_on_rank(fn, args, kwargs):
    """`Cluster.run`'s wrapper: the beacon says which function runs while it runs, and a rank
    on a GPU returns its result on the CPU (`to_cpu`: the notebook compares with CPU references
    and opens no CUDA context to unpickle it)."""
    name = getattr(fn, "__qualname__", repr(fn))
    dev = current()
    with dev.activity.doing(f"running {name}"):
        result = _call(fn, args, kwargs)
    return result if dev.torch_device.type == "cpu" else to_cpu(result)


def _call(fn, args, kwargs):
    """Its line is where `pipelib.runtime.errors` cuts a remote traceback: keep it one call."""
    return fn(*args, **kwargs)


def _take_events():
    return current().tracer.take()


def _reset_device():
    current().reset()
