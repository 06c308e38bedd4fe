"""The engine cluster: one ipyparallel engine per rank, torch.distributed on every engine.

    with Cluster(world_size=4) as cluster:          # 4 simulated GPUs, virtual clock
        cluster.run(lambda: dist.get_rank())         # -> [0, 1, 2, 3]

Design (DESIGN.md section 3):

- lean: a threaded controller and engines without nannies, a private profile directory per
  cluster (two clusters never see each other), everything bound to 127.0.0.1;
- one thread per engine (OMP/MKL/torch), so 4-8 engines share 2 cores sanely;
- `torch.distributed` initialised on every engine: gloo for ``sim`` and ``cpu``, NCCL for
  ``cuda`` (one GPU per rank);
- faults are errors, never hangs: `run` watches every rank's process and its activity beacon,
  and raises `RankDiedError`, `RankTimeoutError` or `RankError` naming the rank and what it
  was doing;
- no orphans: a watchdog in its own session kills the controller and engines when the kernel
  disappears, whatever killed it (SIGKILL included).

Introduced in chapter 04.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil

from pipelib.runtime.watchdog import TAG_VAR, kernel_alive, sweep
from pipelib.runtime.device import Activity, DeviceSpec
from pipelib.trace import Trace

MAX_WORLD_SIZE = 64
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
DEFAULT_TIMEOUT = 60.0


class ClusterError(RuntimeError):
    """Something went wrong on the cluster; the message names the ranks involved."""


class RankError(ClusterError):
    """Code raised an exception on one or more ranks."""

    def __init__(self, message: str, errors: dict):
        super().__init__(message)
        self.errors = errors  # rank -> ipyparallel RemoteError


class RankDiedError(ClusterError):
    """A rank's process died."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class RankTimeoutError(ClusterError, TimeoutError):
    """One or more ranks did not finish within the timeout."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def validate_args(world_size, device, profile, clock, timeout, track_memory=None) -> DeviceSpec:
    """Check the arguments before any process starts; ValueError names the bad value."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int, got {world_size!r} ({type(world_size).__name__})")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be between 1 and {MAX_WORLD_SIZE}, got {world_size}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    spec = DeviceSpec(device, profile, clock, track_memory)
    if device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world_size:
            raise ValueError(
                f"device='cuda' needs one GPU per rank: world_size={world_size} but this machine "
                f"has {have} GPU(s). Use world_size <= {have}, or device='sim' to simulate GPUs."
            )
    return spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ engine side
def _engine_init(rank, world_size, port, spec, epoch, activity_path, timeout, parent_pid, parent_ctime,
                 sys_path, cwd):
    """Runs on each engine: import path, device, parent watch, then torch.distributed."""
    import gc
    import threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from pipelib.runtime import device as devmod

    # Same import path and working directory as the notebook: functions defined in a module
    # beside it (or in a test module) are pickled by reference and must import on the engine.
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    os.chdir(cwd)
    torch.set_num_threads(1)
    dev = devmod.set_current(devmod.Device(rank, world_size, spec, epoch, activity_path))

    def watch_parent():  # second line of defence behind the watchdog
        while kernel_alive(parent_pid, parent_ctime):
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True, name="pipelib-parent-watch").start()
    backend = "nccl" if spec.kind == "cuda" else "gloo"
    with dev.activity.doing(f"init_process_group({backend})"):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout))
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
    from pipelib.runtime.device import current

    name = getattr(fn, "__qualname__", repr(fn))
    with current().activity.doing(f"running {name}"):
        return fn(*args, **kwargs)


def _take_events():
    from pipelib.runtime.device import current

    return current().tracer.take()


def _reset_device():
    from pipelib.runtime.device import current

    current().reset()


# ------------------------------------------------------------------ the cluster
class Cluster:
    """A live cluster of `world_size` engines, one per (simulated or real) GPU.

    Arguments are checked before any process starts. `timeout` bounds every `run` and every
    torch.distributed operation: a rank that does not finish in time becomes a
    `RankTimeoutError` naming it and what it was doing. `track_memory`: count saved
    activations on every rank (None: on simulated devices only; see `DeviceSpec`).
    """

    def __init__(self, world_size: int = 4, device: str = "sim", *, profile="toy-gpu",
                 clock: str = "virtual", timeout: float = DEFAULT_TIMEOUT, start: bool = True,
                 start_timeout: float = 120.0, track_memory: bool | None = None):
        self.spec = validate_args(world_size, device, profile, clock, timeout, track_memory)
        self.world_size, self.timeout, self.start_timeout = world_size, float(timeout), start_timeout
        self.client = self.view = self._ipp = self._watchdog = None
        self._rundir = None
        self._broken: str | None = None
        self.info: list[dict] = []
        self.startup_seconds: float | None = None
        if start:
            self.start()

    # ---------------------------------------------------------------- lifecycle
    def __repr__(self) -> str:
        state = "stopped" if self.client is None else ("broken" if self._broken else "running")
        return (f"Cluster(world_size={self.world_size}, device={self.spec.kind!r}, "
                f"profile={getattr(self.spec.profile, 'name', self.spec.profile)!r}, "
                f"clock={self.spec.clock!r}, {state})")

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.client is not None

    @property
    def pids(self) -> list[int]:
        return [i["pid"] for i in self.info]

    def start(self) -> "Cluster":
        if self.running:
            return self
        import ipyparallel as ipp
        from traitlets.config import Config

        t0 = time.perf_counter()
        self._rundir = tempfile.mkdtemp(prefix="pipelib-cluster-")
        self.tag = os.path.basename(self._rundir)
        self._start_watchdog()
        env = {TAG_VAR: self.tag, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
        cfg = Config()
        cfg.LocalEngineSetLauncher.engine_args = [
            "--IPEngine.enable_nanny=False",
            "--IPEngine.startup_command=import torch, torch.distributed, pipelib.runtime.device",
        ]
        cfg.LocalEngineSetLauncher.environment = env
        cfg.LocalControllerLauncher.environment = env
        self._ipp = ipp.Cluster(
            n=self.world_size, profile_dir=os.path.join(self._rundir, "profile"), delay=0,
            controller_args=["--usethreads", "--ip=127.0.0.1"], config=cfg,
            log_level=logging.ERROR, load_profile=False, shutdown_atexit=False,
        )
        try:
            self._ipp.start_cluster_sync()
            self.client = self._ipp.connect_client_sync()
            self.client.wait_for_engines(self.world_size, timeout=self.start_timeout, interactive=False)
            self._eids = sorted(self.client.ids)[: self.world_size]
            self.view = self.client[self._eids]
            self.view.block = True
            self._init_ranks()
        except BaseException:
            self.stop()
            raise
        _LIVE.add(self)
        self.startup_seconds = time.perf_counter() - t0
        self._activate_px()
        return self

    def _start_watchdog(self) -> None:
        me = psutil.Process()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "pipelib.runtime.watchdog", str(me.pid), repr(me.create_time()),
             self.tag, self._rundir],
            start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _init_ranks(self) -> None:
        port, epoch = _free_port(), time.time()
        me = psutil.Process()
        ars = [
            self.client[eid].apply_async(
                _engine_init, rank, self.world_size, port, self.spec, epoch,
                self._activity_path(rank), self.timeout, me.pid, me.create_time(),
                [os.path.abspath(p or ".") for p in sys.path], os.getcwd())
            for rank, eid in enumerate(self._eids)
        ]
        self.info = []  # pids unknown until init returns: ipyparallel reports deaths meanwhile
        self.info = self._gather(ars, "init_process_group", self.start_timeout)
        for rank, eid in enumerate(self._eids):
            self.client[eid].push({"rank": rank, "world_size": self.world_size}, block=True)
        self.view.execute("import torch, torch.distributed as dist, pipelib; "
                          "from pipelib.runtime.device import current as _pipelib_current; "
                          "device = _pipelib_current()", block=True)

    def _activate_px(self) -> None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover
            return
        if get_ipython() is not None:
            self.view.activate()  # %%px, %px, %autopx on every rank

    def stop(self) -> None:
        """Stop every process of the cluster (idempotent)."""
        _LIVE.discard(self)
        if self._rundir and os.path.isdir(self._rundir):
            open(os.path.join(self._rundir, "stopped"), "w").close()
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        if getattr(self, "tag", None):
            sweep(self.tag, grace=2.0)  # SIGTERM, then SIGKILL: faster than a polite shutdown
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
        if self._rundir:
            shutil.rmtree(self._rundir, ignore_errors=True)
        self.client = self.view = self._ipp = self._watchdog = None
        self._rundir, self._broken, self.info = None, None, []

    def restart(self) -> "Cluster":
        """Stop and start afresh (after a rank died or hung)."""
        self.stop()
        return self.start()

    # ---------------------------------------------------------------- running code
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Call fn(*args, **kwargs) on every rank at once; return one result per rank."""
        self._check_usable()
        name = getattr(fn, "__qualname__", repr(fn))
        ars = [self.client[eid].apply_async(_run_on_rank, fn, args, kwargs) for eid in self._eids]
        return self._gather(ars, name, self.timeout if timeout is None else timeout)

    def run_on(self, ranks, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Call fn on some ranks only; one result per listed rank."""
        self._check_usable()
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"ranks {bad} are outside 0..{self.world_size - 1}")
        ars = [self.client[self._eids[r]].apply_async(_run_on_rank, fn, args, kwargs) for r in ranks]
        name = getattr(fn, "__qualname__", repr(fn))
        return self._gather(ars, name, self.timeout if timeout is None else timeout, ranks=ranks)

    def trace(self) -> Trace:
        """Gather (and clear) every rank's recorded events into one table."""
        events = self.run(_take_events)
        return Trace([e for evs in events for e in evs], self.world_size)

    def reset(self) -> None:
        """Clocks to zero and empty traces on every rank, before a measurement."""
        self.run(_reset_device)

    # ---------------------------------------------------------------- faults
    def _activity_path(self, rank: int) -> str:
        return os.path.join(self._rundir, f"activity-rank{rank}")

    def activities(self) -> dict[int, str]:
        """What each rank says it is doing, and for how long."""
        out = {}
        for r in range(self.world_size):
            age, text = Activity.read(self._activity_path(r)) if self._rundir else (None, "unknown")
            out[r] = text if age is None else f"{text} (for {age:.1f} s)"
        return out

    def _alive(self, rank: int) -> bool:
        pid = self.info[rank]["pid"] if rank < len(self.info) and self.info[rank] else None
        if pid is None:
            return True  # not known yet (during init): ipyparallel reports engine deaths
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _check_usable(self) -> None:
        if not self.running:
            raise ClusterError("the cluster is stopped; call cluster.start() or cluster.restart()")
        if self._broken:
            raise ClusterError(f"the cluster is unusable after: {self._broken}\nCall cluster.restart().")

    def _interrupt(self, ranks) -> None:
        for r in ranks:
            try:
                os.kill(self.info[r]["pid"], signal.SIGINT)
            except (OSError, TypeError, IndexError, KeyError):
                pass

    def _gather(self, ars, name, timeout, ranks=None, grace=2.0):
        """Wait for one AsyncResult per rank, turning deaths, errors and stalls into errors."""
        from ipyparallel.error import EngineError, RemoteError

        ranks = list(range(self.world_size)) if ranks is None else ranks
        results, errors, pending = {}, {}, dict(zip(ranks, ars))
        deadline, first_error = time.monotonic() + timeout, None
        while pending:
            for r, ar in list(pending.items()):
                if ar.ready():
                    del pending[r]
                    try:
                        results[r] = ar.get()
                    except EngineError:
                        errors[r] = "died"
                    except RemoteError as e:
                        errors[r] = e
            dead = [r for r in ranks if (errors.get(r) == "died") or (r in pending and not self._alive(r))]
            if dead:
                acts = self.activities()
                self._broken = f"rank(s) {dead} died while running {name}"
                lines = [f"rank {r} died while running {name}; it was doing: {acts[r]}" for r in dead]
                lines += [f"rank {r} then failed: {_short(e)}" for r, e in errors.items() if e != "died"]
                raise RankDiedError("\n".join(lines) + "\nCall cluster.restart() to continue.", dead)
            now = time.monotonic()
            if errors and first_error is None:
                first_error = now
            stalled = first_error is not None and now - first_error > grace
            if pending and (stalled or now > deadline):
                self._fail_pending(pending, name, timeout, errors)
            if pending:
                self.client.wait(list(pending.values()), timeout=0.05)
        if errors:
            raise RankError(_describe_errors(errors, name), errors)
        return [results[r] for r in ranks]

    def _fail_pending(self, pending, name, timeout, errors):
        acts = self.activities()
        stuck = sorted(pending)
        self._interrupt(stuck)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(not ar.ready() for ar in pending.values()):
            self.client.wait(list(pending.values()), timeout=0.1)
        if any(not ar.ready() for ar in pending.values()):
            self._broken = f"rank(s) {stuck} stuck in {name}"
        why = "after other ranks failed" if errors else f"within {timeout:g} s"
        lines = [f"rank {r} did not finish {name} {why}; it was doing: {acts[r]}" for r in stuck]
        lines += [f"rank {r} failed: {_short(e)}" for r, e in sorted(errors.items())]
        hint = ("A rank waiting for a peer that never sends is a deadlock or a dead peer; "
                "raise timeout= if the work is just slow.")
        if self._broken:
            hint += " Call cluster.restart() to continue."
        raise RankTimeoutError("\n".join(lines) + "\n" + hint, stuck)


def _short(err) -> str:
    if err == "died":
        return "died"
    return f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}"


def _describe_errors(errors: dict, name: str) -> str:
    lines = []
    for r, e in sorted(errors.items()):
        lines.append(f"rank {r} raised {_short(e)} in {name}")
    first = errors[min(errors)]
    tb = getattr(first, "traceback", None)
    if tb:
        tb = _ANSI.sub("", tb)
        marker = "return fn(*args, **kwargs)\n"
        if marker in tb:  # drop ipyparallel's and pipelib's own frames
            tb = tb.split(marker, 1)[1]
        lines.append(f"--- traceback on rank {min(errors)} ---\n{tb.strip()}")
    return "\n".join(lines)


# Every running cluster of this process, held strongly so that one whose variable was
# overwritten is still stopped on a normal interpreter exit. Killed kernels are the watchdog's job.
_LIVE: "set[Cluster]" = set()


@atexit.register
def _stop_all() -> None:
    for c in list(_LIVE):
        c.stop()
