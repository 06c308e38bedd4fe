"""Experts resharded EP 2 -> 1, a NaN on one rank skipped on every rank under ZeRO, and a run
that loses two of its four ranks for good and goes on on two, on four spawned gloo ranks (plain
torch.distributed, no cluster).

- EP 2 -> 1: the MoE GPT trained two steps with its experts over ep = 2 (dp = 4: two ranks hold
  each expert alike), saved; loaded into the whole model in one process (every expert): every
  parameter, every piece of Adam's state and the balance bias equal what the ep ranks held, bit
  for bit, each expert from the rank that owned its global id.
- A NaN in rank 2's gradients at step 1 under ZeRO-1 and ZeRO-3: every rank skips step 1, and
  the run equals one told to skip step 1 (losses and parameters, every bit), replicas equal.
- Fewer ranks: DDP on 4 ranks saves after step 3 and stops; the same call on DDP over 2 ranks
  (ranks 2 and 3 gone) resumes from that checkpoint, resharded, with the global batch kept: its
  losses and final parameters equal the uninterrupted 4-rank run's to float rounding (the same
  rows, their mean summed in another order: not bit for bit), while a run that had kept its
  dp = 4 batch split but lost rows would not.
"""
import os

import pytest
import torch
import torch.distributed as dist
from spawned import scenario_facts, scenario_runs  # tests/spawned.py

WORLD = 4
DEADLINE_S = 300


def _recipe(steps=3):
    from pipelib.model import GPTConfig
    from pipelib.recipe import Recipe

    return Recipe(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64),
                  batch_size=8, steps=steps, lr=1e-2)


def _moe_steps(recipe, spec, mesh, edp, steps):
    """`steps` steps of the MoE GPT over the mesh's dp x ep (expert_parallel.training's step)."""
    from pipelib.expert_parallel.gpt import apply_expert_parallel, is_expert_param, moe_gpt, moe_loss, sync_grads

    dp = mesh.size("dp")
    model = moe_gpt(recipe, spec)
    apply_expert_parallel(model, mesh["ep"])
    opt = recipe.make_optimizer(model.parameters())
    named = list(model.named_parameters())
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        x, y = recipe.batch(step, mesh.local_rank("dp"), dp)
        moe_loss(model, x, y).backward()
        sync_grads([p for k, p in named if not is_expert_param(k)], mesh["dp"], dp, "dp grads")
        sync_grads([p for k, p in named if is_expert_param(k)], edp, dp, "expert dp grads")
        opt.step()
    return model, opt


def _ep_2_to_1(path):
    from pipelib.checkpoint.experts import load_moe, moe_state, save_moe
    from pipelib.checkpoint.resume import equal_state
    from pipelib.expert_parallel.gpt import moe_gpt
    from pipelib.expert_parallel.layer import MoESpec
    from pipelib.expert_parallel.training import expert_data_group
    from pipelib.runtime.mesh import Mesh
    from pipelib.topology import Topology

    recipe, spec = _recipe(2), MoESpec(num_experts=4, k=2)
    topology = Topology(dp=4, ep=2)
    mesh, edp = Mesh(topology), expert_data_group(topology)
    model, opt = _moe_steps(recipe, spec, mesh, edp, 2)
    root = os.path.join(path, "ep")
    save_moe(model, opt, root, 2, ep_group=mesh["ep"], recipe=recipe, spec=spec)
    held = {k: v.clone() for k, v in moe_state(model, opt).items()}
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, held)
    if dist.get_rank() != 0:
        return {}
    union = {}
    for theirs in everyone:
        union.update(theirs)
    whole = moe_gpt(recipe, spec)  # ep = 1: every expert in one process
    whole_opt = recipe.make_optimizer(whole.parameters())
    step = load_moe(whole, whole_opt, root, recipe=recipe, spec=spec)
    loaded = moe_state(whole, whole_opt)
    experts = sorted(k for k in loaded if k.startswith("model/") and ".experts." in k)
    return {"step": step, "keys": sorted(loaded), "union_keys": sorted(union), "differ": equal_state(union, loaded),
            "experts": len(experts), "distinct": not torch.equal(loaded["model/blocks.0.mlp.experts.0.c_fc.weight"],
                                                                 loaded["model/blocks.0.mlp.experts.2.c_fc.weight"]),
            "optim": sum(k.startswith("optim/") for k in loaded)}


def _nan_zero(path, kind):
    from pipelib.checkpoint.resume import equal_state, train_resumable
    from pipelib.plan import Plan

    recipe, plan = _recipe(3), Plan(dp=4, data=kind)
    hit = train_resumable(recipe, plan, os.path.join(path, kind, "hit"), save_every=3, nan_at=(1, 2))
    ref = train_resumable(recipe, plan, os.path.join(path, kind, "ref"), save_every=3, skip_steps=(1,))
    plain = train_resumable(recipe, plan, os.path.join(path, kind, "plain"), save_every=3)
    mine = [None] * WORLD
    dist.all_gather_object(mine, hit.params)
    return {"skipped": hit.skipped, "losses": (hit.losses, ref.losses, plain.losses),
            "params_differ": equal_state(hit.params, ref.params),
            "stepped_differ": equal_state(hit.params, plain.params),
            "replicas_differ": [equal_state(mine[0], m) for m in mine[1:]]}


def _fewer(path):
    from pipelib.checkpoint.resume import train_resumable
    from pipelib.plan import Plan

    recipe = _recipe(6)
    whole = train_resumable(recipe, Plan(dp=4), os.path.join(path, "fewer", "whole"), save_every=6)
    cut = os.path.join(path, "fewer", "cut")
    first = train_resumable(recipe, Plan(dp=4), cut, stop=3, save_every=3)
    again = train_resumable(recipe, Plan(dp=2), cut, save_every=3)
    if dist.get_rank() != 0:
        return {}
    return {"start": again.start, "losses": (whole.losses, first.losses, again.losses),
            "params_gap": max(float((whole.params[k] - again.params[k]).abs().max()) for k in whole.params),
            "moved": max(float((whole.params[k] - first.params[k]).abs().max()) for k in whole.params)}


def _scenarios():
    return {"ep_2_to_1": _ep_2_to_1, "fewer": _fewer,
            "nan_zero1": lambda p: _nan_zero(p, "zero1"),
            "nan_zero3": lambda p: _nan_zero(p, "zero3")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return scenario_runs(_scenarios, WORLD, tmp_path_factory.mktemp("checkpoint_experts"), DEADLINE_S)


def _facts(runs, name) -> dict:
    return scenario_facts(runs, name)


def test_experts_saved_on_two_ep_ranks_load_in_one_process_bit_for_bit(runs):
    f = _facts(runs, "ep_2_to_1")
    assert f["step"] == 2 and f["experts"] == 2 * 4 * 4  # 2 layers x 4 experts x (fc, proj: weight, bias)
    assert f["keys"] == f["union_keys"], "the whole model holds exactly what the ep ranks held together"
    assert f["optim"] == 3 * sum(k.startswith("model/") for k in f["keys"])  # Adam: step, exp_avg, exp_avg_sq
    assert f["differ"] == [], f"{f['differ']} differ from what the ep ranks held"
    assert f["distinct"], "expert 0 and expert 2 (one per ep rank) hold the same weights: one rank's copied"


@pytest.mark.parametrize("kind", ["zero1", "zero3"])
def test_a_nan_on_one_rank_skips_the_step_on_every_rank_under_zero(runs, kind):
    for rank, f in enumerate(runs[f"nan_{kind}"]):
        assert "error" not in f, f.get("error")
        assert f["skipped"] == (1,), f"rank {rank} skipped {f['skipped']}"
    f = runs[f"nan_{kind}"][0]
    hit, ref, plain = f["losses"]
    assert hit == ref and f["params_differ"] == []
    assert f["stepped_differ"] != [], "skipping step 1 changed nothing: the check would pass without a skip"
    assert f["replicas_differ"] == [[], [], []]


def test_a_run_that_loses_two_of_four_ranks_goes_on_on_two_from_its_checkpoint(runs):
    f = _facts(runs, "fewer")
    whole, first, again = f["losses"]
    assert f["start"] == 3 and first == whole[:3] and len(again) == 3
    # fp32 rounding of a mean summed in another order, through 3 Adam steps: far below the
    # ~1e-2 a changed batch moves the loss by (chapter 18's torchft run, half the rows)
    assert max(abs(a - b) for a, b in zip(again, whole[3:])) < 1e-5, (whole, again)
    # Adam divides by sqrt(v): where a gradient is tiny, rounding moves an update by more than
    # 1e-5; what must hold is that the two runs are one run: their parameters differ by a
    # small part of what steps 4-6 moved them (another batch would differ by that much)
    assert f["params_gap"] < 0.01 * f["moved"], (f["params_gap"], f["moved"])


def test_experts_named_by_local_index_are_refused_at_save_and_at_load():
    from pipelib.checkpoint.errors import IncompatibleCheckpointError
    from pipelib.checkpoint.experts import check_expert_records, merge_records
    from pipelib.checkpoint.manifest import Manifest

    local = {"blocks.0.mlp.experts.0.fc.weight": {"axis": "ep", "layer": 0, "expert": 0, "ep_size": 2}}
    with pytest.raises(IncompatibleCheckpointError, match=r"experts.0.fc.weight on ep ranks 0 and 1"):
        merge_records([{k: {**v, "ep_rank": 0} for k, v in local.items()},
                       {k: {**v, "ep_rank": 1} for k, v in local.items()}])
    records = {"blocks.0.mlp.experts.0.fc.weight": {"axis": "ep", "layer": 0, "expert": 0, "ep_rank": 1,
                                                     "ep_size": 2}}
    manifest = Manifest(step=3, world_size=2, tensors={"model/blocks.0.mlp.experts.0.fc.weight": {}},
                        files=(), meta={"placements": records, "num_experts": {"0": 4}})
    with pytest.raises(IncompatibleCheckpointError, match=r"expert 0 on ep rank 1 of 2"):
        check_expert_records(manifest)
    records["blocks.0.mlp.experts.0.fc.weight"]["ep_rank"] = 0
    check_expert_records(manifest)  # the owner of expert 0 at ep = 2 is ep rank 0: accepted
