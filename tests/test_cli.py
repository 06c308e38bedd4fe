"""`python -m pipelib check` runs the same library under torchrun (the multi-node path)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_torchrun_check_three_ranks():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--nproc-per-node", "3", "-m", "pipelib", "check", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    assert out.returncode == 0, out.stderr[-2000:]
    for r in range(3):
        assert f"rank {r}/3" in out.stdout and "ping and all_reduce ok" in out.stdout


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
