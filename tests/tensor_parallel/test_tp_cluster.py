"""Chapter 09 on 4 simulated GPUs: the TP and sequence-parallel GPT equal to one process (2 and 4
ranks, fp32 and fp64), bytes on the trace equal to the formulas per layer and per step, the
layers alone, and the same blocks split by torch's DTensor."""
import pytest
import torch

from pipelib.model import GPTConfig
from pipelib.results import check_against_reference
from pipelib.tensor_parallel.dtensor_twin import dtensor_tp_blocks_step, tp_blocks_reference, tp_blocks_step
from pipelib.tensor_parallel.formulas import tp_layer_bytes, tp_step_counts
from pipelib.tensor_parallel.step import tp_recipe, tp_train_step

pytestmark = pytest.mark.cluster
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)
B, S = 2, 16


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tp_gpt_equals_the_unsharded_model_and_bytes_equal_the_formulas(cluster4, t, sp, dtype):
    cluster4.reset()
    results = cluster4.run(tp_train_step, CFG, B, S, t, sequence_parallel=sp, dtype=dtype)
    trace = cluster4.trace()
    ref = tp_recipe(CFG, B, S, dtype=dtype).first_step(keep_logits=True)
    loss, grads, logits = ref.loss, ref.grads, ref.stats["logits"]
    tol = {} if dtype == "float64" else {"rtol": 1e-5, "atol": 1e-6}
    agreed = check_against_reference(results, loss, grads, **tol)
    assert agreed.num_tensors == len(grads) == 4 + 12 * CFG.n_layer  # the tied wte/lm_head counted once
    torch.testing.assert_close(results[0].stats["logits"], logits, **tol)
    assert results[t:] == [None] * (4 - t)
    width = torch.finfo(getattr(torch, dtype)).bits // 8
    want = tp_step_counts(CFG.n_layer, B, S, CFG.n_embd, t, width, sequence_parallel=sp,
                          sp_grad_numel=results[0].stats["sp_grad_numel"])
    act = tp_layer_bytes(B, S, CFG.n_embd, t, width)
    for rank in range(t):
        calls = trace.filter(kind="collective", rank=rank).events
        assert len(calls) == want.calls and sum(e.bytes for e in calls) == want.bytes
        fwd = [e for e in calls if "forward" in e.label]
        assert (len(fwd), sum(e.bytes for e in fwd)) == (want.forward_calls, want.forward_bytes)
        for i in range(CFG.n_layer):  # per layer: 2 all-reduces' worth forward, 2 backward
            layer = [e for e in calls if f"blocks.{i}." in e.label]
            assert len(layer) == (8 if sp else 4)
            assert sum(e.bytes for e in layer if "forward" in e.label) == 2 * act
            assert sum(e.bytes for e in layer if "backward" in e.label) == 2 * act
    assert trace.filter(kind="collective", rank=t).events == [] if t < 4 else True


def test_sequence_parallel_grads_cover_norms_biases_and_positions(cluster4):
    r = cluster4.run(tp_train_step, CFG, B, S, 2, sequence_parallel=True, dtype="float64")
    C, L = CFG.n_embd, CFG.n_layer
    assert r[0].stats["sp_grad_numel"] == L * 6 * C + 2 * C + CFG.block_size * C
    full = cluster4.run(tp_train_step, CFG, B, S, 1, dtype="float64")[0].stats["local_params"]
    assert 0 < r[0].stats["local_params"] < full


def _vocab_loss_alone(t, dtype):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from pipelib.tensor_parallel.ops import TPComm
    from pipelib.tensor_parallel.step import tp_group
    from pipelib.tensor_parallel.vocab import vocab_parallel_cross_entropy

    group = tp_group(t)
    if group is None:
        return None
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, 8, 64, generator=g) * 4).to(getattr(torch, dtype))
    targets = torch.randint(0, 64, (3, 8), generator=g)
    full = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(full.view(-1, 64), targets.view(-1))
    ref.backward()
    r, v = dist.get_rank(group), 64 // t
    mine = logits[..., r * v:(r + 1) * v].clone().requires_grad_(True)
    loss = vocab_parallel_cross_entropy(mine, targets, TPComm(group), r * v)
    loss.backward()
    return (loss.item() - ref.item(), (mine.grad - full.grad[..., r * v:(r + 1) * v]).abs().max().item())


@pytest.mark.parametrize("t", [2, 4])
def test_vocab_parallel_cross_entropy_alone(cluster4, t):
    for dtype, tol in (("float64", 1e-14), ("float32", 1e-5)):
        out = cluster4.run(_vocab_loss_alone, t, dtype)
        for dloss, dgrad in out[:t]:
            assert abs(dloss) < tol and dgrad < tol


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_same_as_dtensor_tp(cluster4, t, sp):
    """pipelib's blocks and DTensor's (ColwiseParallel/RowwiseParallel, SequenceParallel): same
    outputs, input gradients and parameter gradients, and both equal to one process."""
    for dtype in ("float64",) if t == 4 else ("float32", "float64"):
        tol = {} if dtype == "float64" else {"rtol": 1e-5, "atol": 1e-5}
        y, grads, dx = tp_blocks_reference(CFG, B, S, dtype=dtype)
        ours = cluster4.run(tp_blocks_step, CFG, B, S, t, sequence_parallel=sp, dtype=dtype)
        theirs = cluster4.run(dtensor_tp_blocks_step, CFG, B, S, t, sequence_parallel=sp, dtype=dtype)
        for res in (ours, theirs):
            check_against_reference(res, None, grads, **tol)
            torch.testing.assert_close(res[0].stats["y"], y, **tol)
            torch.testing.assert_close(res[0].stats["dx"], dx, **tol)
        for name in grads:
            torch.testing.assert_close(ours[0].grads[name], theirs[0].grads[name], **tol)


def test_bad_plan_fails_in_the_notebook_and_on_the_engines_with_the_values(cluster4):
    """Through `Cluster.run` the step's check runs in the notebook, before any engine works;
    called another way (here a partial, as a caller without the check would), the engines
    raise the same."""
    import functools

    from pipelib.runtime.errors import RankError

    bad = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=6, n_embd=48)
    with pytest.raises(ValueError, match="n_head=6 is not divisible by the tensor-parallel degree t=4"):
        cluster4.run(tp_train_step, bad, B, S, 4)
    with pytest.raises(RankError, match="n_head=6 is not divisible by the tensor-parallel degree t=4"):
        cluster4.run(functools.partial(tp_train_step, bad, B, S, 4))


def test_torch_collectives_backend_gives_the_same_step_untraced(cluster4):
    cluster4.reset()
    results = cluster4.run(tp_train_step, CFG, B, S, 4, sequence_parallel=True, dtype="float64", backend="torch")
    assert cluster4.trace().filter(kind="collective").events == []   # torch's built-ins: not on pipelib's trace
    ref = tp_recipe(CFG, B, S, dtype="float64").first_step()
    loss, grads = ref.loss, ref.grads
    check_against_reference(results, loss, grads)


def _layers_alone(t, sp, dtype):
    """The parallel MLP and attention (with heads split) against their unsharded selves: outputs,
    input gradients and every weight gradient (the shard's slice of the full one)."""
    import copy

    import torch
    import torch.distributed as dist

    from pipelib.model import GPT, GPTConfig
    from pipelib.placement import join_shards
    from pipelib.tensor_parallel.layers import parallel_attention, parallel_mlp
    from pipelib.tensor_parallel.ops import TPComm
    from pipelib.tensor_parallel.step import tp_group

    group = tp_group(t)
    if group is None:
        return None
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=4, n_embd=32)
    dt = getattr(torch, dtype)
    block = GPT(cfg, seed=3).blocks[0].to(dt)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 16, 32, generator=g).to(dt)
    w = torch.randn(2, 16, 32, generator=g).to(dt)
    comm, r, worst = TPComm(group), dist.get_rank(group), 0.0
    for make, name in ((parallel_mlp, "mlp"), (parallel_attention, "attn")):
        full = getattr(block, name)
        part = make(copy.deepcopy(full), comm, sequence_parallel=sp, name=name)
        xf = x.clone().requires_grad_(True)
        (full(xf) * w).sum().backward()
        xs = (x.chunk(t, dim=1)[r] if sp else x).clone().requires_grad_(True)
        ys = part(xs)
        (ys * (w.chunk(t, dim=1)[r] if sp else w)).sum().backward()
        want_y = full(x).chunk(t, dim=1)[r] if sp else full(x)
        worst = max(worst, (ys - want_y).abs().max().item())
        want_dx = xf.grad.chunk(t, dim=1)[r] if sp else xf.grad
        worst = max(worst, (xs.grad - want_dx).abs().max().item())
        for pname, p in part.named_parameters():
            gs = p.grad.clone()
            if getattr(p, "tp_sequence", False):
                dist.all_reduce(gs, group=group)
            if p.tp_dim is not None:
                parts = [torch.empty_like(gs) for _ in range(t)]
                dist.all_gather(parts, gs, group=group)
                gs = join_shards(parts, p.tp_dim, p.tp_fused)
            worst = max(worst, (gs - dict(full.named_parameters())[pname].grad).abs().max().item())
    return worst


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_parallel_mlp_and_attention_alone(cluster4, t, sp):
    for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
        worst = cluster4.run(_layers_alone, t, sp, dtype)[:t]
        assert max(worst) < tol, (dtype, worst)


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_whole_gpt_same_as_dtensor_with_loss_parallel(cluster4, t, sp):
    from pipelib.tensor_parallel.dtensor_twin import dtensor_tp_gpt_step

    dtype = "float64"
    ref = tp_recipe(CFG, B, S, dtype=dtype).first_step(keep_logits=True)
    loss, grads, logits = ref.loss, ref.grads, ref.stats["logits"]
    ours = cluster4.run(tp_train_step, CFG, B, S, t, sequence_parallel=sp, dtype=dtype)
    theirs = cluster4.run(dtensor_tp_gpt_step, CFG, B, S, t, sequence_parallel=sp, dtype=dtype)
    for res in (ours, theirs):
        check_against_reference(res, loss, grads)
        torch.testing.assert_close(res[0].stats["logits"], logits)
    torch.testing.assert_close(ours[0].loss, theirs[0].loss)
    for name in grads:  # the tied embed.wte.weight included: embedding rows + head columns
        torch.testing.assert_close(ours[0].grads[name], theirs[0].grads[name])


def test_activation_bytes_per_layer_measured_equal_the_count(cluster4):
    from pipelib.tensor_parallel.formulas import tp_layer_activation_bytes

    cfgs = {L: GPTConfig(vocab_size=64, block_size=16, n_layer=L, n_head=4, n_embd=32) for L in (1, 2)}
    for t, sp in ((2, False), (2, True), (4, True)):
        m = {L: cluster4.run(tp_train_step, c, B, S, t, sequence_parallel=sp)[0].stats["activation_bytes"]
             for L, c in cfgs.items()}
        assert m[2] - m[1] == tp_layer_activation_bytes(B, S, 32, 4, t, 4, sequence_parallel=sp)


def test_adamw_training_on_the_char_corpus_equals_one_process(cluster4):
    from pipelib.data import char_corpus
    from pipelib.recipe import Recipe
    from pipelib.tensor_parallel.step import tp_train

    cfg = GPTConfig(vocab_size=char_corpus().vocab_size, block_size=16, n_layer=1, n_head=4, n_embd=32)
    recipe = Recipe(cfg, batch_size=4, steps=3, lr=1e-2, dtype=torch.float64, data="corpus")
    res = cluster4.run(tp_train, recipe, 4, sequence_parallel=True)
    agreed = check_against_reference(res, recipe.reference(), shared=True)   # every step's loss, gradients, parameters
    assert agreed.num_losses == 3 and agreed.num_tensors == 2 * len(res[0].params)


def test_bench_timer_runs_the_three_side_by_side(cluster4):
    from pipelib.tensor_parallel.dtensor_twin import IMPLS, timed_tp_steps

    for whole in (False, True):
        res = cluster4.run(timed_tp_steps, CFG, B, S, 2, steps=2, warmup=0, sequence_parallel=True, whole=whole)
        assert res[1:] == [None] * 3
        times = res[0].stats["times"]
        assert set(times) == set(IMPLS) and all(len(v) == 2 and min(v) > 0 for v in times.values())
