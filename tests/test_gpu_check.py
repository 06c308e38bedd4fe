"""`python -m pipelib gpu-check`: every collective and strategy against its reference, one table.

On CPUs (what CI runs): green, every row of the registry in the table and in the JSON with its
tolerance and measured difference; a row that differs or crashes fails the run, names itself and
what went wrong, and the rows after it still run. On a GPU machine the same command runs on NCCL
(the lead runs it there)."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from pipelib.gpucheck.registry import CHECKS, CheckInfo
from pipelib.gpucheck.rows import Measured, Row, judged
from pipelib.gpucheck.run import choose, gpu_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


@pytest.mark.cluster
def test_gpu_check_on_cpus_is_green_with_every_row_in_the_table_and_the_json(tmp_path):
    out = tmp_path / "gpu-check.json"
    run = subprocess.run([sys.executable, "-m", "pipelib", "gpu-check", "--device", "cpu", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["backend"] == "gloo" and report["world"] == 2 and report["passed"]
    assert report["memory_source"] == "tracker"
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["cluster", *CHECKS]
    table = {line.split()[0]: line for line in run.stdout.splitlines() if line.split()}
    for name, info in CHECKS.items():
        row = rows[name]
        assert name in table and " ok " in table[name], table.get(name)
        assert row["status"] == "ok" and row["tolerance"] == info.tolerance is not None
        assert isinstance(row["diff"], float) and 0 <= row["diff"] <= row["tolerance"], row
        assert row["pipelib_s"] > 0, row
        if info.twin is not None:  # raced against torch's twin
            assert row["torch_s"] > 0 and row["twin"] == info.twin, row
        if info.group != "collective":  # a training run: the tracker's peak on both ranks
            assert len(row["memory_per_rank"]) == 2 and min(row["memory_per_rank"]) > 0, row
    assert f"all {len(rows)} rows ok" in run.stdout


def _differs(ctx):
    return Measured(diff=0.5, worst="gradient w")


def _crashes(ctx):
    return ctx.cluster.run(int, "not a number")  # raises on every engine


def _kills_a_rank(ctx):
    return ctx.cluster.run_on([1], os._exit, 3)  # rank 1's process dies: the cluster must start afresh


@pytest.mark.cluster
def test_a_row_that_differs_crashes_or_kills_a_rank_fails_the_run_names_itself_and_the_next_row_runs(
        tmp_path, capsys):
    checks = {"differs": CheckInfo("differs", "test", _differs, 1e-9, "one process"),
              "crashes": CheckInfo("crashes", "test", _crashes, 1e-9, "one process"),
              "dies": CheckInfo("dies", "test", _kills_a_rank, 1e-9, "one process"),
              "all_reduce": CHECKS["all_reduce"]}
    out = tmp_path / "gpu-check.json"
    status = gpu_check("cpu", 2, str(out), checks=checks)
    printed = capsys.readouterr().out
    assert status == 1
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["differs"]["failure"] == "gradient w differs by 0.5 > 1e-09"
    assert rows["crashes"]["failure"].startswith("RankError: ") and "ValueError" in rows["crashes"]["failure"]
    assert rows["dies"]["failure"].startswith("RankDiedError: ")
    assert rows["all_reduce"]["status"] == "ok" and rows["all_reduce"]["diff"] == 0   # on the restarted cluster
    lines = {line.split()[0]: line for line in printed.splitlines() if line.split()}
    assert "FAIL" in lines["differs"] and "gradient w differs by 0.5 > 1e-09" in lines["differs"]
    assert "FAIL" in lines["crashes"] and "ValueError" in lines["crashes"]
    assert "FAILED: 3 of 5 rows (differs, crashes, dies)" in printed


def test_a_difference_above_the_tolerance_or_nan_fails_and_a_skip_passes():
    def row(**m):
        return judged(Row("x", "strategy", "one process", 1e-9, None, Measured(**m)))

    assert row(diff=1e-10).passed and row(diff=0.0).status == "ok"
    assert row(diff=2e-9).failure == "the result differs by 2e-09 > 1e-09"
    assert not row(diff=math.nan).passed and not row(diff=math.inf).passed
    assert row(diff=None).failure == "nothing was compared"
    assert row(diff=0.0, error="race against torch's twin: RuntimeError: x").failure.startswith("race against")
    assert row(skipped="needs 2 ranks").passed and row(skipped="needs 2 ranks").status == "skip"


def test_the_device_and_the_world_are_checked_before_any_engine_starts():
    assert choose("auto", None, 0) == ("cpu", 2) and choose("auto", None, 4) == ("cuda", 4)
    assert choose("cpu", 3, 8) == ("cpu", 3) and choose("cuda", 2, 8) == ("cuda", 2)
    with pytest.raises(ValueError, match="without CUDA GPUs; use --device cpu"):
        choose("cuda", None, 0)
    with pytest.raises(ValueError, match="--world 4 on 2 GPU"):
        choose("cuda", 4, 2)
    with pytest.raises(ValueError, match="--world"):
        choose("cpu", 0, 0)


def test_bad_arguments_exit_2_with_one_line_naming_what_to_pass():
    bad = [["--only", "all_reduce,nonsense"]] + ([] if torch.cuda.is_available() else [["--device", "cuda"]])
    for args in bad:
        run = subprocess.run([sys.executable, "-m", "pipelib", "gpu-check", *args], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env=ENV)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert "gpu-check:" in run.stderr and ("nonsense" in run.stderr or "--device cpu" in run.stderr)
