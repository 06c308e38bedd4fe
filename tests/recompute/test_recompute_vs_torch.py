"""Against torch: each policy's twin, torch.utils.checkpoint around each block (full), each
segment of k blocks (every_k), the attention core (selective), or torch's selective activation
checkpoint API (create_selective_checkpoint_contexts, on CPU, sac=True), gives the same loss
and gradients as our policy, bit for bit, dropout included."""
import pytest
import torch

from pipelib.model import GPTConfig
from pipelib.recompute.against_torch import torch_checkpoint_step
from pipelib.recompute.measure import bitwise_equal, measure_policy

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = [("none", None, False), ("full", None, False), ("every_k", 2, False), ("selective", None, False),
         ("selective", None, True)]


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("policy, k, sac", CASES, ids=["none", "full", "every_k-2", "selective", "selective-sac"])
def test_same_loss_and_gradients_as_torch(policy, k, sac, dropout):
    cfg = GPTConfig(n_layer=3, dropout=dropout)
    ours = measure_policy(cfg, policy, k, batch=2)
    loss, grads = torch_checkpoint_step(cfg, policy, k, batch=2, sac=sac)
    assert torch.equal(loss, ours.loss)
    assert bitwise_equal(grads, ours.grads)


def test_unknown_policy_or_sac_elsewhere_is_refused():
    with pytest.raises(ValueError, match="unknown recomputation policy 'all'"):
        torch_checkpoint_step(GPTConfig(), "all")
    with pytest.raises(ValueError, match="sac=True is torch's selective activation checkpoint.*policy 'full' has none"):
        torch_checkpoint_step(GPTConfig(n_layer=2), "full", sac=True)
