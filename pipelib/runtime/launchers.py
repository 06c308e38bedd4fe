"""How a cluster's engines start: one entry per launcher, the only place a launcher's name is read.

    Cluster(4)                              # launcher="local": ipyparallel starts 4 engines here
    Cluster(2, launcher="mpi")              # `mpiexec -n 2 ipengine --mpi ...` (Open MPI, mpi4py)
    Cluster(2, launcher="slurm")            # an sbatch script whose `srun` starts the engines

A `Launcher` holds what its name decides: ipyparallel's engine launcher (``engines=`` of
`ipyparallel.Cluster`: ``local``, ``mpi``, ``slurm``), the program it needs on PATH and the
Python modules it needs, with the Debian package or pip pin that provides them, the environment
its engines start with, and where each engine finds the rank its launcher gave it. `check()`
runs before any process starts: an unknown launcher is a ValueError naming the known ones, a
missing `mpiexec` or `sbatch` a RuntimeError naming what to install.

Ranks. ipyparallel numbers engines in the order they register; under mpiexec an engine asks for
its MPI rank as its id (``--mpi``), and under srun each task has ``SLURM_PROCID``. A launcher
with ``rank_variables`` makes `Cluster` read them on every engine and give torch.distributed the
same rank (`order_by_launcher_rank`): rank r of the notebook is rank r of ``mpiexec``/``srun``.

Meeting. The local launcher's ranks meet at a file in the cluster's private directory
(`pipelib.runtime.rendezvous`). mpiexec and srun may put engines on other hosts, which do not
see that file: their ranks meet at a TCP store served by the notebook's process on the
controller's address, the one address every engine already reaches (``tcp_store``).

This machine's MPI runs on loopback only (``OMPI_MCA_btl=self,vader``, the out-of-band channel on
``lo``), as root when CI is root, and oversubscribed (4 engines on 2 cores). On several hosts,
drop those and give mpiexec a host file (`mpi_args`): the design above is unchanged.

Introduced in chapter 19.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_NONE: Mapping[str, str] = MappingProxyType({})

# Debian's Open MPI (4.1), on loopback, as root if need be (FACTS.md)
OPEN_MPI_ENV = MappingProxyType({
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",    # CI runs as root
    "OMPI_MCA_btl": "self,vader", "OMPI_MCA_oob_tcp_if_include": "lo",      # this machine only
    "OMPI_MCA_rmaps_base_oversubscribe": "1",                               # more engines than cores
    "OMPI_MCA_hwloc_base_binding_policy": "none",                           # one thread each, unpinned
})


@dataclass(frozen=True)
class Launcher:
    """What pipelib knows about one way of starting engines (module docstring)."""

    name: str
    engines: str                      # ipyparallel's engine launcher: Cluster(engines=...)
    program: str | None = None        # must be on PATH (beside this Python, or on PATH)
    modules: tuple[str, ...] = ()     # must import in this Python
    install: str = ""                 # how to get what is missing, on Debian/Ubuntu
    environment: Mapping[str, str] = field(default_factory=lambda: _NONE)
    rank_variables: tuple[str, ...] = ()   # where an engine finds its launcher's rank
    tcp_store: bool = False           # ranks meet at a TCP store (they may be on other hosts)
    batch: bool = False               # the engines are a batch job: cancel it on stop
    mpi_args: tuple[str, ...] = ()    # extra mpiexec arguments
    probe: tuple[str, ...] = ()       # a command whose output says whether engines can start now
    ready_words: tuple[str, ...] = () # ... when it prints one of these
    start_hint: str = ""              # what to do when the probe says no
    says: str = ""                    # what a cluster's start-up line adds about it

    def which(self) -> str | None:
        """Where the launcher's program is (None: missing, or no program needed)."""
        if self.program is None:
            return None
        return shutil.which(self.program) or shutil.which(self.program, path=os.path.dirname(sys.executable))

    def missing(self) -> list[str]:
        """What this machine lacks for this launcher: the program, then the modules."""
        lack = [self.program] if self.program and self.which() is None else []
        return lack + [m for m in self.modules if importlib.util.find_spec(m) is None]

    def check(self) -> Launcher:
        """Self if everything is there; else a RuntimeError naming what is missing and how to
        install it (before any process starts)."""
        lack = self.missing()
        if lack:
            raise RuntimeError(f"Cluster(launcher={self.name!r}) needs {' and '.join(map(repr, lack))}, "
                               f"not found on this machine. To install: {self.install}")
        return self

    def unavailable(self) -> str | None:
        """Why engines cannot start under this launcher now (None: they can): what is missing and
        how to install it, or what the probe printed (a SLURM with no idle node) and what to do."""
        import subprocess

        lack = self.missing()
        if lack:
            return f"{' and '.join(lack)} not found on this machine. To install: {self.install}"
        if not self.probe:
            return None
        try:
            out = subprocess.run(self.probe, capture_output=True, text=True, timeout=30)
            said = (out.stdout + out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            said = str(e)
        if any(word in said for word in self.ready_words):
            return None
        return f"`{' '.join(self.probe)}` says {said or 'nothing'!r}: {self.start_hint}"

    def config(self, environment: Mapping[str, str], engine_args: list[str], workdir: str):
        """ipyparallel's traitlets `Config` for this launcher's engines and the local controller:
        the engines' environment and command-line flags (``engine_args=`` of `ipyparallel.Cluster`
        is ignored: the launcher class's section is what it reads); a batch script is written in
        `workdir` (ipyparallel writes it in the current directory otherwise)."""
        from ipyparallel.cluster.launcher import find_launcher_class
        from traitlets.config import Config

        cfg = Config()
        env = {**environment, **self.environment}
        cls = find_launcher_class(self.engines, "engine")
        section = cfg[cls.__name__]
        section.engine_args = list(engine_args)
        section.environment = env
        if self.batch:
            section.batch_file_name = os.path.join(workdir, cls.batch_file_name.default_value)
        if self.mpi_args:
            section.mpi_args = list(self.mpi_args)
        cfg.LocalControllerLauncher.environment = env
        return cfg

    def batch_script(self, config, world_size: int, workdir: str) -> str:
        """The batch script ipyparallel submits for `world_size` engines under `config` (from
        `pipelib.runtime.cluster.engine_config`), written in `workdir` and returned; nothing is
        submitted. Only for a batch launcher (slurm)."""
        from ipyparallel.cluster.launcher import find_launcher_class

        if not self.batch:
            raise ValueError(f"launcher {self.name!r} submits no batch script (batch launchers: {self._batch_names()})")
        launcher = find_launcher_class(self.engines, "engine")(
            work_dir=workdir, config=config, profile_dir=os.path.join(workdir, "profile"), cluster_id="pipelib")
        launcher.write_batch_script(world_size)
        with open(launcher.batch_file) as f:
            return f.read()

    @staticmethod
    def _batch_names() -> str:
        return ", ".join(repr(n) for n, info in LAUNCHERS.items() if info.batch)


LAUNCHERS: Mapping[str, Launcher] = MappingProxyType({
    "local": Launcher("local", engines="local"),
    "mpi": Launcher(
        "mpi", engines="mpi", program="mpiexec", modules=("mpi4py",),
        install="apt-get install openmpi-bin libopenmpi-dev, then pip install mpi4py==4.1.2 (in the venv)",
        environment=OPEN_MPI_ENV, rank_variables=("OMPI_COMM_WORLD_RANK", "PMI_RANK"), tcp_store=True,
        says=", started by mpiexec"),
    "slurm": Launcher(
        "slurm", engines="slurm", program="sbatch",
        install="apt-get install slurm-wlm munge (one machine: tools/slurm_localhost.sh start), or run "
                "on your cluster's login node",
        rank_variables=("SLURM_PROCID",), tcp_store=True, batch=True, says=", as a SLURM job (sbatch)",
        probe=("sinfo", "--noheader", "--format=%T"), ready_words=("idle", "mix"),
        start_hint="no SLURM node ready to take the engines; on this machine, as root: tools/slurm_localhost.sh start"),
})


def launcher_info(name) -> Launcher:
    """The `Launcher` called `name`; a ValueError naming the known ones otherwise."""
    if not isinstance(name, str) or name not in LAUNCHERS:
        raise ValueError(f"Cluster: launcher={name!r} is not one pipelib knows; pass one of "
                         f"{', '.join(map(repr, LAUNCHERS))}")
    return LAUNCHERS[name]


def launcher_rank(variables: tuple[str, ...]) -> int | None:
    """Runs on an engine: the rank its launcher gave it (the first of `variables` set), or None."""
    for var in variables:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def rank_report(variables: tuple[str, ...]) -> tuple:
    """Runs on an engine: (torch.distributed's rank, the launcher's rank, host, pid)."""
    import socket

    import torch.distributed as dist

    return dist.get_rank(), launcher_rank(variables), socket.gethostname(), os.getpid()


def order_by_launcher_rank(found: Mapping[int, int | None], world_size: int, launcher: Launcher) -> list[int]:
    """Engine ids in rank order, from {engine id: its launcher's rank}; a RuntimeError naming the
    engines when the launcher's ranks are not exactly 0..world_size-1."""
    ranks = sorted(r for r in found.values() if r is not None)
    if ranks != list(range(world_size)):
        raise RuntimeError(
            f"Cluster(launcher={launcher.name!r}): the engines' ranks from {'/'.join(launcher.rank_variables)} "
            f"are {dict(sorted(found.items()))} (engine id: rank); expected each of 0..{world_size - 1} once. "
            f"Are other engines registered on this cluster's controller?")
    by_rank = {r: eid for eid, r in found.items()}
    return [by_rank[r] for r in range(world_size)]
