"""Every recomputation policy leaves the loss and every gradient bitwise equal to keeping
everything, keeps and peaks at exactly the bytes the formulas predict, and adds exactly the
predicted forward FLOPs (issue 14, chapter 14)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from pipelib.memory import gpt_activation_bytes
from pipelib.model import GPT, GPTConfig
from pipelib.recompute.registry import predict_policy
from pipelib.batches import global_batch
from pipelib.recompute.measure import bitwise_equal, measure_policy
from pipelib.recompute.policies import apply_recompute, recompute_policy
from pipelib.runtime.memtrack import SimulatedOutOfMemoryError
from pipelib.train import SavedActivations

pytestmark = pytest.mark.usefixtures("one_thread")

B = 4
CASES = [("full", None), ("every_k", 1), ("every_k", 2), ("every_k", 3), ("every_k", 4),
         ("every_k", 9), ("selective", None)]
CONFIGS = {"p=0": GPTConfig(n_layer=4), "dropout": GPTConfig(n_layer=4, dropout=0.1),
           "flash-free T=32": GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=32)}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def runs(request):
    cfg = CONFIGS[request.param]
    ref = measure_policy(cfg, "none", batch=B)
    return cfg, ref, {case: measure_policy(cfg, *case, batch=B) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_loss_and_gradients_bitwise_equal(runs, case):
    cfg, ref, got = runs
    r = got[case]
    assert torch.equal(r.loss, ref.loss)
    assert bitwise_equal(r.grads, ref.grads), f"{case}: gradients differ from no recomputation"


@pytest.mark.parametrize("case", [("none", None), *CASES], ids=lambda c: f"{c[0]}-{c[1]}")
def test_kept_and_peak_bytes_equal_the_formula(runs, case):
    cfg, ref, got = runs
    r = ref if case[0] == "none" else got[case]
    pred = predict_policy(cfg, B, cfg.block_size, *case)
    assert r.kept_bytes == pred.kept_bytes
    assert r.peak_bytes == pred.peak_bytes
    assert abs(r.peak_bytes - pred.peak_bytes) <= 0.10 * pred.peak_bytes  # the bar


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_extra_forward_flops_counted_exactly(runs, case):
    cfg, ref, got = runs
    r = got[case]
    assert r.forward_flops == ref.forward_flops  # the forward itself is unchanged
    assert r.flops - ref.flops == predict_policy(cfg, B, cfg.block_size, *case).extra_flops


def test_every_policy_keeps_less_than_none_and_full_keeps_least_at_the_end(runs):
    cfg, ref, got = runs
    assert all(r.kept_bytes < ref.kept_bytes for r in got.values())
    assert all(r.peak_bytes < ref.peak_bytes for r in got.values())
    assert got[("full", None)].kept_bytes <= min(r.kept_bytes for c, r in got.items()
                                                 if c[0] != "every_k")


def test_op_clock_counts_what_torchs_flop_counter_counts():
    """OpClock (torch's formulas, op by op) against FlopCounterMode: the step without
    recomputation, and the rerun, which is one forward of the blocks (FlopCounterMode's module
    tracker refuses the autograd.grad inside a rerun, hence OpClock)."""
    cfg = GPTConfig(n_layer=2)
    model = GPT(cfg)
    idx, targets = global_batch(cfg, 2, 0, 0, seq_len=cfg.block_size)
    with FlopCounterMode(display=False) as fc:
        model(idx, targets)[1].backward()
    none, full = measure_policy(cfg, "none", batch=2), measure_policy(cfg, "full", batch=2)
    assert none.flops == fc.get_total_flops()
    x = model.embed(idx).detach()
    with torch.no_grad(), FlopCounterMode(display=False) as blocks:
        for block in model.blocks:
            x = block(x)
    assert full.flops - none.flops == blocks.get_total_flops() > 0


def test_the_meter_of_chapter_03_sees_only_what_is_kept():
    """train.SavedActivations (hooks entered before ours) counts the kept inputs only."""
    cfg = GPTConfig(n_layer=3)
    model = apply_recompute(GPT(cfg), "full")
    idx, targets = global_batch(cfg, B, 0, 0, seq_len=cfg.block_size)
    with SavedActivations(model) as meter:
        model(idx, targets)
    assert meter.nbytes == predict_policy(cfg, B, cfg.block_size, "full").kept_bytes
    assert meter.nbytes < gpt_activation_bytes(cfg, B, cfg.block_size) / 5


def test_fp64_also_bitwise():
    cfg = GPTConfig(n_layer=2, dropout=0.1)
    ref = measure_policy(cfg, "none", batch=2, dtype=torch.float64)
    for case in [("full", None), ("every_k", 2), ("selective", None)]:
        assert bitwise_equal(measure_policy(cfg, *case, batch=2, dtype=torch.float64).grads, ref.grads)


def test_flash_attention_is_bitwise_too_but_not_predicted():
    cfg = GPTConfig(n_layer=2, flash=True)
    ref = measure_policy(cfg, "none", batch=2)
    for case in [("full", None), ("every_k", 2), ("selective", None)]:
        assert bitwise_equal(measure_policy(cfg, *case, batch=2).grads, ref.grads)
    with pytest.raises(ValueError, match="flash=True"):
        predict_policy(cfg, 2, 64, "full")


def test_none_undoes_and_names_and_eval_are_untouched():
    cfg = GPTConfig(n_layer=4)
    model = GPT(cfg)
    names = list(model.state_dict())
    assert recompute_policy(apply_recompute(model, "every_k", 2)) == "every_k:2"
    assert list(model.state_dict()) == names
    idx, _ = global_batch(cfg, 2, 0, 0, seq_len=cfg.block_size)
    with torch.no_grad():  # no graph: the policy steps aside
        out = model(idx)[0]
    assert recompute_policy(apply_recompute(model, "selective")) == "selective"
    assert recompute_policy(apply_recompute(model, "none")) == "none"
    assert not any("forward" in m.__dict__ or "core" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(idx)[0], out)


def test_only_recomputation_fits_the_simulated_device():
    cfg = GPTConfig(n_layer=4)
    capacity = 4 * 2**20
    with pytest.raises(SimulatedOutOfMemoryError, match="simulated out of memory"):
        measure_policy(cfg, "none", batch=B, capacity=capacity)
    r = measure_policy(cfg, "full", batch=B, capacity=capacity)
    assert r.peak_bytes < capacity


@pytest.mark.parametrize("policy, k, match", [
    ("sqrt", None, r"unknown recomputation policy 'sqrt'; choose one of"),
    ("every_k", 0, r"k=0; pass an integer >= 1"),
    ("every_k", -2, r"k=-2; pass an integer >= 1"),
    ("every_k", 1.5, r"k=1.5; pass an integer >= 1"),
    ("every_k", True, r"k=True; pass an integer >= 1"),
    ("full", 2, r"policy 'full' takes no k \(got k=2\)"),
    ("selective", 1, r"policy 'selective' takes no k \(got k=1\)"),
])
def test_bad_policy_or_k_is_a_clear_error(policy, k, match):
    model = GPT(GPTConfig(n_layer=2))
    with pytest.raises(ValueError, match=match):
        apply_recompute(model, policy, k)
    assert recompute_policy(model) == "none"  # nothing was changed


@pytest.mark.parametrize("policy, k, match", [
    ("sqrt", None, r"unknown recomputation policy 'sqrt'"),
    ("every_k", 0, r"policy 'every_k': k=0; pass an integer >= 1 \(blocks per"),
    ("every_k", None, r"k=None; pass an integer >= 1"),
])
def test_the_formulas_refuse_the_same(policy, k, match):
    with pytest.raises(ValueError, match=match):
        predict_policy(GPTConfig(), 1, 8, policy, k)


def test_a_module_without_blocks_is_refused():
    with pytest.raises(ValueError, match="holds no pipelib.model.Block"):
        apply_recompute(torch.nn.Linear(2, 2), "full")


@pytest.mark.parametrize("policy", ["full", "every_k", "selective"])
def test_recompute_runs_under_torchs_flop_counter(policy):
    """A simulated device times ops with torch's FlopCounterMode, whose module tracker cannot
    watch a leaf during autograd.grad: the rerun must not hand a module a leaf (it crashed a
    1F1B stage timed from counted FLOPs). The counter sees the rerun: one more forward of the
    blocks for full and every_k, the core's two matmuls per block for selective."""
    cfg = GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16)
    idx, targets = global_batch(cfg, 2, 0, 0, seq_len=16)
    counted = {}
    for p in ("none", policy):
        model = apply_recompute(GPT(cfg, seed=0), p, 2 if p == "every_k" else None)
        with FlopCounterMode(display=False) as counter:
            _, loss = model(idx, targets)
            loss.backward()
        counted[p] = counter.get_total_flops()
    extra = predict_policy(cfg, 2, 16, policy, 2 if policy == "every_k" else None).extra_flops
    assert counted[policy] - counted["none"] == extra > 0


# --------------------------------------------------------------------------- the policy registry
def test_every_policy_has_every_field():
    from pipelib.recompute.formulas import PolicyCost
    from pipelib.recompute.registry import POLICIES, REGISTRY, PolicyInfo, policy_info

    cfg = GPTConfig(n_layer=4, n_head=2, n_embd=32, block_size=16)
    assert POLICIES == tuple(REGISTRY) == ("none", "full", "every_k", "selective")
    for name, info in REGISTRY.items():
        assert isinstance(info, PolicyInfo) and info.name == name and policy_info(name) is info
        for fn, module in ((info.apply, "policies"), (info.twin, "against_torch")):
            assert callable(fn) and fn.__module__ == f"pipelib.recompute.{module}"
        k = info.segment_length(None, 4)
        assert k == (info.fixed_k if not info.chooses_k else 2)
        cost = info.cost(cfg, 2, 16, 2)
        assert isinstance(cost, PolicyCost) and cost.policy == name and cost == predict_policy(cfg, 2, 16, name, 2)
        assert cost.peak_bytes >= cost.kept_bytes > 0 and (cost.extra_flops == 0) == info.keeps_all
        model = GPT(cfg)
        apply_recompute(model, name, 2 if info.chooses_k else None)
        assert recompute_policy(model) == (name if k is None else f"{name}:{2 if info.chooses_k else k}")


def test_no_policy_name_is_compared_outside_the_registry():
    import ast
    from pathlib import Path

    from pipelib.recompute.registry import POLICIES

    root = Path(__file__).resolve().parents[2]
    mine = {"policies.py", "formulas.py", "against_torch.py", "measure.py", "registry.py", "pipeline.py"}

    def tests(source):  # a name compared (==, !=, in a tuple) or mapped (a dict key)
        for node in ast.walk(ast.parse(source)):
            parts = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            elts = [e for p in parts for e in (p.elts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) else [p])]
            keys = node.keys if isinstance(node, ast.Dict) else []
            if any(isinstance(e, ast.Constant) and e.value in POLICIES for e in [*elts, *keys]):
                yield node.lineno

    assert list(tests('if p == "full" or p in ("selective",):\n    x = {"none": 1}\n')) == [1, 1, 2]
    found = [f"{p.name}:{line}" for p in sorted((root / "pipelib" / "recompute").glob("*.py"))
             if p.name in mine - {"registry.py"} for line in tests(p.read_text())]
    assert not found, f"policy names compared or mapped outside recompute/registry.py: {found}"
