"""Against torch: torch.utils.checkpoint around each block (full), around the attention core,
and torch's selective activation checkpoint API (create_selective_checkpoint_contexts, on CPU)
give the same loss and gradients as our policies, bit for bit, dropout included."""
import pytest
import torch

from pipelib.model import GPTConfig
from pipelib.recompute.against_torch import torch_checkpoint_step
from pipelib.recompute.measure import bitwise_equal, measure_policy

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [("full", "full"), ("core", "selective"), ("sac", "selective")]


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("mode, policy", PAIRS)
def test_same_loss_and_gradients_as_torch(mode, policy, dropout):
    cfg = GPTConfig(n_layer=2, dropout=dropout)
    ours = measure_policy(cfg, policy, batch=2)
    loss, grads = torch_checkpoint_step(cfg, mode, batch=2)
    assert torch.equal(loss, ours.loss)
    assert bitwise_equal(grads, ours.grads)


def test_unknown_torch_mode():
    with pytest.raises(ValueError, match="unknown torch checkpoint mode 'all'"):
        torch_checkpoint_step(GPTConfig(), "all")
