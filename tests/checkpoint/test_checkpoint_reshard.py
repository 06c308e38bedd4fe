"""Resharding and resuming on four spawned gloo ranks (plain torch.distributed, no cluster).

- Resharding: a run saved at one layout loads at another, and the whole tensors of every
  parameter and every piece of optimizer state are identical: saved at A, loaded at B, saved
  again at B, the two checkpoints hold the same bits; the loaded parameters, gathered by the
  new layout's own `Parallel.unshard`, equal the saved ones. DP 4 -> 2 and 2 -> 4, TP 2 -> 1,
  ZeRO-3 4 -> 2, a pipeline of 2 stages -> 4 stages, DDP -> ZeRO-3.
- Resume bit for bit: a run of N steps equals a run stopped after k steps (a crash right after
  its save) and started again from the checkpoint (losses and final parameters, every bit),
  for DDP, ZeRO-3, a 1F1B pipeline with two replicas, TP x PP and ZeRO-1 x TP (two axes each:
  four ranks hold no 3-D grid).

One spawn for all (imports on four ranks cost seconds on two busy cores); each scenario runs
on every rank, returns rank 0's facts, and the parent asserts them.
"""
import os

import pytest
import torch.distributed as dist
from spawned import scenario_facts, scenario_runs  # tests/spawned.py

WORLD = 4
DEADLINE_S = 420


def _recipe(steps=4, n_layer=4):
    from pipelib.model import GPTConfig
    from pipelib.recipe import Recipe

    return Recipe(GPTConfig(n_layer=n_layer, n_head=2, n_embd=32, block_size=16, vocab_size=64),
                  batch_size=8, steps=steps, lr=1e-2)


def _reshard(path, name, before, after, steps=2):
    """Train `steps` steps at plan `before`, save; load at plan `after`, save again: the facts."""
    from pipelib.checkpoint.resume import equal_state, train_resumable
    from pipelib.checkpoint.sharded import load_whole
    from pipelib.checkpoint.training import grid_group, load_training, save_training
    from pipelib.parallelize import parallelize
    from pipelib.runtime.mesh import Mesh

    recipe = _recipe(steps)
    a, b = os.path.join(path, name, "a"), os.path.join(path, name, "b")
    train_resumable(recipe, before, a, stop=steps, save_every=steps)
    mesh = Mesh(after.topology())
    group = grid_group(mesh)
    facts = {}
    if mesh.contains:
        par = parallelize(recipe.build(), mesh, after, optimizer=recipe.make_optimizer)
        opt = par.make_optimizer(recipe.make_optimizer)
        step = load_training(par, opt, a, recipe=recipe)
        params = par.unshard("data")
        save_training(par, opt, b, step, recipe=recipe, group=group)
        facts = {"step": step, "params": params}
    dist.barrier()
    if dist.get_rank() == 0:
        saved, again = load_whole(a), load_whole(b)
        model = {k[len("model/"):]: v for k, v in saved.items() if k.startswith("model/")}
        facts.update(keys=sorted(saved), differ=equal_state(saved, again),
                     params_differ=equal_state({k: model[k] for k in facts["params"]}, facts["params"]),
                     held=len(facts["params"]),
                     optim_keys=sum(k.startswith("optim/") for k in saved))
    return facts


def _resume(path, name, plan, steps=4, k=2):
    """N steps uninterrupted, against k steps, a crash, and a fresh start from the checkpoint."""
    from pipelib.checkpoint.resume import equal_state, train_resumable

    recipe = _recipe(steps)
    whole = train_resumable(recipe, plan, os.path.join(path, name, "whole"), save_every=steps)
    cut = os.path.join(path, name, "cut")
    try:
        train_resumable(recipe, plan, cut, save_every=k, crash_after=k)
        crashed = False
    except RuntimeError:
        crashed = True
    again = train_resumable(recipe, plan, cut, save_every=k)
    if whole is None:
        return {}
    return {"crashed": crashed, "start": again.start, "whole": whole.losses, "resumed": again.losses,
            "params_differ": equal_state(whole.params, again.params)}


def _nan_skip(path):
    """A NaN in rank 2's gradients at step 1 (after DDP's all-reduce: a local failure): every
    rank skips step 1, and the run equals one told to skip step 1, on every rank."""
    from pipelib.checkpoint.resume import equal_state, train_resumable
    from pipelib.plan import Plan

    recipe, plan = _recipe(3), Plan(dp=4)
    hit = train_resumable(recipe, plan, os.path.join(path, "nan", "hit"), save_every=3, nan_at=(1, 2))
    ref = train_resumable(recipe, plan, os.path.join(path, "nan", "ref"), save_every=3, skip_steps=(1,))
    mine = [None] * WORLD
    dist.all_gather_object(mine, hit.params)
    return {"skipped": hit.skipped, "losses": (hit.losses, ref.losses),
            "params_differ": equal_state(hit.params, ref.params),
            "replicas_differ": [equal_state(mine[0], m) for m in mine[1:]]}


def _scenarios():
    from pipelib.plan import PipelineOptions, Plan

    return {
        "dp4_to_dp2": lambda p: _reshard(p, "dp42", Plan(dp=4), Plan(dp=2)),
        "dp2_to_dp4": lambda p: _reshard(p, "dp24", Plan(dp=2), Plan(dp=4)),
        "tp2_to_tp1": lambda p: _reshard(p, "tp21", Plan(tp=2), Plan()),
        "zero3_4_to_2": lambda p: _reshard(p, "z342", Plan(dp=4, data="zero3"),
                                           Plan(dp=2, data="zero3")),
        "ddp_to_zero3": lambda p: _reshard(p, "dz3", Plan(dp=2), Plan(dp=4, data="zero3")),
        "pp2dp2_to_pp4": lambda p: _reshard(p, "pp24", Plan(pp=2, dp=2, pipeline=PipelineOptions(microbatches=2)),
                                            Plan(pp=4, pipeline=PipelineOptions(microbatches=4))),
        "dp2tp2_to_tp2": lambda p: _reshard(p, "dt2", Plan(dp=2, tp=2, data="zero1"), Plan(tp=2)),
        "resume_ddp": lambda p: _resume(p, "rddp", Plan(dp=4)),
        "resume_zero3": lambda p: _resume(p, "rz3", Plan(dp=4, data="zero3")),
        "resume_1f1b": lambda p: _resume(p, "r1f1b", Plan(pp=2, dp=2, pipeline=PipelineOptions(microbatches=2))),
        "resume_tp2_pp2": lambda p: _resume(p, "rtp", Plan(tp=2, pp=2, pipeline=PipelineOptions(microbatches=2))),
        "resume_zero1_tp2": lambda p: _resume(p, "rz1", Plan(dp=2, tp=2, data="zero1")),
        "dcp": _dcp,
        "nan_skip": _nan_skip,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return scenario_runs(_scenarios, WORLD, tmp_path_factory.mktemp("checkpoint_reshard"), DEADLINE_S)


def _facts(runs, name) -> dict:
    return scenario_facts(runs, name)


@pytest.mark.parametrize("name", ["dp4_to_dp2", "dp2_to_dp4", "tp2_to_tp1", "zero3_4_to_2", "ddp_to_zero3",
                                  "pp2dp2_to_pp4", "dp2tp2_to_tp2"])
def test_reshard_keeps_every_bit_of_parameters_and_optimizer_state(runs, name):
    f = _facts(runs, name)
    assert f["step"] == 2 and f["held"] > 0
    assert f["optim_keys"] == 3 * sum(k.startswith("model/") for k in f["keys"])  # Adam: step, exp_avg, exp_avg_sq
    assert f["differ"] == [], f"saved at one layout, loaded and saved at another: {f['differ']} differ"
    assert f["params_differ"] == [], f"the new layout's parameters, gathered: {f['params_differ']} differ"


@pytest.mark.parametrize("name", ["resume_ddp", "resume_zero3", "resume_1f1b", "resume_tp2_pp2",
                                  "resume_zero1_tp2"])
def test_resume_after_a_crash_is_bit_for_bit(runs, name):
    f = _facts(runs, name)
    assert f["crashed"] and f["start"] == 2
    assert len(f["whole"]) == 4 and f["resumed"] == f["whole"][2:], (f["whole"], f["resumed"])
    assert f["params_differ"] == []


def _dcp(path):
    """DDP on 4 ranks: pipelib's checkpoint and DCP's of the same state (every rank calls
    `dcp.save`, which writes replicated tensors once), read back whole in one process; and
    ZeRO-3's sharded checkpoint converted to DCP and back."""
    from pipelib.checkpoint.dcp import dcp_load_whole, dcp_save_whole, from_dcp, to_dcp
    from pipelib.checkpoint.resume import equal_state, train_resumable
    from pipelib.checkpoint.sharded import load_whole
    from pipelib.checkpoint.state import capture
    from pipelib.checkpoint.training import load_training
    from pipelib.plan import Plan
    from pipelib.parallelize import parallelize
    from pipelib.runtime.mesh import Mesh

    recipe, plan = _recipe(2), Plan(dp=4)
    root, ours = os.path.join(path, "dcp", "pipelib"), os.path.join(path, "dcp", "torch")
    train_resumable(recipe, plan, root, save_every=2)
    par = parallelize(recipe.build(), Mesh(plan.topology()), plan, optimizer=recipe.make_optimizer)
    opt = par.make_optimizer(recipe.make_optimizer)
    load_training(par, opt, root, recipe=recipe)
    dcp_save_whole({k: t for k, (t, _) in capture(par, opt).items()}, ours)
    dist.barrier()
    if dist.get_rank() != 0:
        return {}
    mine, theirs = load_whole(root), dcp_load_whole(ours)
    sharded = os.path.join(path, "z342", "a")  # ZeRO-3 on 4 ranks, from the resharding scenario
    to_dcp(sharded, os.path.join(path, "dcp", "z3.dcp"))
    back = os.path.join(path, "dcp", "z3-back")
    from_dcp(os.path.join(path, "dcp", "z3.dcp"), back)
    return {"keys": len(mine), "dcp_differ": equal_state(mine, theirs),
            "round_trip_differ": equal_state(load_whole(sharded), load_whole(back)),
            "files": sorted(os.listdir(ours))}


def test_pipelib_and_dcp_checkpoints_of_the_same_state_hold_the_same_tensors(runs):
    f = _facts(runs, "dcp")
    assert f["keys"] > 0 and f["dcp_differ"] == []
    assert f["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    assert f["round_trip_differ"] == [], "ZeRO-3's checkpoint -> DCP -> pipelib changed tensors"


def test_a_nan_on_one_rank_skips_the_step_on_every_rank(runs):
    for rank, f in enumerate(runs["nan_skip"]):
        assert "error" not in f, f.get("error")
        assert f["skipped"] == (1,), f"rank {rank} skipped {f['skipped']}"
    f = runs["nan_skip"][0]
    assert f["losses"][0] == f["losses"][1] and f["params_differ"] == []
    assert f["replicas_differ"] == [[], [], []]
