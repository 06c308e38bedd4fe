"""The MoE GPT trained with expert parallelism on 2 and 4 engines and with EP x DP equals one
process with the same routing: every step's loss and gradients (expert weights included) and the
parameters after 3 optimizer steps; the dispatch and combine bytes in the trace equal the routing
counts exactly."""
import pytest
import torch

from pipelib.expert_parallel.layer import MoESpec
from pipelib.expert_parallel.training import moe_reference, train_expert_parallel
from pipelib.model import GPTConfig
from pipelib.recipe import Recipe
from pipelib.results import StepResult, check_against_reference

pytestmark = pytest.mark.cluster

GPT = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
RECIPE = Recipe(GPT, batch_size=8, steps=3, lr=1e-2, dtype=torch.float64)
CAPACITY = MoESpec(num_experts=4, k=2, capacity_factor=1.0, drop_policy="position", bias_rate=0.01)
DROPLESS = MoESpec(num_experts=8, k=1, aux_coef=0.1, layers=(1,))


def _check_every_step(results, ref):
    agreed = check_against_reference(results, ref, shared=True)
    for step in range(RECIPE.steps):
        check_against_reference([r and StepResult(grads=r.stats["grads"][step]) for r in results],
                                ref_grads=ref.stats["grads"][step], shared=True)
    return agreed


@pytest.mark.parametrize("dp, ep, spec, builtin", [
    (2, 2, CAPACITY, False),   # EP on 2 engines
    (4, 4, DROPLESS, False),   # EP on 4 engines, dropless, one MoE layer of 8 experts
    (4, 2, CAPACITY, False),   # EP x DP: 2 ep groups of 2, experts replicated across them
    (4, 2, DROPLESS, True),    # the same with gloo's all_to_all_single moving the tokens
], ids=["ep2", "ep4-dropless", "ep2xdp2", "ep2xdp2-gloo"])
def test_expert_parallel_equals_one_process(cluster4, dp, ep, spec, builtin):
    results = cluster4.run(train_expert_parallel, RECIPE, spec, dp, ep, builtin=builtin)
    ref = moe_reference(RECIPE, spec, dp)
    agreed = _check_every_step(results, ref)
    experts = [k for k in ref.grads if ".experts." in k]
    assert len(experts) == 4 * spec.num_experts * len(spec.layers or range(GPT.n_layer))
    assert agreed.num_tensors == 2 * len(ref.grads)
    held = [sum(".experts." in k for k in r.grads) for r in results[:dp]]
    assert held == [len(experts) // ep] * dp  # each rank holds E/ep experts of every layer
    assert all(r is None for r in results[dp:])
    # the global load per expert is the same in both, and a real split (not one expert)
    assert results[0].stats["load"] == ref.stats["load"]
    assert all(0 < max(load) < sum(load) for step in ref.stats["load"] for load in step)


def test_trace_bytes_equal_the_routing_counts(cluster4):
    """Per layer and step, rank r's dispatch sends the rows its routing sent to each other ep
    rank; its combine sends back the rows it received; the counts went first (E/ep int64 per peer)."""
    dp = ep = 4
    cluster4.reset()
    results = cluster4.run(train_expert_parallel, RECIPE, CAPACITY, dp, ep)
    events = cluster4.trace().filter(kind="collective")
    row = GPT.n_embd * 8  # one token's C float64 values
    for layer in range(GPT.n_layer):
        for r in range(dp):
            sent = [results[r].stats["sent"][s][layer] for s in range(RECIPE.steps)]  # (ep,) rows per peer
            got = [[results[p].stats["sent"][s][layer][r] for p in range(dp)] for s in range(RECIPE.steps)]
            mine = [e for e in events if e.rank == r]

            def bytes_of(label, mine=mine, layer=layer):
                return [e.bytes for e in mine if e.label == f"all_to_all_uneven: moe {layer} {label}"]

            assert bytes_of("dispatch") == [(sum(s) - s[r]) * row for s in sent]
            assert bytes_of("combine") == [(sum(g) - g[r]) * row for g in got]
            assert bytes_of("combine backward") == [(sum(s) - s[r]) * row for s in sent]
            assert bytes_of("dispatch backward") == [(sum(g) - g[r]) * row for g in got]
            counts = [e.bytes for e in mine if e.label == f"all_to_all: moe {layer} counts"]
            assert counts == [(ep - 1) * CAPACITY.num_experts // ep * 8] * RECIPE.steps
    assert sum(sum(sum(s) for s in step) for r in results for step in r.stats["sent"]) > 0


@pytest.mark.parametrize("dp, ep, experts, match", [
    (4, 4, 6, r"experts not divisible by the ep size: num_experts=6, ep=4"),
    (4, 3, 6, r"ep=3 does not divide dp=4"),
])
def test_bad_layouts_name_their_values(cluster4, dp, ep, experts, match):
    from pipelib.runtime.errors import RankError

    with pytest.raises(RankError, match=match):
        cluster4.run(train_expert_parallel, RECIPE, MoESpec(num_experts=experts), dp, ep)
    assert cluster4.run(train_expert_parallel, RECIPE.replace(steps=1), DROPLESS, 2, 2)[0] is not None  # usable
