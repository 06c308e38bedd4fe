"""pipelib.memory against what torch allocates, saves for backward and computes."""
from math import prod
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from pipelib import memory
from pipelib.model import GPT, MLP, GPTConfig, MLPConfig
from pipelib.train import SavedActivations

GPTS = [
    GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=8),
    GPTConfig(vocab_size=65, block_size=64, n_layer=3, n_head=4, n_embd=64, bias=False),
    GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=3, n_embd=48, dropout=0.1),
    GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, flash=True),
]
MLPS = [MLPConfig(), MLPConfig(in_features=10, hidden=32, out_features=7, num_layers=1),
        MLPConfig(in_features=5, hidden=16, out_features=2, num_layers=6, bias=False)]
SIZES = [(3, 16, 8), (4, 48, 64), (2, 64, 96)]  # (batch, seq, width)


pytestmark = pytest.mark.usefixtures("one_thread")


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def build(cfg):
    return GPT(cfg) if isinstance(cfg, GPTConfig) else MLP(cfg)


def one_step(model, cfg, optimizer):
    if isinstance(cfg, GPTConfig):
        idx = torch.randint(0, cfg.vocab_size, (2, 8))
        loss = model(idx, idx)[1]
    else:
        loss = F.cross_entropy(model(torch.randn(4, cfg.in_features)), torch.tensor([0, 1, 0, 1]))
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("cfg", GPTS + MLPS, ids=str)
def test_param_shapes_and_counts_match_the_model(cfg):
    model = build(cfg)
    assert memory.param_shapes(cfg) == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert memory.num_params(cfg) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("cfg", GPTS[:2] + MLPS[:2], ids=str)
@pytest.mark.parametrize("opt,kw", [("adam", {}), ("adamw", {}), ("sgd", {"momentum": 0.9}),
                                    ("sgd", {})])
def test_model_state_bytes_equal_torch_allocations(cfg, opt, kw):
    model = build(cfg)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[opt]
    optimizer = cls(model.parameters(), lr=1e-3, **kw)
    one_step(model, cfg, optimizer)
    want = memory.model_state_bytes(cfg, opt, momentum=kw.get("momentum", 0.0))
    assert want.params == nbytes(model.parameters())
    assert want.grads == nbytes(p.grad for p in model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert want.optimizer == nbytes(state)


def test_float64_model_state_keeps_fp32_step_counters():
    cfg = GPTS[0]
    model = GPT(cfg).double()
    optimizer = torch.optim.Adam(model.parameters())
    one_step(model, cfg, optimizer)
    want = memory.model_state_bytes(cfg, "adam", itemsize=8)
    assert want.params == nbytes(model.parameters())
    assert want.optimizer == nbytes(t for s in optimizer.state.values() for t in s.values())


def measured_activations(model, cfg, B, T):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    with SavedActivations(model) as meter:
        model(idx, targets)
    return meter.nbytes


@pytest.mark.parametrize("B,T,C", SIZES)
@pytest.mark.parametrize("variant", ["explicit", "no-bias", "dropout", "flash"])
def test_activation_estimate_within_10_percent(B, T, C, variant):
    extra = {"no-bias": {"bias": False}, "dropout": {"dropout": 0.1}, "flash": {"flash": True}}
    cfg = GPTConfig(vocab_size=37, block_size=64, n_layer=2, n_head=4 if C % 4 == 0 else 2,
                    n_embd=C, **extra.get(variant, {}))
    measured = measured_activations(GPT(cfg), cfg, B, T)
    predicted = memory.gpt_activation_bytes(cfg, B, T)
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)


def test_activation_estimate_is_exact_for_the_default_model():
    """Derived op by op for this implementation, so on torch 2.13 it is exact to the byte."""
    for cfg, (B, T) in zip(GPTS, [(3, 16), (4, 48), (2, 32), (5, 64)]):
        assert memory.gpt_activation_bytes(cfg, B, T) == measured_activations(GPT(cfg), cfg, B, T)


@pytest.mark.parametrize("cfg", MLPS, ids=str)
def test_mlp_activations_are_exact(cfg):
    model = MLP(cfg)
    x, y = torch.randn(32, cfg.in_features), torch.randint(0, cfg.out_features, (32,))
    with SavedActivations(model) as meter:
        F.cross_entropy(model(x), y)
    assert meter.nbytes == memory.mlp_activation_bytes(cfg, 32)


def test_megatron_closed_form_is_our_count_in_16_bit_with_byte_masks():
    """Korthikanti et al. 2022: 34 sbh + 5 a s^2 b = ours (fp16, dropout, bool masks) - LN stats."""
    for b, s, h, a in [(1, 2048, 12288, 96), (4, 128, 64, 4), (2, 17, 30, 3)]:
        cfg = SimpleNamespace(n_embd=h, n_head=a, dropout=0.1)
        ours = memory.gpt_layer_activation_bytes(cfg, b, s, itemsize=2, mask_bytes=1)
        ln_stats = 2 * 2 * b * s * memory.STATS_BYTES
        assert ours - ln_stats == memory.megatron_layer_activation_bytes(cfg, b, s)


def train_flops(fn):
    with FlopCounterMode(display=False) as counter:
        fn().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("cfg", [c for c in GPTS if not c.flash], ids=str)
@pytest.mark.parametrize("B,T", [(2, 16), (3, 11)])
def test_gpt_flops_match_flop_counter(cfg, B, T):
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    counted = train_flops(lambda: model(idx, idx)[1])
    predicted = memory.gpt_train_flops(cfg, B, T)
    assert abs(predicted - counted) <= 0.05 * counted, (predicted, counted)
    assert predicted == counted  # every matmul accounted for


@pytest.mark.parametrize("cfg", MLPS, ids=str)
def test_mlp_flops_match_flop_counter(cfg):
    model = MLP(cfg)
    x, y = torch.randn(16, cfg.in_features), torch.randint(0, cfg.out_features, (16,))
    assert train_flops(lambda: F.cross_entropy(model(x), y)) == memory.mlp_train_flops(cfg, 16)


def test_six_n_rule_holds_when_width_dominates_and_not_for_long_sequences():
    wide = SimpleNamespace(vocab_size=64, block_size=64, n_layer=4, n_head=8, n_embd=512)
    exact, rule = memory.gpt_train_flops(wide, 8, 64), memory.flops_6n(wide, 8 * 64)
    assert abs(rule - exact) < 0.05 * exact
    long = SimpleNamespace(vocab_size=64, block_size=4096, n_layer=4, n_head=8, n_embd=128)
    assert memory.flops_6n(long, 4096) < 0.5 * memory.gpt_train_flops(long, 1, 4096)


def test_zero_sixteen_bytes_per_parameter():
    state = memory.mixed_precision_adam_bytes(7_500_000_000)
    assert (state.params, state.grads, state.optimizer) == (15e9, 15e9, 90e9)
    assert state.total == 120e9  # ZeRO paper: 7.5B parameters need 120 GB


def test_duck_typed_configs_and_errors():
    ns = SimpleNamespace(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=4)
    shapes = memory.gpt_param_shapes(ns)
    assert memory.num_params(ns) == sum(prod(s) for s in shapes.values())
    assert memory.num_params(ns, non_embedding=True) == memory.num_params(ns) - 10 * 4 - 8 * 4
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        memory.optimizer_state_bytes(10, optimizer="lion")
    with pytest.raises(TypeError, match="n_layer"):
        memory.param_shapes(object())
