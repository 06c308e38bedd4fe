"""Parameter counts of the MoE GPT against the live model; FLOPs per token equal to a dense GPT
whose MLP is k times wider, plus the router."""
import dataclasses

import pytest

from pipelib.expert_parallel.gpt import moe_gpt
from pipelib.expert_parallel.layer import MoESpec
from pipelib.expert_parallel.sizes import expert_params, moe_sizes
from pipelib.memory import gpt_forward_flops
from pipelib.model import GPTConfig
from pipelib.recipe import Recipe

CFG = GPTConfig(vocab_size=64, block_size=8, n_layer=3, n_head=2, n_embd=16)


@pytest.mark.parametrize("spec", [MoESpec(num_experts=8, k=2), MoESpec(num_experts=4, k=1, layers=(0, 2), hidden=24)])
def test_counts_are_the_live_models(spec):
    model = moe_gpt(Recipe(CFG), spec)
    total = sum(p.numel() for p in model.parameters())
    s = moe_sizes(CFG, spec, ep=4)
    assert s.total == total
    experts = sum(p.numel() for k, p in model.named_parameters() if ".experts." in k)
    layers = len(spec.layers or range(CFG.n_layer))
    assert s.per_rank == total - experts + experts // 4
    assert s.active == total - experts + layers * spec.k * expert_params(16, spec.hidden or 64)
    assert s.state_bytes() == 16 * s.per_rank


def test_flops_per_token_are_a_dense_gpt_with_a_k_times_wider_mlp_plus_the_router():
    spec = MoESpec(num_experts=8, k=2)
    s = moe_sizes(CFG, spec)
    T = CFG.block_size
    one = gpt_forward_flops(CFG, 1, T) // T
    mlp = 2 * 2 * 16 * 64   # per token, C -> 4C -> C, 2 FLOPs per multiply-add
    assert s.forward_flops_per_token == one + CFG.n_layer * (mlp + 2 * 16 * 8)   # one more MLP, the router
    wide = dataclasses.replace(spec, k=1, hidden=128)
    assert moe_sizes(CFG, wide).forward_flops_per_token == s.forward_flops_per_token
