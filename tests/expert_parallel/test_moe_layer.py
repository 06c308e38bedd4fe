"""The MoE layer in one process against a token-by-token loop; where experts live on ep ranks;
the GPT with MoE layers applied from outside; bad input names its values."""
import pytest
import torch

from pipelib.expert_parallel.dispatch import regroup_index
from pipelib.expert_parallel.experts import expert_range
from pipelib.expert_parallel.gpt import moe_gpt, moe_layers, moe_loss
from pipelib.expert_parallel.layer import MoE, MoESpec
from pipelib.model import GPTConfig
from pipelib.recipe import Recipe


@pytest.mark.parametrize("spec", [MoESpec(num_experts=4, k=2, capacity_factor=1.0, drop_policy="position"),
                                  MoESpec(num_experts=3, k=1), MoESpec(num_experts=4, k=2, capacity_factor=0.5)])
def test_moe_equals_a_loop_over_tokens(spec):
    moe = MoE(spec, n_embd=8, layer=0, seed=3, n_layer=2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = moe(x)
    r = moe.last.routing
    h = x.reshape(10, 8)
    want = torch.zeros_like(h)
    for s in range(10):
        for j in range(spec.k):
            if r.slots[s, j] >= 0:
                want[s] += r.weights[s, j].double() * moe.experts[str(int(r.experts[s, j]))](h[s:s + 1])[0]
    assert torch.allclose(y.reshape(10, 8), want, atol=1e-12)
    assert int(r.counts.sum()) + r.dropped == 10 * spec.k


def test_an_expert_has_the_same_weights_wherever_it_lives():
    spec = MoESpec(num_experts=4)
    a, b = MoE(spec, 8, layer=1, seed=5), MoE(spec, 8, layer=1, seed=5)
    del b.experts["0"], b.experts["1"]
    assert all(torch.equal(a.experts["2"].state_dict()[k], v) for k, v in b.experts["2"].state_dict().items())
    assert not torch.equal(a.experts["2"].c_fc.weight, a.experts["3"].c_fc.weight)
    assert not torch.equal(MoE(spec, 8, layer=0, seed=5).experts["2"].c_fc.weight, a.experts["2"].c_fc.weight)


def test_expert_range_places_contiguous_runs():
    assert [expert_range(8, 4, r) for r in range(4)] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert expert_range(3, 1, 0) == range(3)
    with pytest.raises(ValueError, match=r"experts not divisible by the ep size: num_experts=6, ep=4"):
        expert_range(6, 4, 0)
    with pytest.raises(ValueError, match=r"ep_rank=2 is outside the ep group of 2 ranks"):
        expert_range(4, 2, 2)


def test_regroup_turns_arrival_order_into_expert_order():
    received = torch.tensor([[2, 1], [0, 3]])  # from rank 0: 2 rows for e0, 1 for e1; rank 1: 0, 3
    # arrival rows: 0,1 (r0 e0), 2 (r0 e1), 3,4,5 (r1 e1): expert 0 first, then expert 1 by source
    assert regroup_index(received).tolist() == [0, 1, 2, 3, 4, 5]
    assert regroup_index(torch.tensor([[1, 1], [1, 1]])).tolist() == [0, 2, 1, 3]


def test_moe_gpt_replaces_the_mlps_it_is_told_to():
    recipe = Recipe(GPTConfig(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=8), batch_size=2)
    model = moe_gpt(recipe, MoESpec(num_experts=2, layers=(0, 2)))
    assert [m.layer for m in moe_layers(model)] == [0, 2]
    assert type(model.blocks[1].mlp).__name__ == "FeedForward"
    x, y = recipe.batch(0)
    loss = moe_loss(model, x, y)
    _, ce = model(x, y)
    aux = sum(m.last.routing.aux_loss for m in moe_layers(model))
    assert torch.allclose(loss, ce + 0.01 * aux)
    with pytest.raises(ValueError, match=r"layer 3 is not a block of the 3-layer GPT; pass layers in 0..2"):
        moe_gpt(recipe, MoESpec(layers=(3,)))


@pytest.mark.parametrize("kw, match", [
    (dict(num_experts=2, k=3), r"top-k k=3 is more than the number of experts E=2"),
    (dict(k=0), r"k=0; pass an integer >= 1"),
    (dict(capacity_factor=0.0), r"capacity_factor=0.0; pass a number > 0"),
    (dict(num_experts=0), r"num_experts=0; pass an integer >= 1"),
    (dict(drop_policy="random"), r"unknown drop policy 'random'; use one of \('probability', 'position'\)"),
    (dict(bias_rate=0.0), r"bias_rate=0.0; pass DeepSeek-V3's update speed gamma > 0"),
    (dict(aux_coef=-0.1), r"aux_coef=-0.1; pass the Switch loss's weight alpha >= 0"),
])
def test_a_bad_spec_names_its_values(kw, match):
    with pytest.raises(ValueError, match=match):
        MoESpec(**kw)
