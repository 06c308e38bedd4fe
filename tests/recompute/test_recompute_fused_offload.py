"""Chapter 14's fused-attention case, Chen's best k under three counts, and the offload trade."""
from dataclasses import replace

import pytest
import torch

from pipelib.costmodel import LINKS, PROFILES
from pipelib.memory import STATS_BYTES, gpt_layer_activation_bytes
from pipelib.model import Block, GPTConfig
from pipelib.recompute.formulas import GPT3_175B, Shape, fused_layer_bytes, layer_bytes, selective_headline
from pipelib.recompute.offload import offload_vs_recompute
from pipelib.recompute.registry import best_k, predict_policy
from pipelib.train import SavedActivations


def test_fused_count_is_what_sdpa_keeps_on_cpu():
    cfg = GPTConfig(n_layer=1, n_head=4, n_embd=64, block_size=32, flash=True)
    block, x = Block(cfg), torch.randn(2, 32, 64, requires_grad=True)
    with SavedActivations(block) as meter:
        block(x)
    shape = Shape(n_layer=1, n_head=4, n_embd=64, block_size=32, fused_attention=True)
    assert meter.nbytes == fused_layer_bytes(shape, 2, 32, itemsize=4) == layer_bytes(shape, 2, 32, 4)


def test_fused_16_bit_is_korthikantis_34_plus_the_log_sum_exp():
    cfg = replace(GPT3_175B, dropout=0.1, fused_attention=True)
    s, b, h, a = 2048, 1, cfg.n_embd, cfg.n_head
    want = 34 * s * b * h + 4 * a * s * b + 2 * 2 * b * s * STATS_BYTES
    assert fused_layer_bytes(cfg, b, s, 2, 1) == want
    unfused = gpt_layer_activation_bytes(replace(cfg, fused_attention=False), b, s, 2, 1)
    assert fused_layer_bytes(cfg, b, s, 2, 1) < unfused


def test_selective_headline_holds_for_unfused_attention_only():
    plain, fused = selective_headline(GPT3_175B), selective_headline(GPT3_175B, fused_attention=True)
    assert 0.70 < plain["memory_saved"] < 0.71
    assert 0 < fused["memory_saved"] < 0.001  # only the log-sum-exp is left to drop
    assert fused["extra_flops"] == plain["extra_flops"]
    assert plain["flops_over_step"] == pytest.approx(plain["flops_over_forward"] / 3)
    assert plain["paper_overhead"] == pytest.approx(2048 / (6 * 12288))


def test_best_k_for_gpt3_depends_on_what_a_block_keeps():
    s, I = 2048, 2 * 2048 * GPT3_175B.n_embd
    cases = {"no dropout": (GPT3_175B, None), "dropout, byte masks": (replace(GPT3_175B, dropout=0.1), 1),
             "fused": (replace(GPT3_175B, dropout=0.1, fused_attention=True), 1)}
    ratio = {k: layer_bytes(c, 1, s, 2, m) / I for k, (c, m) in cases.items()}
    ks = {k: best_k(c, 1, s, 2, m) for k, (c, m) in cases.items()}
    assert round(ratio["no dropout"]) == 32 and round(ratio["dropout, byte masks"]) == 57
    assert 16 < ratio["fused"] < 18
    assert ks == {"no dropout": 2, "dropout, byte masks": 1, "fused": 2}
    for k, (c, _) in cases.items():  # k = 1 wins exactly when n < 2 L / I
        assert (ks[k] == 1) == (c.n_layer < 2 * ratio[k])


def test_predict_policy_refuses_the_cpu_flash_model_but_takes_a_fused_shape():
    with pytest.raises(ValueError, match="flash"):
        predict_policy(GPTConfig(flash=True), 1, 64, "full")
    shape = replace(GPT3_175B, fused_attention=True)
    full = predict_policy(shape, 1, 2048, "full", itemsize=2)
    none = predict_policy(shape, 1, 2048, "none", itemsize=2)
    assert full.peak_bytes < none.peak_bytes


@pytest.mark.parametrize("mfu", [1.0, 0.5, 0.3])
@pytest.mark.parametrize("beta", [LINKS["pcie5"].beta, 450e9, 5e9])
@pytest.mark.parametrize("fused", [False, True])
def test_offload_wins_exactly_above_the_break_even_intensity(mfu, beta, fused):
    cfg = replace(GPT3_175B, dropout=0.1, fused_attention=fused)
    r = offload_vs_recompute(cfg, 1, 2048, PROFILES["h100"], beta, mfu=mfu)
    assert r.offload_wins == (r.flops_per_byte > r.break_even)
    assert r.recompute_seconds == pytest.approx(r.forward_flops / (PROFILES["h100"].flops * mfu))
    assert r.copy_seconds == pytest.approx(r.layer_bytes / beta)
    if r.copy_seconds <= r.forward_seconds:
        assert r.offload_seconds == 0.0  # hidden under the forward and the backward


def test_offload_refuses_bad_inputs():
    with pytest.raises(ValueError, match="mfu"):
        offload_vs_recompute(GPT3_175B, 1, 2048, PROFILES["h100"], 50e9, mfu=0)
    with pytest.raises(ValueError, match="host_beta"):
        offload_vs_recompute(GPT3_175B, 1, 2048, PROFILES["h100"], 0)


def test_offload_charges_one_blocks_forward_as_measured():
    # F is one block's forward FLOPs: torch's own count of a block's matmuls, and GPT-3's
    # 24 b s h^2 + 4 b s^2 h (Korthikanti et al.'s count).
    from torch.utils.flop_counter import FlopCounterMode

    cfg, b, s = GPTConfig(n_layer=3, n_head=4, n_embd=64, block_size=32), 2, 32
    block, x = Block(cfg), torch.randn(b, s, cfg.n_embd)
    with FlopCounterMode(display=False) as counter:
        block(x)
    assert offload_vs_recompute(cfg, b, s, PROFILES["h100"], 50e9).forward_flops == counter.get_total_flops()
    h = GPT3_175B.n_embd
    assert offload_vs_recompute(GPT3_175B, 1, 2048, PROFILES["h100"], 50e9).forward_flops == (
        24 * 2048 * h * h + 4 * 2048 * 2048 * h)


def test_selective_headlines_step_is_the_memory_modules_and_the_measured_one():
    # flops_over_step against a training step counted apart from the headline: pipelib.memory's
    # forward + backward, which a measured step of the tiny GPT matches op by op.
    from torch.utils.flop_counter import FlopCounterMode

    from pipelib.memory import gpt_train_flops
    from pipelib.model import GPT

    cfg, b, s = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32), 2, 32
    torch.manual_seed(0)
    model, idx = GPT(cfg), torch.randint(cfg.vocab_size, (b, s))
    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    assert counter.get_total_flops() == gpt_train_flops(cfg, b, s)
    for shape, seq in ((cfg, s), (GPT3_175B, 2048)):
        head = selective_headline(shape, 1, seq)
        layer_step = gpt_train_flops(replace(shape, n_layer=1, vocab_size=0), 1, seq)
        assert head["flops_over_step"] == head["extra_flops"] / layer_step
