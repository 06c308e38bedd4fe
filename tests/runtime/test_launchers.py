"""Launchers as a registry (`pipelib.runtime.launchers`): bad input before any process starts,
the launcher's ranks as the cluster's, and the SLURM batch script ipyparallel writes, checked."""
import os
import shlex
import sys

import psutil
import pytest
from leftovers import cluster_processes

from pipelib.runtime.cluster import Cluster, engine_config
from pipelib.runtime.launchers import LAUNCHERS, Launcher, launcher_info, order_by_launcher_rank


def _no_process_started(make):
    before, children = set(cluster_processes()), {p.pid for p in psutil.Process().children(recursive=True)}
    make()
    assert set(cluster_processes()) <= before
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children


def test_every_launcher_is_an_ipyparallel_engine_launcher():
    from ipyparallel.cluster.launcher import find_launcher_class

    names = {name: find_launcher_class(info.engines, "engine").__name__ for name, info in LAUNCHERS.items()}
    assert names == {"local": "LocalEngineSetLauncher", "mpi": "MPIEngineSetLauncher",
                     "slurm": "SlurmEngineSetLauncher"}
    assert all(info.name == name for name, info in LAUNCHERS.items())


@pytest.mark.parametrize("bad", ["mpirun", "Local", "", None, 3])
def test_an_unknown_launcher_names_the_known_ones_before_any_process(bad):
    def make():
        with pytest.raises(ValueError, match=r"launcher=.* not one pipelib knows; pass one of 'local', 'mpi', 'slurm'"):
            Cluster(2, launcher=bad)
    _no_process_started(make)


@pytest.mark.parametrize("name, program, package", [("mpi", "mpiexec", "openmpi-bin"),
                                                    ("slurm", "sbatch", "slurm-wlm")])
def test_a_missing_program_names_the_package_before_any_process(monkeypatch, tmp_path, name, program, package):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no mpiexec, no sbatch (nor beside this Python)
    assert LAUNCHERS[name].missing()[0] == program

    def make():
        with pytest.raises(RuntimeError, match=rf"launcher='{name}'\) needs '{program}'.*To install: .*{package}"):
            Cluster(2, launcher=name)
    _no_process_started(make)


def test_a_missing_python_module_is_named_too():
    fake = Launcher("mpi", engines="mpi", modules=("no_such_module_for_engines",), install="pip install it")
    with pytest.raises(RuntimeError, match="needs 'no_such_module_for_engines'.*To install: pip install it"):
        fake.check()
    assert launcher_info("local").check().missing() == []


def test_ranks_come_from_the_launcher_and_must_be_each_rank_once():
    mpi = LAUNCHERS["mpi"]
    assert order_by_launcher_rank({0: 1, 1: 0, 2: 2}, 3, mpi) == [1, 0, 2]   # engine 1 is MPI rank 0
    with pytest.raises(RuntimeError, match=r"OMPI_COMM_WORLD_RANK/PMI_RANK are \{0: 0, 1: 0\}.*0\.\.1 once"):
        order_by_launcher_rank({0: 0, 1: 0}, 2, mpi)
    with pytest.raises(RuntimeError, match=r"SLURM_PROCID are \{0: 0, 1: None\}"):
        order_by_launcher_rank({0: 0, 1: None}, 2, LAUNCHERS["slurm"])


def test_engines_find_their_launchers_rank(monkeypatch):
    from pipelib.runtime.launchers import launcher_rank

    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    monkeypatch.setenv("PMI_RANK", "3")
    assert launcher_rank(LAUNCHERS["mpi"].rank_variables) == 3
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert launcher_rank(LAUNCHERS["mpi"].rank_variables) == 1
    assert launcher_rank(()) is None


def test_the_slurm_batch_script(tmp_path):
    """What `Cluster(4, launcher="slurm")` submits: ipyparallel's script, for this cluster."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    profile = tmp_path / "profile"
    cfg = engine_config(LAUNCHERS["slurm"], "pipelib-cluster-test", str(tmp_path))
    launcher = SlurmEngineSetLauncher(work_dir=".", config=cfg, profile_dir=str(profile), cluster_id="c1")
    launcher.write_batch_script(4)
    assert launcher.batch_file == str(tmp_path / "slurm_engine.sbatch")   # in the run directory, not the cwd
    script = open(launcher.batch_file).read()
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert {"#SBATCH --ntasks=4", "#SBATCH --export=ALL", "#SBATCH --job-name=ipengine-c1",
            f"#SBATCH --output={profile}/log/{launcher.identifier}.log"} <= set(lines)
    srun = shlex.split(next(line for line in lines if line.startswith("srun ")))
    assert srun[1:4] == [sys.executable, "-m", "ipyparallel.engine"]       # this venv's Python, one task per rank
    assert {"--IPEngine.enable_nanny=False",
            "--IPEngine.startup_command=import torch, torch.distributed, pipelib.runtime.engine"} <= set(srun)
    env = launcher.get_env()  # sbatch runs with it, and --export=ALL hands it to every task: the
    # engines find the controller's connection files through the profile and cluster id
    assert env["IPP_PROFILE_DIR"] == str(profile) and env["IPP_CLUSTER_ID"] == "c1"
    assert env["PIPELIB_CLUSTER_ID"] == "pipelib-cluster-test" and env["OMP_NUM_THREADS"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert os.access(launcher.batch_file, os.X_OK)


def test_mpi_engines_get_open_mpis_environment(tmp_path):
    cfg = engine_config(LAUNCHERS["mpi"], "t", str(tmp_path))
    env = cfg.MPIEngineSetLauncher.environment
    assert env["OMPI_MCA_btl"] == "self,vader" and env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["PIPELIB_CLUSTER_ID"] == "t" and "--IPEngine.enable_nanny=False" in cfg.MPIEngineSetLauncher.engine_args


def test_the_mpi4py_hint_is_the_projects_pin():
    import pathlib
    import tomllib

    pyproject = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    pin = next(p for p in pyproject["project"]["optional-dependencies"]["dev"] if p.startswith("mpi4py"))
    assert f"pip install {pin}" in LAUNCHERS["mpi"].install


def test_unavailable_says_why_from_the_launchers_probe():
    down = Launcher("x", engines="local", probe=("sh", "-c", "echo down; echo nodes drained >&2"),
                    ready_words=("idle",), start_hint="start it")
    assert down.unavailable() == "`sh -c echo down; echo nodes drained >&2` says 'down\\nnodes drained': start it"
    up = Launcher("x", engines="local", probe=("sh", "-c", "echo idle"), ready_words=("idle",))
    assert up.unavailable() is None and LAUNCHERS["local"].unavailable() is None


def test_batch_script_is_for_batch_launchers_only(tmp_path):
    slurm = LAUNCHERS["slurm"]
    script = slurm.batch_script(engine_config(slurm, "t", str(tmp_path)), 3, str(tmp_path))
    assert "#SBATCH --ntasks=3" in script and "\nsrun " in script
    with pytest.raises(ValueError, match=r"launcher 'mpi' submits no batch script \(batch launchers: 'slurm'\)"):
        LAUNCHERS["mpi"].batch_script(None, 2, str(tmp_path))
