"""`python -m pipelib check` runs the same library under torchrun (the multi-node path)."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_torchrun_check_three_ranks():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--nproc-per-node", "3", "-m", "pipelib", "check", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    assert out.returncode == 0, out.stderr[-2000:]
    for r in range(3):
        assert f"rank {r}/3" in out.stdout and "ping and all_reduce ok" in out.stdout


def test_torchrun_check_two_ranks_under_nccls_matching_rules():
    """On 2 ranks each one's left neighbour is its right. Under NCCL's matching rules, kept on gloo
    (`pipelib.runtime.matching`), the ping is one batched exchange: a receive posted before the
    send to the same peer (odd ranks receiving first) is refused there as the hang it is on NCCL."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "pipelib", "check", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                              "PIPELIB_P2P_MATCHING": "nccl"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rank 0/2" in out.stdout and "rank 1/2" in out.stdout and out.stdout.count("ping and all_reduce ok") == 2


def test_check_takes_the_gpu_of_local_rank():
    from pipelib.runtime.device import gpu_of

    assert gpu_of({"RANK": "9", "LOCAL_RANK": "1"}, 8) == 1       # node 1's second rank: its GPU 1
    assert gpu_of({"RANK": "9"}, 8) == 1                          # no LOCAL_RANK: RANK modulo the GPUs
    with pytest.raises(ValueError, match="LOCAL_RANK=2 but this node has 2 GPU"):
        gpu_of({"RANK": "2", "LOCAL_RANK": "2"}, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with GPUs runs --device cuda")
def test_check_on_cuda_without_gpus_explains():
    out = subprocess.run([sys.executable, "-m", "pipelib", "check", "--device", "cuda"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    assert out.returncode == 2 and "without CUDA GPUs; use --device cpu" in out.stderr, out.stderr[-2000:]


def test_check_outside_torchrun_explains():
    out = subprocess.run([sys.executable, "-m", "pipelib", "check"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert out.returncode == 2 and "torchrun" in out.stderr


def test_doctor_says_what_this_machine_runs_and_names_the_ranks():
    out = subprocess.run([sys.executable, "-m", "pipelib", "doctor"], capture_output=True, text=True,
                         timeout=180, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {line.split(":")[0]: line for line in out.stdout.splitlines()}
    assert {"CUDA GPUs", "NCCL", "torchrun", "MPI", "SLURM"} <= set(lines)
    assert os.path.dirname(sys.executable) in lines["torchrun"]           # found beside this Python
    assert "rank 0 on" in out.stdout and "rank 1 on" in out.stdout        # the engines' own ranks
    for tool in ("MPI", "SLURM"):
        assert "not found" not in lines[tool] or "to install:" in lines[tool]


def test_train_outside_torchrun_explains():
    out = subprocess.run([sys.executable, "-m", "pipelib", "train", "--dp", "2"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert out.returncode == 2 and "run me under torchrun" in out.stderr and "Traceback" not in out.stderr


def test_doctor_names_debians_packages_for_what_is_missing(monkeypatch, tmp_path):
    from pipelib.__main__ import tool_lines

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: only what sits beside this Python
    lines = {line.split(":")[0]: line for line in tool_lines()}
    assert "not found: mpiexec" in lines["MPI"] and "apt-get install openmpi-bin libopenmpi-dev" in lines["MPI"]
    assert "pip install mpi4py==4.1.2" in lines["MPI"]
    assert "not found: sbatch" in lines["SLURM"] and "apt-get install slurm-wlm munge" in lines["SLURM"]
    assert os.path.dirname(sys.executable) in lines["torchrun"]


def _make_env() -> dict:
    """This environment without a parent make's variables: under `make test` (CI) a child make
    would otherwise print "make[1]: Entering directory ..." and inherit the parent's flags."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def _make(*args):
    return subprocess.run(["make", "-n", *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=_make_env())


def test_make_installs_torch_from_the_index_asked_for(tmp_path):
    venv = f"VENV={tmp_path}/venv"   # a venv that does not exist: make shows how it would build it
    cpu, cuda, default = _make("venv", venv, "TORCH=cpu"), _make("venv", venv, "TORCH=cuda", "CUDA=cu126"), \
        _make("venv", venv)
    assert cpu.returncode == cuda.returncode == default.returncode == 0, cpu.stderr + cuda.stderr
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu.stdout
    assert "--index-url https://download.pytorch.org/whl/cu126" in cuda.stdout
    assert "--index-url" not in default.stdout and "pip install -q -e '.[book,dev]'" in default.stdout
    bad = _make("venv", venv, "TORCH=gpu")
    assert bad.returncode != 0 and "TORCH=gpu is not a torch build" in bad.stderr and "TORCH=cpu" in bad.stderr


def test_make_checks_the_python_version_first(tmp_path):
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\necho 3.10\nexit 1\n")   # what the check prints and exits with on 3.10
    old.chmod(0o755)
    out = subprocess.run(["make", "venv", f"PYTHON={old}", f"VENV={tmp_path}/venv"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=_make_env())
    assert out.returncode != 0 and not (tmp_path / "venv").exists()
    (line,) = [x for x in out.stdout.splitlines() if "pipelib needs" in x]
    assert f"needs Python 3.11, 3.12 or 3.13, and {old} is 3.10" in line and "make PYTHON=python3.12" in line
    ok = subprocess.run(["make", "python-version", f"PYTHON={sys.executable}", f"VENV={tmp_path}/venv"],
                        capture_output=True, text=True, timeout=60, cwd=ROOT, env=_make_env())
    assert ok.returncode == 0 and ok.stdout == ""
