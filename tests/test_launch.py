"""`python -m pipelib train` under torchrun, with no cluster (`pipelib.launch`): 2 and 4 CPU
processes on one node, and two "nodes" on loopback meeting at a c10d rendezvous on 127.0.0.1,
each equal to one process (losses, last gradients, final parameters); and the checks that come
before any process group."""
import json
import os
import socket
import subprocess
import sys

import pytest

from pipelib.launch import check_torchrun_world, choose_device, load_plan_and_recipe, torchrun_env
from pipelib.plan import Plan
from pipelib.recipe import Recipe

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
RECIPE = {"model": {"kind": "gpt", "vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32},
          "batch_size": 8, "steps": 3, "dtype": "float64"}
ENV = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(tmp_path, plan: dict):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "recipe.json").write_text(json.dumps(RECIPE))
    return ["-m", "pipelib", "train", "--plan", str(tmp_path / "plan.json"), "--recipe",
            str(tmp_path / "recipe.json"), "--device", "cpu", "--check"]


def _done(procs, timeout=240):
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("torchrun did not finish in time")
        outs.append(out)
        assert p.returncode == 0, out[-3000:]
    return outs


@pytest.mark.parametrize("plan,nproc", [({"dp": 2}, 2), ({"dp": 2, "tp": 2}, 4)], ids=["dp2", "dp2xtp2"])
def test_torchrun_one_node_equals_one_process(tmp_path, plan, nproc):
    out = tmp_path / "run.json"
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", *_files(tmp_path, plan), "--out", str(out)]
    (log,) = _done([subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)])
    report = json.loads(out.read_text())
    assert "equal to one process" in log and report["check"].endswith(")") and "DIFFERS" not in report["check"]
    assert report["world_size"] == nproc and len(report["losses"]) == 3
    assert set(report["peak_bytes"]) == {str(r) for r in range(nproc)}   # every rank measured
    assert all(len(v) == 3 and min(v) > 0 for v in report["bytes_sent"].values())


def test_two_nodes_on_loopback_meet_at_a_c10d_rendezvous(tmp_path):
    """Two torchrun launches, as two machines would run them, one process each: DP x PP over
    the two "nodes" (a 1F1B pipeline cut between them)."""
    port = _free_port()
    args = _files(tmp_path, {"pp": 2, "microbatches": 2})
    procs = [subprocess.Popen([TORCHRUN, "--nnodes=2", f"--node-rank={k}", "--nproc-per-node=1",
                               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=book",
                               *args], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for k in (0, 1)]
    logs = _done(procs)
    assert sum("equal to one process" in log for log in logs) == 1      # rank 0 reports, on one node


def test_everything_checkable_is_checked_before_any_process_group():
    with pytest.raises(RuntimeError, match="run me under torchrun"):
        torchrun_env({"RANK": "0"})
    env = torchrun_env({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"})
    assert choose_device("auto", env, 0) == "cpu" and choose_device("auto", env, 4) == "cuda"
    with pytest.raises(ValueError, match="without CUDA GPUs; use --device cpu"):
        choose_device("cuda", env, 0)
    with pytest.raises(ValueError, match="4 ranks on this node but 2 GPU"):
        choose_device("cuda", env, 2)
    with pytest.raises(ValueError, match="device='tpu'"):
        choose_device("tpu", env, 0)
    recipe = Recipe.from_dict(RECIPE)
    with pytest.raises(ValueError, match=r"needs 2 ranks but torchrun started 4"):
        check_torchrun_world(Plan(dp=2), recipe, env)
    check_torchrun_world(Plan(dp=2, tp=2), recipe, env)


def test_flags_override_the_files(tmp_path):
    (tmp_path / "recipe.json").write_text(json.dumps(RECIPE))
    recipe, plan = load_plan_and_recipe(None, str(tmp_path / "recipe.json"), {"dp": 2, "steps": 5, "tp": None})
    assert plan == Plan(dp=2) and recipe.steps == 5 and recipe.batch_size == 8
    with pytest.raises(ValueError, match="--colour is neither a Plan nor a Recipe field"):
        load_plan_and_recipe(None, None, {"colour": 1})


def test_torchrun_restarts_a_failed_run_from_its_last_checkpoint(tmp_path):
    """--max-restarts 1: the first attempt fails after step 2 (every rank raises), torchrun starts
    every worker again, they resume from step 2's checkpoint, and the run ends equal to one
    process (the last two steps' losses and every parameter)."""
    out, ck = tmp_path / "run.json", tmp_path / "checkpoints"
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
           *_files(tmp_path, {"dp": 2}), "--steps", "4", "--checkpoint", str(ck), "--crash-after", "2",
           "--out", str(out)]
    (log,) = _done([subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)])
    report = json.loads(out.read_text())
    assert "crash injected after step 2" in log and report["resumed_at"] == 2
    assert len(report["losses"]) == 2 and "2 step losses" in report["check"] and "DIFFERS" not in report["check"]
