"""Pure: chapter 09's plans, their errors before any engine works, and the byte formulas."""
import pytest

from pipelib.comm.alphabeta import expected_bytes
from pipelib.model import GPT, GPTConfig
from pipelib.tensor_parallel.formulas import (
    tp_activation_bytes,
    tp_all_reduce_bytes,
    tp_layer_bytes,
    tp_milestone,
    tp_step_counts,
)
from pipelib.tensor_parallel.plan import STYLES, check_sequence_divisible, gpt_tp_plan, validate_plan

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)


def test_gpt_plan_matches_every_module_and_uses_known_styles():
    model = GPT(CFG)
    for vocab in (True, False):
        for sp in (True, False):
            plan = gpt_tp_plan(vocab=vocab, sequence_parallel=sp)
            assert set(plan.values()) <= set(STYLES)
            matched = validate_plan(model, plan, 4)
            assert matched["blocks.*.attn.c_attn"] == ["blocks.0.attn.c_attn", "blocks.1.attn.c_attn"]
            assert ("blocks.*.ln_1" in plan) == sp and ("embed.wte" in plan) == vocab


@pytest.mark.parametrize("cfg, t, plan, words", [
    (GPTConfig(vocab_size=64, n_head=6, n_embd=48), 4, gpt_tp_plan(), ["n_head=6", "t=4", "[1, 2, 3, 6]"]),
    (GPTConfig(vocab_size=65, n_head=4, n_embd=32), 2, gpt_tp_plan(), ["vocab_size=65", "t=2", "pad"]),
    (GPTConfig(vocab_size=64, n_head=2, n_embd=34), 4, {"blocks.*.attn.c_attn": "colwise_qkv"},
     ["out_features / 3=34", "t=4"]),
    (GPTConfig(vocab_size=64, n_head=2, n_embd=34), 4, {"blocks.*.attn.c_proj": "rowwise"},
     ["in_features=34", "t=4"]),
])
def test_sizes_not_divisible_by_t_name_the_values(cfg, t, plan, words):
    with pytest.raises(ValueError) as e:
        validate_plan(GPT(cfg), plan, t)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_plan_naming_a_missing_module_or_style_is_refused():
    with pytest.raises(ValueError, match=r"'blocks\.\*\.atn\.c_attn' matches no module of GPT.*c_attn"):
        validate_plan(GPT(CFG), {"blocks.*.atn.c_attn": "colwise"}, 2)
    with pytest.raises(ValueError, match="'diagonal'} are unknown"):
        validate_plan(GPT(CFG), {"blocks.*.attn.c_attn": "diagonal"}, 2)
    with pytest.raises(ValueError, match=r"splits a Linear; blocks\.0\.ln_1 is a LayerNorm"):
        validate_plan(GPT(CFG), {"blocks.*.ln_1": "colwise"}, 2)
    with pytest.raises(ValueError, match="t=0"):
        validate_plan(GPT(CFG), gpt_tp_plan(), 0)
    with pytest.raises(ValueError, match="sequence length 15 is not divisible by t=2"):
        check_sequence_divisible(15, 2)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_all_reduce_bytes_equal_the_ring_collective(t):
    for width in (2, 4, 8):
        numel = 2 * 16 * 32
        assert tp_all_reduce_bytes(numel, t, width) == expected_bytes("all_reduce", (numel,), width, t, 0)
        assert tp_layer_bytes(2, 16, 32, t, width) == 2 * 2 * 16 * 32 * (t - 1) // t * width
        rs = expected_bytes("reduce_scatter", (16, 2, 32), width, t, 0)
        ag = expected_bytes("all_gather", (16 // t, 2, 32), width, t, 0)
        assert rs + ag == tp_layer_bytes(2, 16, 32, t, width)  # sequence parallel: same bytes


def test_step_counts_and_sequence_parallel_same_bytes():
    tp = tp_step_counts(2, 2, 16, 32, 2, 4)
    sp = tp_step_counts(2, 2, 16, 32, 2, 4, sequence_parallel=True)
    assert (tp.forward_calls, tp.backward_calls) == (2 * 2 + 1 + 2, 2 * 2 + 1)
    assert (sp.forward_calls, sp.backward_calls) == (4 * 2 + 2 + 2, 4 * 2 + 2)
    assert sp.bytes == tp.bytes
    blocks = tp_step_counts(12, 8, 512, 512, 2, 2, vocab=False)
    assert blocks.forward_calls == 24 and blocks.forward_bytes == 96 * 2**20


def test_seed_003_milestone():
    m = tp_milestone()
    assert m.calls == 24 and m.bytes_per_call == 4 * 2**20 and m.forward_bytes == 96 * 2**20
    assert 0.05 < m.share < 0.07  # "about 6% of a 50 ms forward over PCIe"


def test_sequence_parallel_divides_activation_memory_by_t():
    b, s, h, a = 8, 512, 512, 8
    full = tp_activation_bytes(b, s, h, a)
    assert full == s * b * h * (34 + 5 * a * s / h)
    for t in (2, 4, 8):
        tp = tp_activation_bytes(b, s, h, a, t)
        sp = tp_activation_bytes(b, s, h, a, t, sequence_parallel=True)
        assert sp == full / t < tp < full
        assert tp - sp == pytest.approx(10 * s * b * h * (1 - 1 / t))


def test_layer_activation_count_at_t1_is_the_memory_modules():
    from pipelib.memory import gpt_layer_activation_bytes
    from pipelib.tensor_parallel.formulas import tp_layer_activation_bytes

    for b, s, h, a in ((2, 16, 32, 4), (3, 8, 64, 8)):
        cfg = GPTConfig(vocab_size=64, block_size=s, n_layer=1, n_head=a, n_embd=h)
        assert tp_layer_activation_bytes(b, s, h, a) == gpt_layer_activation_bytes(cfg, b, s)
        assert (tp_layer_activation_bytes(b, s, h, a, 2, sequence_parallel=True)
                < tp_layer_activation_bytes(b, s, h, a, 2) < tp_layer_activation_bytes(b, s, h, a))


# --------------------------------------------------------------------------- the style registry
def test_every_style_has_every_field():
    import inspect

    from pipelib.tensor_parallel.styles import ParallelStyle, style_of

    assert len({s.order for s in STYLES.values()}) == len(STYLES)  # one apply order
    for name, style in STYLES.items():
        assert isinstance(style, ParallelStyle) and style.name == name == str(style)
        assert style_of(name) is style and style_of(style) is style
        assert type(style).apply is not ParallelStyle.apply  # each one splits its module
        assert list(inspect.signature(style.validate).parameters) == ["module", "name", "t", "where"]
        assert isinstance(style.marks_sequence_parallel, bool)
        assert repr(style) == f"{type(style).__name__}()"  # prints as torchtitan's plans do
    assert [n for n, s in STYLES.items() if s.marks_sequence_parallel] == ["sequence"]
    with pytest.raises(ValueError, match=r"unknown tensor-parallel style 'diagonal'; use one of \('colwise'"):
        style_of("diagonal")


def test_a_plan_of_style_objects_is_the_plan_of_their_names():
    from pipelib.tensor_parallel.plan import is_sequence_parallel
    from pipelib.tensor_parallel.styles import ColwiseParallel, RowwiseParallel

    model = GPT(CFG)
    for sp in (False, True):
        plan = gpt_tp_plan(sequence_parallel=sp)
        objects = {k: STYLES[v] for k, v in plan.items()}
        assert validate_plan(model, objects, 2) == validate_plan(model, plan, 2)
        assert is_sequence_parallel(objects) == is_sequence_parallel(plan) == sp
    mixed = {"blocks.*.mlp.c_fc": ColwiseParallel(), "blocks.*.mlp.c_proj": "rowwise"}
    assert validate_plan(model, mixed, 4)["blocks.*.mlp.c_proj"] == ["blocks.0.mlp.c_proj", "blocks.1.mlp.c_proj"]
    with pytest.raises(ValueError, match=r"plan\['blocks.\*.ln_1'\] = 'rowwise' on blocks.0.ln_1 \(LayerNorm\): "
                                         r"this style splits a Linear"):
        validate_plan(model, {"blocks.*.ln_1": RowwiseParallel()}, 2)


def test_no_style_name_is_compared_outside_the_registry():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names = set(STYLES)

    def tests(source):  # a name compared (==, !=, in a tuple) or mapped (a dict key)
        for node in ast.walk(ast.parse(source)):
            parts = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            elts = [e for p in parts for e in (p.elts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) else [p])]
            keys = node.keys if isinstance(node, ast.Dict) else []
            if any(isinstance(e, ast.Constant) and e.value in names for e in [*elts, *keys]):
                yield node.lineno

    assert list(tests('if s == "rowwise" or s in ("heads",):\n    x = {"sequence": 1}\n')) == [1, 1, 2]
    found = [f"{p.relative_to(root)}:{line}" for p in sorted((root / "pipelib").rglob("*.py"))
             if p.name != "styles.py" or p.parent.name != "tensor_parallel" for line in tests(p.read_text())]
    assert not found, f"style names compared or mapped outside tensor_parallel/styles.py: {found}"
