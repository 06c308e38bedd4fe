"""pipelib's executor against torch.distributed.pipelining: the same step (same MLP, seed,
stage boundaries and placement) gives the same loss and gradients as torch's schedule of the
same name and as the single-process monolith; torch's own order is pipelib's; bad input fails
in the notebook."""
import pytest

from pipelib.recipe import Recipe
import torch

from pipelib.model import MLPConfig
from pipelib.pipeline.schedules import resolve_schedule
from pipelib.pipeline.step import train_step
from pipelib.pipeline.torch_twin import (
    TORCH_SCHEDULES,
    check_torch_step,
    run_compare_step_times,
    run_torch_train_step,
    torch_pipeline_order,
    torch_train_step,
)
from pipelib.results import check_against_reference

pytestmark = pytest.mark.cluster

CFG = MLPConfig(in_features=16, hidden=16, out_features=10, num_layers=8)
ROWS = 2  # rows per microbatch
# (schedule, p, m) on the 4-rank cluster; m < p where torch allows it (ZB-V, GPipe, interleaved)
CASES = [("gpipe", 4, 4), ("gpipe", 4, 3), ("1f1b", 4, 4), ("1f1b", 4, 6),
         ("interleaved_1f1b", 4, 8), ("interleaved_1f1b", 4, 2), ("zb_h1", 4, 4),
         ("interleaved_zero_bubble", 4, 8), ("zbv", 4, 8), ("zbv", 4, 2), ("dualpipe_v", 4, 8),
         ("gpipe", 2, 4), ("zbv", 2, 4), ("looped_bfs", 4, 8), ("looped_bfs", 2, 4)]


def _both(cases):
    """On every engine: pipelib's and torch's step for each case (p=2 cases: subgroup 0, 1).

    A barrier between runs: their messages share ranks and tags (torch sends on tag 0), so one
    run must not start on a rank while its neighbour still finishes the previous one (a
    `cluster.run` per step, as the book does, syncs the same way)."""
    import torch.distributed as dist

    out = []
    for name, p, m in cases:
        group = dist.new_group(list(range(p))) if p < dist.get_world_size() else None
        me = dist.get_rank() < p
        ours = train_step(name, p, m, CFG, batch_seed=m, group=group) if me else None
        dist.barrier()
        theirs = torch_train_step(name, p, m, CFG, batch_seed=m, group=group) if me else None
        dist.barrier()
        out.append((ours, theirs))
    return out


def _warm_up():
    """First uses cost seconds on a loaded machine (importing torch's pipelining, the first op
    under FlopCounterMode): pay them before any rank waits on another under the gloo timeout."""
    import torch.distributed.pipelining  # noqa: F401
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        logits = torch.nn.Linear(4, 3)(torch.ones(2, 4))
        torch.nn.functional.cross_entropy(logits, torch.zeros(2, dtype=torch.long)).backward()


@pytest.fixture(scope="module")
def warm(cluster4):
    cluster4.run(_warm_up, timeout=120)
    return cluster4


@pytest.fixture(scope="module")
def results(warm):
    for name, p, m in CASES:
        check_torch_step(name, p, m, CFG, ROWS * m, world_size=warm.world_size)
    per_rank = warm.run(_both, CASES, timeout=120)
    return {case: [per_rank[r][i] for r in range(case[1])] for i, case in enumerate(CASES)}


def test_every_torch_schedule_is_covered():
    assert {name for name, _, _ in CASES} == set(TORCH_SCHEDULES)


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-p{p}-m{m}" for n, p, m in CASES])
def test_pipelib_equals_torch_equals_the_monolith(results, case):
    name, p, m = case
    ref = Recipe(CFG, batch_size=ROWS * m, data_seed=m).first_step()
    ref_loss, ref_grads = ref.loss, ref.grads
    ours, theirs = zip(*results[case])
    for who, res in (("pipelib", ours), ("torch", theirs)):
        agreed = check_against_reference(res, ref_loss, ref_grads)
        assert agreed.num_tensors == len(ref_grads), f"{who} {case}: {agreed}"
    # and the two runs hold the same parameters on the same ranks (same placement)
    assert [sorted(o.grads) for o in ours] == [sorted(t.grads) for t in theirs]


def _timed(name, p, m, steps):
    return (train_step(name, p, m, CFG, steps=steps, timed=True),
            torch_train_step(name, p, m, CFG, steps=steps, timed=True))


def test_timing_mode_repeats_the_step(warm):
    per_rank = warm.run(_timed, "zbv", 4, 8, 3)
    ref = Recipe(CFG, batch_size=ROWS * 8).first_step()
    ref_loss, ref_grads = ref.loss, ref.grads
    for ours, theirs in per_rank:
        for r in (ours, theirs):
            assert len(r.times) == 3 and all(t > 0 for t in r.times)
            for k, g in r.grads.items():  # gradients zeroed between steps: still one step's
                torch.testing.assert_close(g, ref_grads[k])
            if r.loss is not None:
                torch.testing.assert_close(r.loss, ref_loss)


def test_compare_step_times_on_a_subgroup(warm):
    """p=2 on 4 ranks: a subgroup is made; both sides timed, their gradients checked equal."""
    out = run_compare_step_times(warm, "interleaved_1f1b", 2, 4, CFG, steps=2)
    for side in ("pipelib", "torch"):
        assert len(out[side]["steps_s"]) == 2 and out[side]["median_s"] > 0
    assert out["ratio"] == out["pipelib"]["median_s"] / out["torch"]["median_s"]


@pytest.mark.parametrize("name,p,m", [("gpipe", 4, 8), ("interleaved_1f1b", 4, 8), ("zb_h1", 3, 6),
                                      ("interleaved_zero_bubble", 2, 4), ("zbv", 4, 3),
                                      ("dualpipe_v", 2, 6)])
def test_torchs_own_order_is_pipelibs(name, p, m):
    theirs, ours = torch_pipeline_order(name, p, m), resolve_schedule(name, p, m)
    assert theirs.actions == ours.actions and theirs.stage_to_rank == ours.stage_to_rank


def test_torchs_1f1b_drawing_differs_on_the_last_rank_only():
    theirs, ours = torch_pipeline_order("1f1b", 4, 8), resolve_schedule("1f1b", 4, 8)
    assert theirs.actions[:3] == ours.actions[:3]
    assert str(theirs.actions[3][0]) == "3F1" and str(ours.actions[3][0]) == "3F0"


class NoCluster:
    world_size = 4

    def run(self, *a, **k):
        raise AssertionError("the cluster must not be asked to run anything")


@pytest.mark.parametrize("args,match", [
    (("naive", 4, 4), r"schedule 'naive' has no counterpart in torch"),
    (("1f1b", 4, 2), r"Schedule1F1B refuses m=2 microbatches with p=4 stages"),
    (("dualpipe_v", 4, 4), r"m=4 < 2p = 8"),
    (("zbv", 8, 8, MLPConfig(num_layers=16)), r"needs 8 ranks; the cluster has 4"),
    ((resolve_schedule("gpipe", 2, 2), 2, 2), r"runs its own schedules, chosen by name"),
])
def test_bad_input_fails_in_the_notebook(args, match):
    with pytest.raises(ValueError, match=match):
        run_torch_train_step(NoCluster(), *args)
