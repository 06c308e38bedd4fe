"""The step-by-step sharded model and orchestrator (chapters 10-11): the hand-written loops train
exactly like the monolith and like `execute`, their timelines are `simulate`'s, the per-stage
formulas match what the cluster measures, and bad input fails in the notebook."""
import pytest
import torch
from torch.testing import assert_close

from pipelib import memory
from pipelib.costmodel import get_profile
from pipelib.data import spirals
from pipelib.model import MLP, MLPConfig
from pipelib.pipeline import handwritten as sharded
from pipelib.pipeline.schedules import gpipe, naive
from pipelib.pipeline.simulate import Costs, simulate
from pipelib.pipeline.step import run_train_step
from pipelib.results import check_against_reference
from pipelib.trace import Kind
from pipelib.train import train_mlp

CFG = MLPConfig(in_features=2, hidden=16, out_features=3, num_layers=6)
X, Y = spirals(96, seed=0)
STEPS, BATCH, LR = 4, 24, 1e-2


def _monolith(steps=STEPS, batch_size=BATCH):
    model = MLP(CFG, seed=0)
    losses = train_mlp(model, X, Y, steps=steps, lr=LR, batch_size=batch_size, seed=0)
    return losses, {n: p.grad for n, p in model.named_parameters()}, dict(model.named_parameters())


# ----------------------------------------------------------------------------- pure
def test_stage_flops_follow_the_split():
    assert sharded.stage_flops(CFG, 3, "layers") == [2 * (2 * 16 + 16 * 16), 2 * 2 * 16 * 16,
                                                     2 * (16 * 16 + 16 * 3)]
    for balance in ("layers", "cost", [1, 1, 1, 3]):
        flops = sharded.stage_flops(CFG, 4, balance, rows=5)
        assert sum(flops) == memory.mlp_forward_flops(CFG, 5)
    lopsided = max(sharded.stage_flops(CFG, 4, "layers"))
    assert max(sharded.stage_flops(CFG, 4, "cost")) < lopsided


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_stage_activation_bytes_sum_to_the_monolith_plus_the_cuts(p):
    per_stage = sharded.stage_activation_bytes(CFG, p, rows=7)
    cuts = (p - 1) * 4 * 7 * CFG.hidden  # each activation at a cut is kept on both sides
    assert sum(per_stage) == memory.mlp_activation_bytes(CFG, 7) + cuts


class NoCluster:
    world_size = 4

    def run(self, *a, **k):
        raise AssertionError("the cluster must not be asked to run anything")


@pytest.mark.parametrize("kw,match", [
    ({"num_stages": 5}, r"num_stages=5 stages need 5 ranks but the group has 4"),
    ({"num_stages": 0}, r"num_stages=0"),
    ({"schedule": "1f1b", "hand_written": True}, r"hand_written=True knows schedules \['gpipe', 'naive'\], not '1f1b'"),
    ({"schedule": "2f2b"}, r"unknown schedule '2f2b'"),
    ({"schedule": "gpipe", "num_microbatches": 5, "batch_size": 24}, r"24 rows cannot be split into m=5"),
    ({"balance": [1, 1, 1, 1]},
     r"balance=\[1, 1, 1, 1\] must list num_stages=4 positive layer counts summing to num_layers=6"),
])
def test_bad_input_fails_before_any_engine_work(kw, match):
    with pytest.raises(ValueError, match=match):
        sharded.run_train(NoCluster(), CFG, X, Y, STEPS, **kw)
    with pytest.raises(ValueError, match="steps=0"):
        sharded.run_train(NoCluster(), CFG, X, Y, 0)
    with pytest.raises(ValueError, match="cannot split 6 layers into num_stages=7"):
        sharded.run_train(type("Big", (NoCluster,), {"world_size": 8})(), CFG, X, Y, 1, num_stages=7)


# ----------------------------------------------------------------------------- on the cluster


@pytest.mark.cluster
@pytest.mark.parametrize("p,schedule,m,hand", [
    (4, "naive", 1, True), (4, "naive", 1, False), (2, "naive", 3, True),
    (4, "gpipe", 4, True), (3, "gpipe", 2, False), (4, "1f1b", 4, False),
])
def test_the_orchestrator_trains_like_the_monolith(cluster4, p, schedule, m, hand):
    ref_losses, ref_grads, ref_params = _monolith()
    res = sharded.run_train(cluster4, CFG, X, Y, STEPS, num_stages=p, schedule=schedule,
                            num_microbatches=m, lr=LR, batch_size=BATCH, hand_written=hand,
                            timeout=120)
    assert res[p:] == [None] * (4 - p)
    assert [r.losses == () for r in res[:p]] == [True] * (p - 1) + [False]
    assert_close(torch.tensor(res[p - 1].losses), torch.tensor(ref_losses))
    agreed = check_against_reference(res, ref_losses[-1], ref_grads,
                                     ref_params={n: t.detach() for n, t in ref_params.items()})
    assert agreed.num_tensors == 2 * len(ref_grads)
    if m == 1:  # one microbatch: the very same float operations as the monolith
        assert list(res[p - 1].losses) == ref_losses


def _compute(trace, rank):
    return [(e.label, e.stage, e.microbatch, e.start, e.end)
            for e in trace.filter(rank=rank, kind=Kind.COMPUTE)]


@pytest.mark.cluster
def test_hand_written_naive_timeline_is_simulates_and_executes(cluster4):
    profile = get_profile(cluster4.spec.profile)
    costs = Costs(F=1e-3, B=2e-3, p2p=profile.message_time, message_bytes=BATCH * CFG.hidden * 4)
    traces = {}
    for hand in (True, False):
        cluster4.reset()
        sharded.run_train(cluster4, CFG, X, Y, 1, batch_size=BATCH, costs=costs, hand_written=hand,
                          timeout=120)
        traces[hand] = sharded.pipeline_trace(cluster4)
    predicted = simulate(naive(4, 1), costs).events
    for r in range(4):
        want = _compute(predicted, r)
        for hand in (True, False):
            got = _compute(traces[hand], r)
            assert [g[:3] for g in got] == [w[:3] for w in want]
            for g, w in zip(got, want):
                assert g[3:] == pytest.approx(w[3:], abs=1e-12)
    sends = traces[True].filter(kind=Kind.SEND)
    assert len(sends) == 2 * 3 and {e.bytes for e in sends} == {BATCH * CFG.hidden * 4}
    assert traces[True].bubble_fraction() == pytest.approx(simulate(naive(4, 1), costs).bubble, abs=1e-12)


@pytest.mark.cluster
def test_hand_written_gpipe_runs_the_gpipe_order(cluster4):
    cluster4.reset()
    sharded.run_train(cluster4, CFG, X, Y, 1, num_stages=3, schedule="gpipe", num_microbatches=4,
                      batch_size=BATCH, costs=Costs(F=1e-3, B=2e-3), hand_written=True,
                      timeout=120)
    trace = sharded.pipeline_trace(cluster4, 3)
    assert trace.world_size == 3 and not trace.filter(rank=3).events
    for r, acts in enumerate(gpipe(3, 4).actions):
        assert [f"{s}{op}{j}" for op, s, j, *_ in _compute(trace, r)] == [str(a) for a in acts]


@pytest.mark.cluster
@pytest.mark.parametrize("balance", ["layers", "cost"])
def test_stage_activation_bytes_are_what_the_cluster_measures(cluster4, balance):
    rows = 6
    res = run_train_step(cluster4, "naive", 4, 1, CFG, batch_size=rows, balance=balance,
                         timeout=120)
    measured = [r.stats["peak_activation_bytes"] for r in res]
    assert measured == sharded.stage_activation_bytes(CFG, 4, rows, balance)
