"""pipelib's ZeRO-3 against torch's FSDP2 (`fully_shard`) and the single process, on the cluster.

Same model (193 parameters, odd), same batches, 3 Adam steps: FSDP2's gradients of the last step
and its parameters equal the single process's, and so do ZeRO-3's, within fp32 tolerance; hence
pipelib's ZeRO-3 computes FSDP2's gradients.
"""
import pytest

from pipelib.data_parallel.fsdp_twin import train_fsdp
from pipelib.data_parallel.zero_runner import reference_adam, train_zero
from pipelib.results import check_against_reference

pytestmark = pytest.mark.usefixtures("one_thread")  # the single-process references share 2 cores

ODD = dict(kind="mlp", in_features=6, hidden=9, out_features=4, num_layers=3)
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
def test_same_gradients_as_fsdp2(cluster4, n):
    ref = reference_adam(ODD, 3, 8)
    fsdp = train_fsdp(cluster4, ODD, world_size=n, steps=3, batch=8)
    ours = train_zero(cluster4, ODD, 3, world_size=n, steps=3, batch=8)
    for res in (fsdp, ours):
        check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
    for name, g in fsdp[0].grads.items():  # and directly against each other
        assert (ours[0].grads[name] - g).abs().max() < 1e-6, name
