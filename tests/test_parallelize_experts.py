"""Experts inside the spine: a recipe with experts trained under `Plan(dp=..., ep=...)` through
`parallelize` and the trainer equals one process running the same dp shards one after the other
(routing, capacity and the Switch loss are per shard), DeepSeek-V3's bias included; the
experts' bytes travel on the ep axis (dispatch and combine) and the edp axis (their gradients)."""
import pytest
import torch

from pipelib.expert_parallel.layer import MoESpec
from pipelib.model import GPTConfig
from pipelib.plan import Plan
from pipelib.recipe import Recipe
from pipelib.results import check_against_reference
from pipelib.trainer import run

GPT = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
SPEC = MoESpec(num_experts=4, k=2, capacity_factor=1.25, bias_rate=1e-3)
RECIPE = Recipe(GPT, batch_size=8, steps=3, lr=1e-2, dtype=torch.float64, experts=SPEC)


@pytest.mark.parametrize("sizes", [dict(dp=4, ep=2), dict(dp=4, ep=4), dict(dp=2)], ids=["dp4ep2", "dp4ep4", "dp2"])
def test_experts_through_the_plan_equal_one_process(cluster4, sizes):
    plan = Plan(**sizes)
    results = run(cluster4, RECIPE, plan)
    trace = cluster4.trace()
    ref = RECIPE.reference(shards=plan.dp)
    check_against_reference(results, ref, shared=True)
    assert results[0].losses == pytest.approx(ref.losses, rel=1e-12)
    held = [{n for n in r.params if ".experts." in n} for r in results[:plan.dp]]
    assert all(len(h) == len(held[0]) for h in held) and len(set().union(*held)) == len(ref.params) - len(
        {n for n in ref.params if ".experts." not in n})  # every expert somewhere
    if plan.ep > 1:
        assert all(len(h) * plan.ep == len(set().union(*held)) for h in held)  # E/ep experts a rank
        assert trace.bytes_sent(axis="ep") > 0
        assert (trace.bytes_sent(axis="edp") > 0) == (plan.dp > plan.ep)


def test_experts_refusals_name_the_values():
    with pytest.raises(ValueError, match="ep=2 spreads the experts over 2 ranks, but the recipe has no experts"):
        Plan(dp=2, ep=2).check(Recipe(GPT, batch_size=8))
    with pytest.raises(ValueError, match="num_experts=4; use an ep that divides it"):
        Plan(dp=3, ep=3).check(Recipe(GPT, batch_size=9, experts=SPEC))
    with pytest.raises(ValueError, match="ep=2 composes with dp and a DDP kind, not yet with tp=2"):
        Plan(dp=2, tp=2, ep=2)
    with pytest.raises(ValueError, match="a recipe with experts runs on dp and ep; tp=2"):
        Plan(tp=2).check(RECIPE)
    assert Recipe.from_dict(RECIPE.to_dict()) == RECIPE
    assert str(Plan(dp=4, ep=2)) == "Plan(dp=4 (ep=2): ddp)"
