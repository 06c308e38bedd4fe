"""pipelib's ZeRO-3 against torch's FSDP2 (`fully_shard`) and the single process, on the cluster.

Same model (193 parameters, odd), same batches, 3 Adam steps: FSDP2's gradients of the last step
and its parameters equal the single process's, and so do ZeRO-3's, within fp32 tolerance; hence
pipelib's ZeRO-3 computes FSDP2's gradients.
"""
import pytest

from pipelib.data_parallel.fsdp_twin import train_fsdp
from pipelib.data_parallel.zero_runner import train_zero
from pipelib.results import check_against_reference
from pipelib.model import MLPConfig
from pipelib.recipe import Recipe

pytestmark = pytest.mark.usefixtures("one_thread")  # the single-process references share 2 cores

ODD = Recipe(MLPConfig(in_features=6, hidden=9, out_features=4, num_layers=3), lr=1e-3)
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
def test_same_gradients_as_fsdp2(cluster4, n):
    ref = ODD.replace(steps=3, batch_size=8).reference()
    fsdp = train_fsdp(cluster4, ODD.replace(steps=3, batch_size=8), world_size=n)
    ours = train_zero(cluster4, ODD.replace(steps=3, batch_size=8), 3, world_size=n)
    for res in (fsdp, ours):
        check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
    for name, g in fsdp[0].grads.items():  # and directly against each other
        assert (ours[0].grads[name] - g).abs().max() < 1e-6, name


@pytest.mark.cluster
def test_fsdp2_shards_each_parameter_on_dim0_where_zero_cuts_flat_units(cluster4):
    """FSDP2: every rank holds rows of every parameter (torch.chunk of dim 0, padding per
    parameter); pipelib's ZeRO: a rank holds one N-th of each unit's flat buffer, so some
    parameters not at all. Both hold every element exactly once over the ranks."""
    import math

    import torch

    from pipelib.data_parallel.fsdp_twin import compare_layouts, dim0_padded_numel
    from pipelib.data_parallel.zero_formulas import padded_numel

    spec = Recipe(MLPConfig(in_features=30, hidden=50, out_features=7, num_layers=3), lr=1e-3)
    lay = compare_layouts(cluster4, spec)
    for name, first in lay[0].items():
        shape = first["shape"]
        rows = [len(c) for c in torch.arange(shape[0]).chunk(4)] + [0] * 4
        assert [lay[r][name]["fsdp2"][0] for r in range(4)] == rows[:4], name
        assert all(lay[r][name]["fsdp2"][1:] == shape[1:] for r in range(4))
        assert sum(lay[r][name]["zero"][1] - lay[r][name]["zero"][0] for r in range(4)) == math.prod(shape)
    assert lay[0]["layers.0.0.bias"]["zero"] == (0, 0) and lay[0]["layers.0.0.bias"]["fsdp2"] == (13,)
    shapes = [v["shape"] for v in lay[0].values()]
    assert dim0_padded_numel(shapes, 4) == (13 * 4 * 30 + 13 * 4) + (13 * 4 * 50 + 13 * 4) + (2 * 4 * 50 + 2 * 4)
    assert padded_numel([1550, 2550, 357], 4) < dim0_padded_numel(shapes, 4)
