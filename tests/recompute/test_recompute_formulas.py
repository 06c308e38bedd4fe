"""The formulas of chapter 14: Korthikanti et al.'s selective headline at GPT-3 scale, the
16-bit count against the tiny GPT's per-op count, Chen's best k; and the selective trend
measured on the tiny GPT (the saving grows with a s / h)."""
import pytest

from pipelib.memory import gpt_layer_activation_bytes, megatron_layer_activation_bytes
from pipelib.model import GPTConfig
from pipelib.recompute.formulas import GPT3_175B, core_activation_bytes, selective_headline, selective_layer_bytes
from pipelib.recompute.registry import best_k, predict_policy
from pipelib.recompute.measure import measure_policy


def test_gpt3_headline_70_percent_less_memory_for_under_3_percent_more_flops():
    h = selective_headline(GPT3_175B)
    assert h["five_as_over_h"] == 80  # 5 * 96 * 2048 / 12288
    assert h["memory_saved"] == pytest.approx(80 / 114)  # 34 kept of 34 + 80
    assert 0.69 < h["memory_saved"] < 0.71
    assert h["flops_over_forward"] == pytest.approx(2048 / (6 * 12288 + 2048))  # 2.7 %
    assert h["flops_over_step"] == pytest.approx(h["flops_over_forward"] / 3)


def test_tiny_gpt_in_16_bit_with_byte_masks_is_megatrons_count_plus_layernorm_stats():
    cfg = GPTConfig(n_layer=2, dropout=0.1)
    b, s = 4, 64
    ours = gpt_layer_activation_bytes(cfg, b, s, itemsize=2, mask_bytes=1)
    assert ours == megatron_layer_activation_bytes(cfg, b, s) + 2 * 2 * b * s * 4
    # selective, in the same units: the core's 5 a s^2 b go, q, k, v were counted already
    sel = selective_layer_bytes(cfg, b, s, itemsize=2, mask_bytes=1)
    assert sel == 34 * s * b * cfg.n_embd + 2 * 2 * b * s * 4


def test_core_bytes_are_what_selective_drops():
    cfg = GPTConfig()
    full = gpt_layer_activation_bytes(cfg, 2, 64)
    assert full - selective_layer_bytes(cfg, 2, 64) == core_activation_bytes(cfg, 2, 64) - 4 * 3 * 2 * 64 * 64


def test_chens_k_for_layers_whose_input_is_small_is_one():
    # A block keeps L >> I (20x for the tiny GPT): short segments win; sqrt(n) would need L ~ I.
    cfg = GPTConfig(n_layer=16)
    assert best_k(cfg, 4, 64) == 1
    peaks = [predict_policy(cfg, 4, 64, "every_k", k).peak_bytes for k in (1, 4, 16)]
    assert peaks == sorted(peaks)


def test_selective_saving_grows_with_sequence_as_the_formula_says():
    """Measured on the tiny GPT: the share selective saves grows with s (5 a s / h grows)."""
    saved = []
    for s in (16, 32, 64):
        cfg = GPTConfig(n_layer=2, block_size=s)
        none, sel = measure_policy(cfg, "none", batch=2), measure_policy(cfg, "selective", batch=2)
        layer = gpt_layer_activation_bytes(cfg, 2, s)
        pred = 1 - selective_layer_bytes(cfg, 2, s) / layer
        assert (none.kept_bytes - sel.kept_bytes) == 2 * (layer - selective_layer_bytes(cfg, 2, s))
        saved.append(pred)
    assert saved == sorted(saved) and saved[0] < saved[-1]
