"""A 3-D run (dp 2 x tp 2 x pp 2, eight spawned gloo ranks): resumed after a crash bit for bit,
and its checkpoint (ZeRO-1 over dp) loaded at dp 4 x tp 2 with every bit of parameters and
optimizer state kept. The scenarios are those of test_checkpoint_reshard, on a larger world."""
import datetime
import os

import pytest
import torch
import torch.distributed as dist
from spawned import spawn_ranks  # tests/spawned.py

WORLD = 8
DEADLINE_S = 300


def _worker(rank, path):
    import traceback

    from test_checkpoint_reshard import _reshard, _resume

    from pipelib.plan import PipelineOptions, Plan

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=90))
    out = {}
    m2 = PipelineOptions(microbatches=2)
    for name, fn in (("resume", lambda: _resume(path, "3d", Plan(dp=2, tp=2, pp=2, pipeline=m2))),
                     ("reshard", lambda: _reshard(path, "3d-re", Plan(dp=2, tp=2, pp=2, data="zero1", pipeline=m2),
                                                  Plan(dp=4, tp=2)))):
        try:
            out[name] = fn()
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        dist.barrier()
    torch.save(out, os.path.join(path, f"out{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("checkpoint_3d"), DEADLINE_S)


def _rank0(runs, name):
    errors = [f"rank {r}:\n{o[name]['error']}" for r, o in enumerate(runs) if "error" in o[name]]
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return runs[0][name]


def test_a_3d_run_resumes_bit_for_bit(runs):
    f = _rank0(runs, "resume")
    assert f["crashed"] and f["start"] == 2
    assert f["resumed"] == f["whole"][2:] and f["params_differ"] == []


def test_a_3d_checkpoint_loads_at_dp4_tp2(runs):
    f = _rank0(runs, "reshard")
    assert f["step"] == 2 and f["held"] > 0 and f["optim_keys"] > 0
    assert f["differ"] == [] and f["params_differ"] == []
