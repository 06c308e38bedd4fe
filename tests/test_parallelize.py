"""Strategies composed through `parallelize` on 4 engines equal one process (3 optimizer steps),
with the bytes of every mesh axis, read from the trace, equal to the formulas."""
import dataclasses
import json

import pytest
import torch

from pipelib.comm.alphabeta import expected_bytes
from pipelib.data_parallel.zero_formulas import zero_comm_bytes
from pipelib.model import GPTConfig
from pipelib.plan import PipelineOptions, Plan, TensorOptions
from pipelib.planner.book import pipeline_rank_params
from pipelib.planner.spec import ModelSpec
from pipelib.planner.strategy import Strategy
from pipelib.recipe import Recipe
from pipelib.results import check_against_reference
from pipelib.tensor_parallel.formulas import tp_step_counts
from pipelib.trainer import run

GPT = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
RECIPE = Recipe(GPT, batch_size=8, steps=3, lr=1e-2, dtype=torch.float64)


def _all_reduce_bytes(numel, n, itemsize=8):
    return sum(expected_bytes("all_reduce", (numel,), itemsize, n, r) for r in range(n))


def test_dp2_tp2_equals_one_process_and_bytes_per_axis(cluster4):
    from pipelib.tensor_parallel.formulas import tp_step_counts

    plan = Plan(dp=2, tp=2)
    results = run(cluster4, RECIPE, plan)
    trace = cluster4.trace()
    agreed = check_against_reference(results, RECIPE.reference(), shared=True)
    assert agreed.num_tensors == 2 * len(RECIPE.reference().grads)
    # dp: one bucket on each rank, its TP shard of the model, all-reduced once per step in each
    # of the 2 dp groups (tp rank 0's and tp rank 1's, equal shards)
    assert trace.bytes_sent(axis="dp") == RECIPE.steps * 2 * _all_reduce_bytes(_tp_shard_numel(GPT, 2), 2)
    # tp: Megatron's collectives, forward and backward, per step and per tp group
    rows = RECIPE.batch_size // 2
    c = tp_step_counts(GPT.n_layer, rows, GPT.block_size, GPT.n_embd, 2, 8, vocab=True)
    assert trace.bytes_sent(axis="tp") == RECIPE.steps * 2 * 2 * (c.forward_bytes + c.backward_bytes)
    assert trace.bytes_sent(axis="pp") == 0
    assert all(len(r.bytes_sent) == RECIPE.steps and r.peak_bytes > 0 for r in results)
    # the last loss is the recipe's dtype, not a Python float cast to fp32 (caught on a GPU first)
    assert all(r.loss.dtype == torch.float64 and r.loss.item() == r.losses[-1] for r in results if r.losses)


def _tp_shard_numel(cfg, t):
    """Parameter elements a tp rank holds under Megatron's split of the GPT (the vocabulary-
    parallel embedding tied to the head, column-parallel c_attn and c_fc with their biases,
    row-parallel c_proj weights; layer norms, positions and c_proj biases replicated)."""
    C, V, T, L = cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.n_layer
    split = V * C + L * (3 * C * C + 3 * C + 4 * C * C + 4 * C + C * C + 4 * C * C)
    replicated = T * C + L * (2 * 2 * C + 2 * C) + 2 * C
    return split // t + replicated


def test_dp2_pp2_with_the_stage_hook_equals_one_process_and_bytes_per_axis(cluster4):
    plan = Plan(dp=2, pp=2, pipeline=PipelineOptions("1f1b", microbatches=2))
    results = run(cluster4, RECIPE, plan)
    trace = cluster4.trace()
    check_against_reference(results, RECIPE.reference(), shared=True)
    model = RECIPE.build()
    # pp: each microbatch's activation forward and its gradient back, (rows/m, T, C) float64,
    # plus the tied embedding/head gradient summed over the first and last stage (V x C)
    rows = RECIPE.batch_size // 2 // plan.pipeline.microbatches
    act = rows * GPT.block_size * GPT.n_embd * 8
    tied = _all_reduce_bytes(GPT.vocab_size * GPT.n_embd, 2)
    assert trace.bytes_sent(axis="pp") == RECIPE.steps * 2 * (2 * plan.pipeline.microbatches * act + tied)
    # dp: each stage's parameters all-reduced once per step, when its last backward is done
    stage0 = [model.embed, *model.blocks[:1]]
    stage1 = [*model.blocks[1:], model.head]
    numel = [sum(p.numel() for m in ms for p in m.parameters()) for ms in (stage0, stage1)]
    assert trace.bytes_sent(axis="dp") == RECIPE.steps * sum(_all_reduce_bytes(n, 2) for n in numel)
    reduces = [e for e in trace.filter(kind="collective", axis="dp")]
    assert len(reduces) == RECIPE.steps * 4  # once per stage per step, on each of its 2 dp ranks


@pytest.fixture(scope="module")
def cluster8():
    from pipelib.runtime.cluster import Cluster

    c = Cluster(8, timeout=60)
    yield c
    c.stop()


def _block_shard_numel(cfg, t):
    """A block's parameter elements on one tp rank (column-parallel c_attn and c_fc with biases,
    row-parallel c_proj weights split; layer norms and c_proj biases replicated)."""
    C = cfg.n_embd
    return (3 * C * C + 3 * C + 4 * C * C + 4 * C + C * C + 4 * C * C) // t + 2 * 2 * C + 2 * C


def test_dp2_tp2_pp2_every_axis_at_once_equals_one_process_and_bytes_per_axis(cluster8):
    """Chapter 15's grid: tensor parallelism inside each pipeline stage, data parallelism over
    both, 8 ranks; each axis's bytes from the trace equal its formula."""
    from pipelib.tensor_parallel.formulas import tp_step_counts

    plan = Plan(dp=2, tp=2, pp=2, pipeline=PipelineOptions(microbatches=2))
    results = run(cluster8, RECIPE, plan)
    trace = cluster8.trace()
    check_against_reference(results, RECIPE.reference(), shared=True)
    C, V, T, t, rows = GPT.n_embd, GPT.vocab_size, GPT.block_size, 2, RECIPE.batch_size // 2
    # tp: Megatron's collectives of the whole model on a dp rank's rows (the stages share them),
    # sent by both ranks of each tp group
    c = tp_step_counts(GPT.n_layer, rows, T, C, t, 8, vocab=True)
    assert trace.bytes_sent(axis="tp") == RECIPE.steps * 2 * 2 * (c.forward_bytes + c.backward_bytes)
    # pp: in each of the 4 pipelines (dp x tp), every microbatch's activation and its gradient,
    # and the tied embedding/head shard (V/t x C) summed over the first and last stage
    act = rows // plan.pipeline.microbatches * T * C * 8
    tied = _all_reduce_bytes(V // t * C, 2)
    assert trace.bytes_sent(axis="pp") == RECIPE.steps * 4 * (2 * plan.pipeline.microbatches * act + tied)
    # dp: each stage's tp shard all-reduced once per step over its 2 dp ranks, for both tp ranks;
    # the last stage's head is the embedding's shard (tied), held by both stages
    stage0 = V // t * C + T * C + _block_shard_numel(GPT, t)
    stage1 = _block_shard_numel(GPT, t) + 2 * C + V // t * C
    assert trace.bytes_sent(axis="dp") == RECIPE.steps * 2 * sum(_all_reduce_bytes(n, 2) for n in (stage0, stage1))
    assert sum(r.losses != () for r in results) == 1  # one rank reports the loss


def test_dp2_tp2_pp2_with_zero1_over_dp_equals_one_process(cluster8):
    """Chapter 15's run: the same grid with ZeRO-1 over the dp axis inside each pipeline stage
    (each stage's optimizer state sharded over its 2 dp ranks), fp32 as ZeRO's flat buffers are.
    SGD: Adam would turn the key bias's gradient, zero in exact arithmetic and
    rounding noise in fp32, into steps of lr size (chapter 09)."""
    recipe = Recipe(GPT, batch_size=8, steps=3, lr=1e-2, optimizer="sgd")
    results = run(cluster8, recipe, Plan(dp=2, tp=2, pp=2, data="zero1", pipeline=PipelineOptions(microbatches=2)))
    agreed = check_against_reference(results, recipe.reference(), shared=True, rtol=1e-5, atol=1e-6)
    assert agreed.num_losses == 3 and cluster8.trace().bytes_sent(axis="dp") > 0


def test_sequence_parallel_inside_interleaved_pipeline_stages_equals_one_process(cluster4):
    """tp=2 x pp=2 with sequence parallelism, 2 chunks per rank: each stage's layer norms summed
    over tp when its last backward is done, and half the activation bytes between stages."""
    gpt = GPTConfig(vocab_size=64, block_size=8, n_layer=4, n_head=2, n_embd=16)
    recipe = Recipe(gpt, batch_size=8, steps=3, lr=1e-2, dtype=torch.float64)
    plan = Plan(tp=2, pp=2, pipeline=PipelineOptions("interleaved_1f1b", microbatches=2),
                tensor=TensorOptions(sequence_parallel=True))
    results = run(cluster4, recipe, plan)
    check_against_reference(results, recipe.reference(), shared=True)
    m = plan.pipeline.microbatches
    rows, T, C = recipe.batch_size // m, gpt.block_size, gpt.n_embd
    act = rows * T // 2 * C * 8  # (rows/m, T/t, C) float64: the sequence shard crosses the stages
    tied = _all_reduce_bytes(gpt.vocab_size // 2 * C, 2)
    # 4 stages on 2 ranks: 3 boundaries, each crossed forward and backward per microbatch, in both tp pipelines
    assert cluster4.trace().bytes_sent(axis="pp") == recipe.steps * 2 * (3 * 2 * m * act + tied)


def test_plan_prints_round_trips_and_checks_before_any_engine_work():
    plan = Plan(dp=2, pp=2, pipeline=PipelineOptions(microbatches=4))
    assert str(plan) == "Plan(dp=2 x pp=2: ddp; 1f1b, m=4)"
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert Recipe.from_dict(json.loads(json.dumps(RECIPE.to_dict()))) == RECIPE
    with pytest.raises(ValueError, match="batch_size=8 does not split into dp=2 ranks x 3 microbatches"):
        Plan(dp=2, pp=2, pipeline=PipelineOptions(microbatches=3)).check(Recipe(GPT, batch_size=8))
    with pytest.raises(ValueError, match="needs 8 ranks but the cluster has 4"):
        Plan(dp=4, pp=2).check(RECIPE, 4)
    with pytest.raises(ValueError, match="data kind 'zero9'"):
        Plan(dp=2, data="zero9")
    with pytest.raises(ValueError, match="'interleaved_1f1b' cuts 4 stages but the GPT has n_layer=3 blocks"):
        Plan(pp=2, pipeline="interleaved_1f1b").check(Recipe(dataclasses.replace(GPT, n_layer=3), batch_size=8))


@pytest.mark.parametrize("sizes, kind", [(dict(dp=2, tp=2), "zero1"), (dict(dp=2, tp=2), "zero3"),
                                         (dict(dp=2, pp=2), "zero1"), (dict(dp=2, tp=2), "ddp_overlap")])
def test_zero_and_overlapped_ddp_over_the_dp_axis_compose_too(cluster4, sizes, kind):
    recipe = Recipe(GPT, batch_size=8, steps=3, lr=1e-2)  # ZeRO's flat buffers are fp32 (and the others alike)
    plan = Plan(**sizes, data=kind)
    results = run(cluster4, recipe, plan)
    check_against_reference(results, recipe.reference(), shared=True, rtol=1e-4, atol=1e-5)
    assert all(r.peak_bytes > 0 for r in results)


def test_zero2_and_zero3_refuse_a_pipeline():
    with pytest.raises(ValueError, match="once per microbatch; use 'ddp' or 'zero1'"):
        Plan(dp=2, pp=2, data="zero2")


def test_zero_refuses_a_model_it_would_silently_train_in_another_precision(cluster4):
    from pipelib.runtime.errors import RankError
    from pipelib.trainer import train_plan

    with pytest.raises(ValueError, match="keeps fp32 flat buffers, but the recipe's dtype is torch.float64"):
        run(cluster4, RECIPE, Plan(dp=2, data="zero1"))  # RECIPE is fp64: refused in the notebook
    with pytest.raises(RankError, match="trainable parameters in torch.float64; its flat buffers"):
        cluster4.run(train_plan, RECIPE, Plan(dp=4, data="zero1"))  # and by ZeRO itself


def test_the_trainers_peak_is_every_category_parameters_gradients_optimizer_activations(cluster4):
    """From the second step on, a DDP rank holds its parameters, its gradients (kept between
    steps), Adam's two moments and step counters, and at the end of its forward every tensor
    autograd saved: the peak is their sum, as `pipelib.memory` counts each."""
    from pipelib.memory import gpt_activation_bytes, optimizer_state_bytes

    recipe = Recipe(GPT, batch_size=8, steps=2, lr=1e-2)  # fp32: the formula's LayerNorm statistics
    results = run(cluster4, recipe, Plan(dp=4))
    model = recipe.build()
    n, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    states = 4 * n + 4 * n + optimizer_state_bytes(n, tensors, "adam", itemsize=4) + buffers
    acts = gpt_activation_bytes(GPT, recipe.batch_size // 4, GPT.block_size, itemsize=4)
    assert {r.peak_bytes for r in results} == {states + acts}


@pytest.mark.parametrize("sizes", [dict(dp=2, cp=2), dict(tp=2, cp=2), dict(cp=4)], ids=["dp2cp2", "tp2cp2", "cp4"])
def test_context_parallelism_of_the_whole_model_composes_and_equals_one_process(cluster4, sizes):
    """The sequence split over cp (zigzag ring attention, global positions, gradients averaged
    over cp) with dp or tp beside it: equal to one process over 3 steps, and the cp axis's bytes
    from the trace are the ring's (`context_parallel.costs.ring_bytes`, every layer, forward and
    backward) plus the gradients' all-reduce of what a rank holds."""
    from pipelib.context_parallel.costs import ring_bytes
    from pipelib.memory import num_params

    plan = Plan(**sizes)
    results = run(cluster4, RECIPE, plan)
    check_against_reference(results, RECIPE.reference(), shared=True)
    rows, shard = RECIPE.batch_size // plan.dp, GPT.block_size // plan.cp
    ring = ring_bytes(rows, GPT.n_head // plan.tp, shard, GPT.n_embd // GPT.n_head, 8, plan.cp)
    held = num_params(GPT) if plan.tp == 1 else _tp_shard_numel(GPT, plan.tp)
    per_group = plan.cp * GPT.n_layer * (ring["forward"] + ring["backward"]) + _all_reduce_bytes(held, plan.cp)
    assert cluster4.trace().bytes_sent(axis="cp") == RECIPE.steps * (4 // plan.cp) * per_group
    assert sum(r.losses != () for r in results) == 1


def test_context_parallelism_with_zero1_and_its_refusals(cluster4):
    recipe = Recipe(GPT, batch_size=8, steps=3, lr=1e-2, optimizer="sgd")  # fp32 ZeRO; SGD: see below
    results = run(cluster4, recipe, Plan(dp=2, cp=2, data="zero1"))
    # fp32: the ring sums in another order; Adam would turn the key biases' gradients (zero in
    # exact arithmetic: softmax ignores a shift of every score in a row) into lr-sized steps
    check_against_reference(results, recipe.reference(), shared=True, rtol=1e-5, atol=1e-6)
    for bad in (dict(pp=2), dict(tp=2, tensor=TensorOptions(sequence_parallel=True)), dict(data="zero2", dp=2)):
        with pytest.raises(ValueError, match="cp=2 composes with dp and tp, not yet with"):
            Plan(cp=2, **bad)
    with pytest.raises(ValueError, match="the recipe.s sequences are 8 tokens; use a multiple of 16"):
        Plan(cp=8).check(RECIPE)


def test_dp2_tp2_cp2_on_8_engines_equals_one_process(cluster8):
    """Data, tensor and context parallelism at once: the cp groups' bytes are the ring's and
    the gradient all-reduce of a tp shard, in each of the 4 (dp, tp) cells of the grid."""
    from pipelib.context_parallel.costs import ring_bytes

    plan = Plan(dp=2, tp=2, cp=2)
    results = run(cluster8, RECIPE, plan)
    check_against_reference(results, RECIPE.reference(), shared=True)
    ring = ring_bytes(RECIPE.batch_size // 2, GPT.n_head // 2, GPT.block_size // 2, GPT.n_embd // GPT.n_head, 8, 2)
    held = _tp_shard_numel(GPT, 2)
    per_group = 2 * GPT.n_layer * (ring["forward"] + ring["backward"]) + _all_reduce_bytes(held, 2)
    trace = cluster8.trace()
    assert trace.bytes_sent(axis="cp") == RECIPE.steps * 4 * per_group
    assert trace.bytes_sent(axis="dp") == RECIPE.steps * 4 * _all_reduce_bytes(held, 2)  # 4 dp groups (tp x cp)


def test_a_pipeline_on_part_of_the_world_leaves_no_group_half_made(cluster4):
    """Plan(pp=2) on 4 engines: ranks 2 and 3 are off the grid. The tied embedding's group is made
    by every rank with the mesh (new_group is collective); made later by the grid's ranks only, it
    hung the next group any rank made."""
    recipe = Recipe(GPT, batch_size=8, steps=1, lr=1e-2, dtype=torch.float64)
    first = run(cluster4, recipe, Plan(pp=2))
    assert first[2:] == [None, None]
    check_against_reference(first, recipe.reference(), shared={"embed.wte.weight"})   # the tied weight
    check_against_reference(run(cluster4, recipe, Plan(dp=4)), recipe.reference(), shared=True)


def test_plan_check_takes_an_mlp_recipe_without_a_pipeline():
    """An MLP has no blocks to cut: the stage count is checked only for pp > 1 (it once read
    `n_layer` of every recipe and raised AttributeError for an MLP under Plan(dp=2))."""
    from pipelib.model import MLPConfig

    Plan(dp=2).check(Recipe(MLPConfig(), batch_size=4), world_size=2)
    with pytest.raises(ValueError, match="tp, pp and cp split the GPT's blocks"):
        Plan(pp=2).check(Recipe(MLPConfig(), batch_size=4), world_size=2)


# ----------------------------------------------------------------------------- chapter 15's bytes per axis
# (on the same 8 engines: one cluster start, not two)
# Chapter 15's 2 x 2 x 2 with ZeRO-1 over dp on 8 simulated engines: the bytes every axis sent,
# read from the trace, equal their formulas. dp: ZeRO-1's reduce-scatter of the gradients and
# all-gather of the parameters, (N-1)/N of each pipeline rank's tp shard twice a step
# (`zero_comm_bytes`, the parameters counted by `planner.book.pipeline_rank_params`), on each of
# the dp x tp ranks of every stage; tp: Megatron's collectives (`tp_step_counts`); pp: each
# microbatch's activation and gradient in each of the 4 pipelines and the tied embedding's
# gradient summed between the first and last stage.
GPT3D = GPTConfig(vocab_size=64, block_size=8, n_layer=4, n_head=2, n_embd=16)
SPEC = ModelSpec("chapter 15's GPT", n_layer=4, hidden=16, n_head=2, vocab=64, seq_len=8)
STEPS3D, BATCH3D, M3D = 3, 8, 2


@pytest.fixture(scope="module")
def trace3d(cluster8):
    run(cluster8, Recipe(GPT3D, batch_size=BATCH3D, steps=STEPS3D, lr=1e-2),
        Plan(dp=2, tp=2, pp=2, data="zero1", pipeline=PipelineOptions(microbatches=M3D)))
    return cluster8.trace()


def test_dp_bytes_are_zero1s_formula(trace3d):
    psi = pipeline_rank_params(SPEC, Strategy(dp=2, tp=2, pp=2), M3D)   # one tp shard of each stage
    assert psi == [4016, 3920]  # every unit's numel is even: ZeRO's padding to N = 2 adds nothing
    per_step = sum(zero_comm_bytes(p, 2, 1, mixed_precision=False) for p in psi)  # (1/2) psi (4 + 4)
    assert trace3d.bytes_sent(axis="dp") == STEPS3D * 2 * 2 * per_step  # dp x tp ranks of every stage


def test_tp_and_pp_bytes_are_their_formulas(trace3d):
    C, V, T, t, rows = GPT3D.n_embd, GPT3D.vocab_size, GPT3D.block_size, 2, BATCH3D // 2
    c = tp_step_counts(GPT3D.n_layer, rows, T, C, t, 4, vocab=True)
    assert trace3d.bytes_sent(axis="tp") == STEPS3D * 2 * 2 * (c.forward_bytes + c.backward_bytes)
    act = rows // M3D * T * C * 4
    tied = sum(expected_bytes("all_reduce", (V // t * C,), 4, 2, r) for r in range(2))
    assert trace3d.bytes_sent(axis="pp") == STEPS3D * 4 * (2 * M3D * act + tied)


def _snapshot(model):
    return ({n: (type(m), set(vars(m))) for n, m in model.named_modules()},
            {n: (p, set(vars(p))) for n, p in model.named_parameters()})


def _stashed(fresh, snapshot, model) -> list[str]:
    """The names a strategy added to any module's __dict__ that the same module of a `fresh`
    model did not have (state stashed on the model: replacing what exists, such as a module or
    `attn.core`, is the strategy's change, not its state), and new attributes on a parameter the
    model had before (`snapshot`; a strategy's own new layers keep what they like on their own
    new parameters)."""
    modules, params = snapshot
    added = []
    for name, m in model.named_modules():
        if name in modules and modules[name][0] is type(m):
            before = fresh.get_submodule(name)
            added += [f"{name or 'model'}.{k}" for k in set(vars(m)) - modules[name][1] if not hasattr(before, k)]
    added += [f"{n}.{k}" for n, p in model.named_parameters() if n in params and p is params[n][0]
              for k in set(vars(p)) - params[n][1]]
    return sorted(added)


def _state_left_on_the_model(plan_dict):
    """On every engine: `_stashed` after `parallelize(model, mesh, plan)`."""
    from pipelib.parallelize import parallelize
    from pipelib.runtime.mesh import Mesh

    plan = Plan.from_dict(plan_dict)
    mesh = Mesh(plan.topology())
    if not mesh.contains:
        return []
    model = RECIPE.build().float()  # ZeRO keeps fp32 buffers
    snapshot = _snapshot(model)
    par = parallelize(model, mesh, plan)
    par.close()
    return _stashed(RECIPE.build(), snapshot, model)


@pytest.mark.parametrize("which, plan", [
    ("cluster8", Plan(dp=2, tp=2, pp=2, recompute="full", data="zero1", tensor=TensorOptions(sequence_parallel=True))),
    ("cluster4", Plan(dp=2, cp=2)),
], ids=["dp2tp2pp2-sp-zero1-recompute", "dp2cp2"])
def test_no_strategy_leaves_state_as_attributes_on_the_model(request, which, plan):
    cluster = request.getfixturevalue(which)
    cluster.reset()
    assert cluster.run(_state_left_on_the_model, plan.to_dict()) == [[]] * cluster.world_size


def test_the_attribute_check_sees_state_stashed_on_the_model():
    """The check above can fail: state written onto the model or a parameter is named, a
    replaced method (`attn.core`, as recomputation and ring attention do) is not."""
    model = RECIPE.build()
    snapshot = _snapshot(model)
    model.tp_comm = object()
    model.blocks[0].attn.core = lambda *a: None
    model.blocks[1].mlp.c_fc.weight.tp_dim = 0
    assert _stashed(RECIPE.build(), snapshot, model) == ["blocks.1.mlp.c_fc.weight.tp_dim", "model.tp_comm"]


def test_uneven_pipeline_stages_equal_one_process(cluster4):
    """Plan.pipeline.layers: 1 block on stage 0 (with the embedding), 3 on stage 1 (with the head),
    as Llama 3 405B's 126 layers sit on 16 stages; the parameters' stages follow the split."""
    gpt = GPTConfig(vocab_size=64, block_size=8, n_layer=4, n_head=2, n_embd=16)
    recipe = Recipe(gpt, batch_size=8, steps=2, lr=1e-2, dtype=torch.float64)
    plan = Plan(pp=2, pipeline=PipelineOptions(microbatches=2, layers=(1, 3)))
    results = run(cluster4, recipe, plan)
    check_against_reference(results, recipe.reference(), shared={"embed.wte.weight"})
    held = [set(r.params) for r in results[:2]]
    assert {n.split(".")[1] for n in held[0] if n.startswith("blocks.")} == {"0"}
    assert {n.split(".")[1] for n in held[1] if n.startswith("blocks.")} == {"1", "2", "3"}


@pytest.mark.parametrize("kind", ["zero1", "zero3"])
def test_hsdp_through_the_plan_equals_one_process(cluster4, kind):
    """Plan(dp=4, data=DataOptions(kind, replicate=2)): shards over 2 ranks, 2 replicas; the shard
    groups' traffic is the reduce-scatter/all-gather of a 2-rank ZeRO, the replicas' an all-reduce."""
    from pipelib.plan import DataOptions

    recipe = Recipe(GPT, batch_size=8, steps=3, lr=1e-2, optimizer="sgd")  # fp32 for ZeRO
    plan = Plan(dp=4, data=DataOptions(kind, replicate=2))
    assert str(plan) == f"Plan(dp=4: {kind}, HSDP 2 x 2)"
    results = run(cluster4, recipe, plan)
    check_against_reference(results, recipe.reference(), shared=True, rtol=1e-5, atol=1e-6)
    trace = cluster4.trace()
    assert trace.bytes_sent(axis="dp_shard") > 0 and trace.bytes_sent(axis="dp_replicate") > 0
    assert trace.bytes_sent(axis="dp") == 0
    with pytest.raises(ValueError, match="replicate=2 with kind 'ddp'"):
        Plan(dp=4, data=DataOptions("ddp", replicate=2))
    with pytest.raises(ValueError, match="dp_replicate=3"):
        Plan(dp=4, data=DataOptions("zero3", replicate=3))
