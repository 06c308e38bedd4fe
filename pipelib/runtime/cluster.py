"""The engine cluster: one ipyparallel engine per rank, torch.distributed on every engine.

    with Cluster(world_size=4) as cluster:          # 4 simulated GPUs, virtual clock
        cluster.run(lambda: dist.get_rank())         # -> [0, 1, 2, 3]
    Cluster(2, launcher="mpi")                       # engines started by mpiexec (chapter 19)

Design (DESIGN.md section 3):

- engines started by a launcher (`pipelib.runtime.launchers`): ipyparallel's local one by
  default, or ``mpi`` (mpiexec) and ``slurm`` (an sbatch job), whose ranks are theirs;
- lean: a threaded controller and engines without nannies, a private profile directory per
  cluster (two clusters never see each other), a fast heartbeat, nothing beyond loopback (and
  torch.distributed meets at a file, no TCP store, unless mpiexec or srun started
  the engines: `pipelib.runtime.rendezvous`);
- one thread per engine (OMP/MKL/torch), so 4-8 engines share 2 cores sanely;
- `torch.distributed` initialised on every engine (`pipelib.runtime.engine`): gloo for ``sim``
  and ``cpu``, NCCL for ``cuda`` (one GPU per rank);
- faults are errors, never hangs: `run` watches every rank's process and its activity beacon,
  and raises `RankDiedError`, `RankTimeoutError` or `RankError` (`pipelib.runtime.errors`)
  naming the rank and what it was doing;
- no orphans: every running cluster is stopped on a normal interpreter exit
  (`Cluster.live`), and a watchdog in its own session kills the controller and engines when
  the kernel disappears, whatever killed it (SIGKILL included; `pipelib.runtime.watchdog`).

Introduced in chapter 04.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
import time

import psutil

from pipelib.runtime import engine, px, rendezvous, watchdog
from pipelib.runtime.launchers import launcher_info, launcher_rank, order_by_launcher_rank
from pipelib.runtime.args import DEFAULT_TIMEOUT, check_timeout, validate_args
from pipelib.runtime.beacon import Activity
from pipelib.runtime.errors import ClusterError
from pipelib.runtime.faults import unusable_message
from pipelib.runtime.progress import StartupProgress
from pipelib.runtime.registry import LiveClusters
from pipelib.trace import Trace

# An engine counts as registered at the controller's heartbeat after the one its heart first
# answered: ipyparallel's default beat (3000 ms) adds 3-6 s, in whole beats (engines up 0.2 s
# later can cost 3 s more). Every 250 ms costs an idle 4-engine cluster ~0.5% of one core
# (measured 0.9% -> 1.1-1.5%); the misses allowed grow so that a peer is given up on as late as
# before: 10 x 3 s = 30 s at the hub, 50 x (3 + 0.5) s = 175 s on an engine (checks every beat + 0.5 s).
HEARTBEAT_MS = 250
HUB_MISSES, ENGINE_MISSES = 30_000 // HEARTBEAT_MS, 175_000 // (HEARTBEAT_MS + 500)


def engine_config(launcher, tag: str, rundir: str):
    """ipyparallel's `Config` for a cluster's engines under `launcher` (a `Launcher`): the tag the
    watchdog finds them by, one thread each, sockets on loopback, no nanny, pipelib imported; a
    batch script in the cluster's run directory `rundir`."""
    env = {watchdog.TAG_VAR: tag, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", **rendezvous.LOOPBACK_ENV}
    return launcher.config(env, [
        "--IPEngine.enable_nanny=False", f"--IPEngine.max_heartbeat_misses={ENGINE_MISSES}",
        f"--IPEngine.startup_command=import torch, torch.distributed, {engine.__name__}"], rundir)


class Cluster:
    """A live cluster of `world_size` engines, one per (simulated or real) GPU.

    Arguments are checked before any process starts. `timeout` bounds every `run` and every
    torch.distributed operation: a rank that does not finish in time becomes a
    `RankTimeoutError` naming it and what it was doing. `track_memory`: count saved
    activations on every rank (None: on simulated devices only; see `DeviceSpec`). `launcher`:
    how the engines start, ``"local"``, ``"mpi"`` or ``"slurm"`` (`pipelib.runtime.launchers`);
    checked with the rest (a missing mpiexec or sbatch names the package to install).
    """

    live = LiveClusters()  # the running clusters of this process, stopped at exit

    def __init__(self, world_size: int = 4, device: str = "sim", *, profile="toy-gpu",
                 clock: str = "virtual", timeout: float = DEFAULT_TIMEOUT, start: bool = True,
                 start_timeout: float = 120.0, track_memory: bool | None = None,
                 progress: bool | None = None, launcher: str = "local"):
        self.spec = validate_args(world_size, device, profile, clock, timeout, track_memory)
        self.launcher = launcher_info(launcher).check()
        start_timeout = check_timeout(start_timeout, "start_timeout", minimum=1.0)
        self.world_size, self.timeout, self.start_timeout = world_size, float(timeout), start_timeout
        self.client = self.view = self._ipp = self._watchdog = self._rundir = self._store = None
        self._broken: str | None = None
        self.info: list[dict] = []
        self.startup_seconds: float | None = None
        self.startup_phases: dict[str, float] = {}  # seconds from the start to each phase's end
        self.progress = progress  # None: show start-up phases in a notebook only
        if start:
            self.start()

    # ---------------------------------------------------------------- lifecycle
    def __repr__(self) -> str:
        state = "stopped" if self.client is None else ("broken" if self._broken else "running")
        return (f"Cluster(world_size={self.world_size}, device={self.spec.kind!r}, "
                f"profile={getattr(self.spec.profile, 'name', self.spec.profile)!r}, "
                f"clock={self.spec.clock!r}, launcher={self.launcher.name!r}, {state})")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.client is not None

    @property
    def pids(self) -> list[int]:
        return [i["pid"] for i in self.info]

    @property
    def jobs(self) -> list[str]:
        """The batch jobs running the engines (launcher="slurm": one sbatch job id); else []."""
        engine_sets = self._ipp.engines.values() if self._ipp is not None and self.launcher.batch else ()
        return [e.job_id for e in engine_sets]

    def start(self) -> Cluster:
        if self.running:
            return self
        import ipyparallel as ipp

        t0, say = time.perf_counter(), StartupProgress(self.progress).say
        say(f"starting {self.world_size} engines ({self.spec.kind}, "
            f"{getattr(self.spec.profile, 'name', self.spec.profile)}, {self.spec.clock} clock){self.launcher.says}")
        self._rundir = tempfile.mkdtemp(prefix="pipelib-cluster-")
        self.tag = os.path.basename(self._rundir)
        self._watchdog = watchdog.launch(self.tag, self._rundir)
        cfg = engine_config(self.launcher, self.tag, self._rundir)
        self._ipp = ipp.Cluster(
            n=self.world_size, profile_dir=os.path.join(self._rundir, "profile"), delay=0,
            engines=self.launcher.engines, controller_ip="127.0.0.1",
            controller_args=["--usethreads", f"--HeartMonitor.period={HEARTBEAT_MS}",
                             f"--HeartMonitor.max_heartmonitor_misses={HUB_MISSES}"],
            config=cfg, log_level=logging.ERROR, load_profile=False, shutdown_atexit=False,
        )
        phases = self.startup_phases = {}
        try:
            self._ipp.start_cluster_sync()  # returns once the controller wrote its connection files
            phases["controller up, engines launched"] = time.perf_counter() - t0
            self.client = self._ipp.connect_client_sync()
            self.client.wait_for_engines(self.world_size, timeout=self.start_timeout, interactive=False)
            phases["engines registered (torch imported)"] = time.perf_counter() - t0
            self._eids = self._rank_order()
            self.view = self.client[self._eids]
            self.view.block = True
            say(f"{self.world_size} engines up; each imports torch and joins torch.distributed")
            self._init_ranks()
        except BaseException:
            self.stop()
            raise
        self.live.add(self)
        self.startup_seconds = phases["ranks ready"] = time.perf_counter() - t0
        say(f"ready: ranks 0..{self.world_size - 1} (%%px runs a cell on every rank)")
        self._activate_px()
        return self

    def _rank_order(self) -> list[int]:
        """Engine ids in rank order: registration order, or the launcher's ranks (mpiexec, srun)."""
        eids = sorted(self.client.ids)
        if not self.launcher.rank_variables:
            return eids[: self.world_size]
        ranks = self.client[eids].apply_sync(launcher_rank, self.launcher.rank_variables)
        return order_by_launcher_rank(dict(zip(eids, ranks, strict=True)), self.world_size, self.launcher)

    def _init_ranks(self) -> None:
        if self.launcher.tcp_store:  # engines may be on other hosts: meet at the controller's address
            self._store, meeting = rendezvous.serve_tcp_store(self._ipp.controller_ip, self.start_timeout)
        else:
            meeting = rendezvous.FileMeeting(rendezvous.store_path(self._rundir))
        epoch, me = time.time(), psutil.Process()
        ars = [
            self.client[eid].apply_async(
                engine._engine_init, rank, self.world_size, meeting, self.spec, epoch,
                self._activity_path(rank), self.timeout, me.pid, me.create_time(),
                [os.path.abspath(p or ".") for p in sys.path], os.getcwd(), self.launcher.rank_variables,
                socket.gethostname())
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
            px.install(self)  # an engine error in a %%px cell names its rank (pipelib.runtime.px)

    def stop(self) -> None:
        """Stop every process of the cluster (idempotent)."""
        self.live.discard(self)
        if self._rundir and os.path.isdir(self._rundir):
            open(os.path.join(self._rundir, "stopped"), "w").close()
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        if self.launcher.batch and self._ipp is not None:
            try:  # the engines' job (scancel): on other nodes, the sweep below cannot reach them
                self._ipp.stop_engines_sync()
            except Exception:
                pass
        if getattr(self, "tag", None):
            watchdog.sweep(self.tag, grace=2.0)  # SIGTERM, then SIGKILL: faster than a polite shutdown
        if self._watchdog is not None:
            watchdog.reap(self._watchdog)
        if self._rundir:
            shutil.rmtree(self._rundir, ignore_errors=True)
        self.client = self.view = self._ipp = self._watchdog = self._store = None  # the store's server closes
        self._rundir, self._broken, self.info = None, None, []

    def restart(self) -> Cluster:
        """Stop and start afresh (after a rank died or hung)."""
        self.stop()
        return self.start()

    # ---------------------------------------------------------------- running code
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Call fn(*args, **kwargs) on every rank at once; return one result per rank."""
        return self.run_on(range(self.world_size), fn, *args, timeout=timeout, **kwargs)

    def run_on(self, ranks, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Call fn on some ranks only; one result per listed rank."""
        self._check_usable()
        if timeout is not None:
            check_timeout(timeout, "run: timeout", minimum=0.0)
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"ranks {bad} are outside 0..{self.world_size - 1}")
        check = getattr(fn, "notebook_check", None)  # `pipelib.checks.checked_by`: in the notebook, first
        if check is not None:
            check(self.world_size, *args, **kwargs)
        ars = [self.client[self._eids[r]].apply_async(engine._run_on_rank, fn, args, kwargs) for r in ranks]
        name = getattr(fn, "__qualname__", repr(fn))
        return self._gather(ars, name, self.timeout if timeout is None else timeout, ranks=ranks)

    def trace(self) -> Trace:
        """Gather (and clear) every rank's recorded events into one table."""
        events = self.run(engine._take_events)
        return Trace([e for evs in events for e in evs], self.world_size)

    def reset(self) -> None:
        """Clocks to zero and empty traces on every rank, before a measurement."""
        self.run(engine._reset_device)

    def measured(self, fn, *args, timeout: float | None = None, **kwargs) -> tuple[list, Trace]:
        """`reset()`, `run(fn, ...)`, `trace()`: (one result per rank, every event of the run)."""
        self.reset()
        return self.run(fn, *args, timeout=timeout, **kwargs), self.trace()

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
            raise ClusterError(unusable_message(self._broken))

    def _gather(self, ars, name, timeout, ranks=None):
        """Wait for one AsyncResult per rank (`pipelib.runtime.gather`)."""
        from pipelib.runtime.gather import wait_for_ranks

        return wait_for_ranks(self, ars, name, timeout, ranks)
