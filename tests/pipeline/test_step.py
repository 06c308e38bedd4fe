"""The pipeline executor on the live cluster: every schedule equals the monolith, its timeline
equals `simulate`, its activation memory is what theory says, and bad input fails early."""
import pytest

from pipelib.recipe import Recipe
import torch

from pipelib.costmodel import get_profile
from pipelib.model import MLPConfig
from pipelib.pipeline.schedules import ScheduleDeadlock, as_schedule, resolve_schedule
from pipelib.pipeline.schedules.registry import REGISTRY
from pipelib.pipeline.simulate import Costs, simulate
from pipelib.pipeline.stage import partition, split_into_stages
from pipelib.pipeline.step import check_step, run_train_step, train_step
from pipelib.results import check_against_reference
from pipelib.trace import Kind

pytestmark = pytest.mark.cluster

CFG = MLPConfig(in_features=16, hidden=16, out_features=10, num_layers=8)
ROWS = 2  # rows per microbatch
SCHEDULES = list(REGISTRY)  # every registered schedule, so a new one is run here at once
PS = [2, 3, 4]


def ms(p):
    return sorted({1, 2, max(1, p - 1), p, 2 * p, 4 * p})


def cases(p):
    out = []
    for name in SCHEDULES:
        for m in ms(p):
            try:
                resolve_schedule(name, p, m)
            except ValueError:
                continue  # not defined for this (p, m), e.g. interleaved's m rule
            out.append((name, m))
    return out


def _run_cases(p, todo):
    """On every engine: one train_step per case (ranks >= p have no work and return None)."""
    return [train_step(name, p, m, CFG, batch_seed=m) for name, m in todo]


@pytest.fixture(scope="module", params=PS, ids=[f"p{p}" for p in PS])
def matrix(request, cluster4):
    p = request.param
    todo = cases(p)
    for name, m in todo:  # everything is checked here, before any engine works
        check_step(name, p, m, CFG, ROWS * m, world_size=cluster4.world_size)
    per_rank = cluster4.run(_run_cases, p, todo, timeout=120)
    return p, {case: [per_rank[r][i] for r in range(p)] for i, case in enumerate(todo)}


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_schedule_equals_the_monolith(matrix, name):
    p, results = matrix
    ran = [m for (n, m) in results if n == name]
    assert ran, f"{name} ran for no m with p={p}"
    for m in ran:
        agreed = check_against_reference(results[name, m], Recipe(CFG, batch_size=ROWS * m, data_seed=m).first_step())
        assert agreed.num_tensors == 2 * CFG.num_layers, f"{name} p={p} m={m}: {agreed}"


def test_the_matrix_covers_every_schedule_and_m():
    assert ("interleaved_1f1b", 16) in cases(4) and ("zbv", 1) in cases(2)
    assert {m for n, m in cases(3) if n == "1f1b"} == {1, 2, 3, 6, 12}


# ----------------------------------------------------------------------------- timeline
def _timed(name, p, m, costs):
    return train_step(name, p, m, CFG, batch_seed=0, costs=costs)


@pytest.mark.parametrize("name,p,m", [("gpipe", 4, 4), ("1f1b", 4, 8), ("interleaved_1f1b", 4, 8),
                                      ("zb_h1", 3, 6), ("zbv", 4, 8), ("naive", 2, 3),
                                      ("dualpipe_v", 2, 4)])
def test_measured_timeline_equals_simulate(cluster4, name, p, m):
    profile = get_profile(cluster4.spec.profile)
    costs = Costs(F=1e-3, B=2e-3, I=1e-3, W=1e-3, p2p=profile.message_time,
                  message_bytes=ROWS * CFG.hidden * 4)
    cluster4.reset()
    cluster4.run(_timed, name, p, m, costs)
    measured = cluster4.trace().filter(kind=Kind.COMPUTE)
    predicted = simulate(resolve_schedule(name, p, m), costs).events.filter(kind=Kind.COMPUTE)
    assert len(measured) == len(predicted) == sum(len(a) for a in resolve_schedule(name, p, m).actions)
    measured.matches(predicted, tol=1e-12)  # rank by rank: the same ops, in order, at the same times


def _ahead(recv_ahead, costs):
    return train_step("zbv", 4, 8, CFG, batch_seed=8, costs=costs, recv_ahead=recv_ahead)


@pytest.mark.parametrize("recv_ahead", [0, 3])
def test_receives_posted_ahead_change_neither_gradients_nor_timeline(cluster4, recv_ahead):
    """Posting receives early changes when bytes may flow, not what is computed or in which order."""
    costs = Costs(F=1e-3, B=2e-3, I=1e-3, W=1e-3, p2p=get_profile(cluster4.spec.profile).message_time,
                  message_bytes=ROWS * CFG.hidden * 4)
    cluster4.reset()
    check_against_reference(cluster4.run(_ahead, recv_ahead, costs),
                            Recipe(CFG, batch_size=ROWS * 8, data_seed=8).first_step())
    cluster4.trace().matches(simulate(resolve_schedule("zbv", 4, 8), costs).events, tol=1e-12)


def _steps():
    return train_step("1f1b", 4, 4, CFG, batch_seed=4, steps=3, timed=True)


def test_repeated_steps_give_one_steps_gradients_and_times(cluster4):
    res = cluster4.run(_steps)
    assert all(len(r.times) == 3 and min(r.times) > 0 for r in res)
    assert all(len(r.bytes_sent) == 3 and len(set(r.bytes_sent)) == 1 for r in res)  # the same step thrice
    check_against_reference(res, Recipe(CFG, batch_size=ROWS * 4, data_seed=4).first_step())


def _measured(costs):
    from pipelib.runtime.device import current

    dev = current()
    before = (dev.memory, dev.memory.capacity, dev.memory.peak)
    r = train_step("1f1b", 4, 4, CFG, batch_seed=4, costs=costs)
    return r, before == (dev.memory, dev.memory.capacity, dev.memory.peak)


def test_step_results_are_the_devices_measurement_and_leave_it_alone(cluster4):
    """times on the device's (virtual) clock, bytes_sent and peak_bytes from `Device.measure`
    scopes: the trace's bytes, and the device's own tracker untouched afterwards."""
    costs = Costs(F=1e-3, B=2e-3, p2p=get_profile(cluster4.spec.profile).message_time,
                  message_bytes=ROWS * CFG.hidden * 4)
    cluster4.reset()
    per_rank = cluster4.run(_measured, costs)
    trace = cluster4.trace()
    makespan = simulate(resolve_schedule("1f1b", 4, 4), costs).makespan
    for rank, (r, untouched) in enumerate(per_rank):
        assert untouched, f"rank {rank}: the step replaced or changed the device's tracker"
        assert r.bytes_sent == (trace.bytes_sent(rank),) and "bytes_sent" not in r.stats
        assert r.stats["messages"] * ROWS * CFG.hidden * 4 == r.bytes_sent[0]
        assert r.peak_bytes >= r.stats["base_bytes"] + r.stats["peak_activation_bytes"] > 0
        assert 0 < r.times[0] <= makespan + 1e-12  # each rank's own span, on its virtual clock
    assert max(r.times[0] for r, _ in per_rank) == pytest.approx(makespan, abs=1e-12)  # the step's


def test_an_unknown_keyword_fails_in_the_notebook():
    with pytest.raises(TypeError, match=r"train_step: unknown keyword\(s\) \['cost'\]; the known ones"):
        run_train_step(NoCluster(), "1f1b", 2, 2, CFG, cost=None)


def test_kept_shapes_refuse_another_batch_shape():
    from pipelib.pipeline.shapes import cached_shapes

    s = resolve_schedule("gpipe", 2, 2)
    cache = {(s, 0): (((2, 16), torch.float32), {0: ((2, 16), torch.float32)}, {})}
    with pytest.raises(ValueError, match=r"microbatches of \(\(4, 16\), torch.float32\) but the shapes"):
        cached_shapes(s, {}, 0, None, torch.zeros(4, 16), cache)
    assert cached_shapes(s, {}, 0, None, torch.zeros(2, 16), cache) == cache[s, 0][1:]


def _sends(name, p, m):
    from pipelib.runtime.device import current

    train_step(name, p, m, CFG, batch_seed=0)
    return [(e.label, e.stage, e.microbatch, e.peer) for e in current().tracer.take()
            if e.kind == Kind.SEND]


def test_sends_are_labelled_and_neighbours_on_one_rank_send_nothing(cluster4):
    cluster4.reset()
    sends = cluster4.run(_sends, "zbv", 2, 2)
    # ZB-V on 2 ranks: stages 0,3 on rank 0 and 1,2 on rank 1. 1->2 and 3->... are local.
    assert sorted(sends[0]) == sorted([("act", 0, j, 1) for j in range(2)] + [("grad", 3, j, 1) for j in range(2)])
    assert sorted(sends[1]) == sorted([("act", 2, j, 0) for j in range(2)] + [("grad", 1, j, 0) for j in range(2)])


# ----------------------------------------------------------------------------- memory
def _memory(name, p, m):
    return train_step(name, p, m, CFG, batch_seed=0)


def test_peak_activation_memory_gpipe_m_and_1f1b_p_minus_rank(cluster4):
    p, m = 4, 8
    per_mb = [r.stats["peak_activation_bytes"] for r in cluster4.run(_memory, "naive", p, m)]
    gp = [r.stats["peak_activation_bytes"] for r in cluster4.run(_memory, "gpipe", p, m)]
    ofob = [r.stats["peak_activation_bytes"] for r in cluster4.run(_memory, "1f1b", p, m)]
    assert all(b > 0 for b in per_mb)
    assert gp == [m * b for b in per_mb]
    assert ofob == [min(p - r, m) * b for r, b in enumerate(per_mb)]
    # rank 1 runs layers 2 and 3, each Linear then ReLU, on (2, 16) floats (128 B): it keeps the
    # received input (Linear 2), ReLU 2's output (also Linear 3's input) and ReLU 3's output
    assert per_mb[1] == 3 * ROWS * CFG.hidden * 4


# ----------------------------------------------------------------------------- groups
def _subgroup():
    import torch.distributed as dist

    group = dist.new_group([2, 3])
    if dist.get_rank() in (2, 3):
        return train_step("1f1b", 2, 4, CFG, batch_seed=4, group=group)
    return None


def test_a_pipeline_on_a_subgroup(cluster4):
    res = cluster4.run(_subgroup)
    assert res[:2] == [None, None]
    check_against_reference(res, Recipe(CFG, batch_size=ROWS * 4, data_seed=4).first_step())


# ----------------------------------------------------------------------------- faults
def _rank0_never_sends():
    """Rank 0 tells its shapes, then leaves: rank 1 waits for 1F0's activation forever."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from pipelib.model import MLP
    from pipelib.pipeline.executor import execute
    from pipelib.pipeline.schedules import naive
    from pipelib.pipeline.shapes import exchange_shapes
    from pipelib.pipeline.stage import Stage, split_into_stages

    s = naive(2, 1)
    modules = split_into_stages(MLP(CFG).layers, 2)
    me = dist.get_rank()
    stage = Stage(modules[me], me, 2)
    x, y = torch.randn(2, CFG.in_features), torch.randint(0, CFG.out_features, (2,))
    if me == 0:
        exchange_shapes(s, {0: stage}, 0, None, x)
        return "left"
    return execute(s, [stage], None, y, F.cross_entropy)


def test_a_receive_that_never_arrives_names_the_rank_and_the_action():
    from pipelib.runtime.cluster import Cluster
    from pipelib.runtime.errors import RankTimeoutError

    with Cluster(2, timeout=3) as cluster:
        with pytest.raises(RankTimeoutError, match=r"rank 1 did not finish .*act for 1F0: recv "
                                                   r"from rank 0") as err:
            cluster.run(_rank0_never_sends)
        assert err.value.ranks == [1]


# ----------------------------------------------------------------------------- bad input
class NoCluster:
    world_size = 4

    def run(self, *a, **k):
        raise AssertionError("the cluster must not be asked to run anything")


def _deadlocked():
    # rank 0 runs naive (waits for 1B0's gradient before sending 0F1), rank 1 runs GPipe
    # (needs 0F1's activation before it runs 1B0): a cycle.
    return as_schedule({0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]})


@pytest.mark.parametrize("args,kw,match", [
    (("1f1b", 2, 0), {}, r"m=0"),
    (("2f2b", 2, 2), {}, r"unknown schedule '2f2b'; choose one of"),
    (("1f1b", 4, 2, MLPConfig(num_layers=3)), {}, r"cannot split 3 layers into num_stages=4"),
    (("interleaved_1f1b", 4, 4, MLPConfig(num_layers=4)), {}, r"num_stages=8"),
    (("gpipe", 2, 2), {"batch_size": 7}, r"batch_size=7 cannot be split into m=2"),
    (("1f1b", 8, 8, CFG), {}, r"needs 8 ranks; the cluster has 4"),
    ((_deadlocked(),), {}, r"(?s)deadlocks.*rank 0 waits at step 1 on 0B0"),
])
def test_bad_input_fails_in_the_notebook_before_any_engine_work(args, kw, match):
    with pytest.raises(ValueError, match=match) as err:
        run_train_step(NoCluster(), *args, **kw)
    if "deadlock" in match:
        assert isinstance(err.value, ScheduleDeadlock)


def test_split_into_stages():
    layers = [torch.nn.Linear(4, 4) for _ in range(5)] + [torch.nn.Linear(4, 40)]
    assert [len(s) for s in split_into_stages(layers, 3)] == [2, 2, 2]
    assert [len(s) for s in split_into_stages(layers, 4)] == [2, 2, 1, 1]
    assert [len(s) for s in split_into_stages(layers, 2, "cost")] == [5, 1]
    assert [len(s) for s in split_into_stages(layers, 2, [1, 5])] == [1, 5]
    assert split_into_stages(layers, 2)[0][0] is layers[0]  # shared, not copied
    assert partition(7, 7) == [range(k, k + 1) for k in range(7)]
    for bad, match in [((layers, 7), "cannot split 6 layers into num_stages=7"),
                       ((layers, 0), "num_stages=0"),
                       ((layers, 2, [3, 4]), r"balance=\[3, 4\] must list num_stages=2"),
                       ((layers, 2, "flops"), "balance='flops'")]:
        with pytest.raises(ValueError, match=match):
            split_into_stages(*bad)
