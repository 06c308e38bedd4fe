"""DeepSpeed's ZeRO (0.19.8, CPU, gloo, two spawned processes, no launcher) on the same model and
batches as pipelib's: its first-step gradients and its parameters after 3 Adam steps equal the
single process's within fp32 tolerance, as pipelib's ZeRO's do (tests/data_parallel/test_zero.py).
Nothing is compiled: torch's Adam, and the shared-memory all-reduce marked unavailable
(`pipelib.data_parallel.deepspeed_twin`)."""
import json

import pytest

from pipelib.data_parallel.deepspeed_twin import config_json, run_deepspeed
from pipelib.results import check_against_reference
from pipelib.model import MLPConfig
from pipelib.recipe import Recipe

pytestmark = pytest.mark.usefixtures("one_thread")  # the single-process references share 2 cores

ODD = Recipe(MLPConfig(in_features=6, hidden=9, out_features=4, num_layers=3), lr=1e-3)  # 193 parameters


@pytest.mark.parametrize("stage", [3])  # stage 2: chapter 08 checks it under nbval (one spawn ~10 s)
def test_same_gradients_and_parameters_as_deepspeed(stage):
    pytest.importorskip("deepspeed")
    ref1, ref3 = ODD.replace(steps=1, batch_size=8).reference(), ODD.replace(steps=3, batch_size=8).reference()
    ds = run_deepspeed(ODD.replace(steps=3, batch_size=8), stage, world_size=2)
    check_against_reference([ds], ref_grads=ref1.grads, ref_params=ref3.params, rtol=1e-5, atol=1e-6)
    assert ds.stats["config"]["zero_optimization"]["stage"] == stage
    assert ds.losses == pytest.approx(ref3.losses, rel=1e-5)
    # DeepSpeed shards Adam's state as ZeRO says: 2 psi / N moments on a rank, plus its padding
    moments, share = ds.stats["state_numel"]["adam_moments"], -(-193 // 2)
    assert 2 * share <= moments <= 2 * share + 16, moments


def test_config_and_bad_input():
    cfg = json.loads(config_json(3, world_size=2, micro_batch=4))
    assert cfg["train_batch_size"] == 8 and cfg["optimizer"]["params"]["torch_adam"] is True
    with pytest.raises(ValueError, match="stage=5"):
        run_deepspeed(ODD, 5)
    with pytest.raises(ValueError, match="batch=7 does not divide by world_size=2"):
        run_deepspeed(ODD.replace(batch_size=7), 1)
