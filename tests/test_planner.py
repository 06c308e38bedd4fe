"""The strategy planner: counts against the published formulas, each itemised figure against
the physics it must obey, and bad strategies refused with the values named."""
from dataclasses import replace

import pytest

from pipelib.costmodel import LINKS, PROFILES
from pipelib.data_parallel.zero_formulas import zero_state_bytes
from pipelib.planner.search import evaluate, explain, search
from pipelib.planner.spec import GPT3_175B, LLAMA3_70B, Machine
from pipelib.planner.strategy import Strategy, check_strategy
from pipelib.planner.memory import stage_params
from pipelib.planner.timing import link_of

A100 = Machine(PROFILES["a100"], gpus_per_node=8, inter_node=LINKS["ib-ndr"])
MEGATRON = Strategy(dp=16, tp=8, pp=8, zero=1, recompute="full", micro_batch=1, schedule="interleaved_1f1b", virtual=2)


def test_parameters_and_flops_against_megatron_lm_formulas():
    g = GPT3_175B
    l, h, V, s = g.n_layer, g.hidden, g.vocab, g.seq_len
    # Narayanan et al. 2021, eq. (2): P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)); plus the final LayerNorm
    assert g.num_params() == 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h
    # eq. (3) per token: 72 l h^2 (1 + s/(6h) + V/(12 l h)), which leaves out biases and LayerNorms (6 x 13 l h + 2 h)
    assert g.model_flops_per_token() == 72 * l * h * h + 12 * l * s * h + 6 * V * h + 6 * (13 * l * h + 2 * h)
    assert round(LLAMA3_70B.num_params() / 1e9, 1) == 70.6  # Dubey et al. 2024: "70B", 70.6 B in the model card


def test_memory_is_zeros_model_states_of_the_stage_and_falls_as_each_lever_is_pulled():
    c = evaluate(GPT3_175B, A100, 1024, 1536, MEGATRON)
    states = zero_state_bytes(stage_params(GPT3_175B, MEGATRON), 16, 1, True)
    assert (c.memory["parameters"], c.memory["gradients"], c.memory["optimizer"]) == \
        (states.params, states.grads, states.optimizer)

    def mem(**kw):
        return evaluate(GPT3_175B, A100, 1024, 1536, replace(MEGATRON, **kw)).memory

    acts = [mem(recompute=r, flash=False)["activations"] for r in ("full", "selective", "none")]
    assert acts[0] < acts[1] < acts[2]
    # fused attention never keeps the 5 a s^2 b scores: selective recomputation then saves nothing
    assert mem(recompute="selective")["activations"] == mem(recompute="none")["activations"] == acts[1]
    assert mem(recompute="full", schedule="1f1b", virtual=1)["activations"] < acts[0]  # interleaving holds more
    assert mem(zero=0)["optimizer"] == 16 * mem(zero=1)["optimizer"]    # Adam's states over 16 dp ranks


def test_time_itemised_an_axis_across_nodes_costs_more_and_mfu_uses_the_dense_peak():
    c = evaluate(GPT3_175B, A100, 1024, 1536, MEGATRON)
    assert link_of("tp", MEGATRON, A100) is A100.device.link          # tp = 8 fills one node
    assert link_of("dp", MEGATRON, A100) is A100.inter_node
    crossed = replace(MEGATRON, order=("pp", "dp", "tp", "cp"))        # tp no longer innermost...
    assert link_of("tp", crossed, A100) is A100.device.link           # ...but cp = 1: still inside
    tp_out = replace(MEGATRON, order=("tp", "pp", "dp", "cp"))
    assert link_of("tp", tp_out, A100) is A100.inter_node
    ratio = evaluate(GPT3_175B, A100, 1024, 1536, tp_out).time["tp"] / c.time["tp"]
    nv, ib = A100.device.link, A100.inter_node  # each message slower by the latency or bandwidth ratio
    assert ib.alpha / nv.alpha <= ratio <= nv.beta / ib.beta
    assert c.step_time == pytest.approx(sum(c.time.values()))
    want = GPT3_175B.model_flops_per_token() * c.tokens_per_s / (1024 * A100.device.flops)
    assert c.mfu == pytest.approx(want)
    slow = replace(A100, efficiency=0.5)
    assert evaluate(GPT3_175B, slow, 1024, 1536, MEGATRON).time["compute"] == pytest.approx(2 * c.time["compute"])


def test_search_ranks_feasible_layouts_fastest_first_and_says_why_one_does_not_fit():
    found = search(GPT3_175B, A100, 1024, 1536)
    assert found and all(c.feasible for c in found)
    assert [c.step_time for c in found] == sorted(c.step_time for c in found)
    tight = evaluate(GPT3_175B, A100, 1024, 1536, Strategy(dp=128, tp=8, pp=1, zero=0))
    assert not tight.feasible and "needs" in tight.why and "optimizer" in tight.why
    assert "does not fit" in explain(tight) and "MFU" in explain(found[0])


@pytest.mark.parametrize("layout, match", [
    (Strategy(dp=8, tp=8, pp=8), "= 512 devices, not 1024"),
    (Strategy(dp=16, tp=64, pp=1), "tp=64 does not divide"),
    (Strategy(dp=16, tp=8, pp=7 * 1, cp=1), "devices, not 1024"),
    (Strategy(dp=32, tp=8, pp=4, micro_batch=5), "global batch 1536 does not split into dp=32 x micro_batch=5"),
    (Strategy(dp=16, tp=8, pp=8, zero=3), "zero=3 with pp=8"),
    (Strategy(dp=16, tp=8, pp=8, recompute="some"), "recompute='some'"),
    (Strategy(dp=16, tp=8, pp=8, virtual=2), "virtual=2 with schedule='1f1b'"),
])
def test_bad_layouts_are_refused_naming_the_values(layout, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        check_strategy(GPT3_175B, 1024, 1536, layout)


def test_a_device_sized_for_seed_003s_10_ms_of_compute_against_8_of_communication():
    from pipelib.planner.book import profile_for
    from pipelib.planner.spec import ModelSpec

    tiny = ModelSpec("tiny GPT", n_layer=4, hidden=64, n_head=4, vocab=256, seq_len=64)
    toy = Machine(PROFILES["toy-gpu"], gpus_per_node=4, inter_node=PROFILES["toy-gpu"].link)
    lay = Strategy(dp=4, micro_batch=2, zero=0, flash=False, sequence_parallel=False)
    prof = profile_for(tiny, toy, lay, 8, compute=0.010, dp=0.008)
    c = evaluate(tiny, Machine(prof, 4, prof.link), 4, 8, lay, accounting="book")
    assert c.time["compute"] == pytest.approx(0.010) and c.time["dp"] == pytest.approx(0.008)
    assert c.time["optimizer"] < 1e-6 and prof.link.alpha == toy.device.link.alpha
    with pytest.raises(ValueError, match="within the ring's latency"):
        profile_for(tiny, toy, lay, 8, compute=0.010, dp=1e-6)
    with pytest.raises(ValueError, match="sizes a DDP step"):
        profile_for(tiny, toy, replace(lay, dp=2, tp=2), 8, compute=0.010, dp=0.008)
