"""fp32 gradient reduction under bf16 parameters (`ZeRO(..., reduce_dtype=torch.float32)`).

Against one process: every rank's bf16 gradients computed in one process and averaged exactly
(`rank_mean_gradients`). Reduced in fp32, ZeRO's averaged gradients (as its optimizer reads
them) equal that mean to fp32 rounding at every stage; reduced in bf16 they carry the ring's
8-bit roundings. The bytes held are the bf16-practice 18 per parameter (6 + 12/N at stage 1),
and the bytes sent carry 4-byte gradients.
"""
import pytest
import torch

from pipelib.data_parallel.zero_formulas import padded_numel, zero_comm_bytes, zero_state_bytes
from pipelib.data_parallel.zero_precision import rank_mean_gradients, ring_sum_error
from pipelib.data_parallel.zero_runner import train_zero
from pipelib.results import check_against_reference
from pipelib.model import MLPConfig
from pipelib.recipe import Recipe

pytestmark = pytest.mark.usefixtures("one_thread")

ODD = Recipe(MLPConfig(in_features=6, hidden=9, out_features=4, num_layers=3), lr=1e-3)  # 193 parameters
WIDE = Recipe(MLPConfig(in_features=30, hidden=50, out_features=7, num_layers=3), lr=1e-3)


def _relative_error(grads, want):
    return max(((grads[k] - g).abs().max() / g.abs().max()).item() for k, g in want.items())


@pytest.mark.cluster
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp32_reduction_equals_the_exact_mean_of_bf16_gradients(cluster4, stage):
    want = rank_mean_gradients(WIDE.replace(batch_size=8), 4)
    mixed = WIDE.replace(steps=1, batch_size=8, mixed_precision=True)
    fp32 = train_zero(cluster4, mixed, stage, reduce_dtype=torch.float32)
    bf16 = train_zero(cluster4, mixed, stage)
    e32, e16 = _relative_error(fp32[0].grads, want), _relative_error(bf16[0].grads, want)
    assert e32 < 1e-6          # a sum of 4 bf16 values is exact in fp32; / 4 is exact
    assert e16 > 1e-4 > e32    # bf16 keeps 8 bits: the ring's sums round


@pytest.mark.cluster
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp32_gradients_hold_18_bytes_and_send_4_byte_gradients(cluster4, stage):
    padded = padded_numel([63, 90, 40], 4)
    cluster4.reset()
    mixed = ODD.replace(steps=2, batch_size=8, mixed_precision=True)
    res = train_zero(cluster4, mixed, stage, reduce_dtype=torch.float32)
    want = zero_state_bytes(padded, 4, stage, True, num_tensors=3, fp32_grads=True)
    for r in range(4):
        got = res[r].stats["memory"]
        assert (got["parameters"], got["gradients"], got["optimizer"]) == (want.params, want.grads, want.optimizer)
        per_step = zero_comm_bytes(padded, 4, stage, True, fp32_grads=True)
        assert res[r].stats["bytes_sent"] == (per_step, per_step)
    # training goes on as in one process with the same master weights
    ref = ODD.replace(steps=2, batch_size=8, mixed_precision=True).reference()
    check_against_reference(res, ref_params=ref.params, shared=True, rtol=0, atol=2e-3)


@pytest.mark.cluster
def test_fp32_main_gradients_accumulate_micro_batches(cluster4):
    """Stage 1 with fp32 main gradients and 2 micro-batches: equal to one process in fp32 within
    bf16 compute's error, and the step's traffic is one reduction, as without accumulation."""
    ref = ODD.replace(steps=1, batch_size=16).reference()
    mixed = ODD.replace(steps=1, batch_size=16, mixed_precision=True)
    res = train_zero(cluster4, mixed, 1, accumulate=2, reduce_dtype=torch.float32)
    check_against_reference(res, ref_params=ref.params, shared=True, rtol=0, atol=2e-3)
    padded = padded_numel([63, 90, 40], 4)
    assert res[0].stats["bytes_sent"] == (zero_comm_bytes(padded, 4, 1, True, fp32_grads=True),)


def test_bf16_ring_sums_lose_precision_as_n_grows():
    bf16 = [ring_sum_error(n) for n in (2, 16, 256)]
    fp32 = [ring_sum_error(n, torch.float32) for n in (2, 16, 256)]
    assert bf16[0] < bf16[1] < bf16[2]           # more hops, more roundings
    assert max(fp32) < 1e-6 < min(bf16)
    assert ring_sum_error(1) == 0.0


def test_megatron_bytes_per_parameter():
    """Megatron Core's distributed-optimizer table: bf16 parameters with fp32 gradients hold 18
    bytes per parameter, and 6 + 12/d with the optimizer state sharded over d ranks."""
    psi, d = 1200, 4
    assert zero_state_bytes(psi, 1, 0, fp32_grads=True).total == 18 * psi
    assert zero_state_bytes(psi, d, 1, fp32_grads=True).total == 6 * psi + 12 * psi // d
    assert zero_state_bytes(psi, d, 3, fp32_grads=True).total == 18 * psi // d
