"""Chapter 16's check of a measured MoE pipeline against `simulate`, as library calls:
`action_trace` gives the measured actions as a Trace, and `Trace.matches(..., ranks=)` compares
the ranks of a pp x ep mesh with the prediction's pp ranks (several ranks follow one)."""
import pytest

from pipelib.expert_parallel.layer import MoESpec
from pipelib.expert_parallel.pipelined import (
    action_spans,
    action_trace,
    exchange_costs,
    latency_only,
    moe_pipeline_step,
)
from pipelib.pipeline.schedules import resolve_schedule
from pipelib.pipeline.simulate import simulate
from pipelib.topology import Topology
from pipelib.trace import Event, Kind, Trace


def ev(rank, start, end, label="F", kind=Kind.COMPUTE, stage=0, microbatch=0):
    return Event(rank, kind, label, start, end, stage=stage, microbatch=microbatch)


# the prediction: 2 pipeline ranks; the run: 4 ranks, ranks 0 and 1 at pp 0, ranks 2 and 3 at pp 1
PREDICTED = Trace([ev(0, 0, 1), ev(0, 1, 3, "B"), ev(1, 1, 2), ev(1, 2, 4, "B")])
PP_OF = {0: 0, 1: 0, 2: 1, 3: 1}


def run_of(shift=0.0):
    evs = [Event(r, e.kind, e.label, e.start + shift * r, e.end + shift * r, stage=e.stage,
                 microbatch=e.microbatch) for r in PP_OF for e in PREDICTED.events if e.rank == PP_OF[r]]
    return Trace(evs + [ev(0, 0, 9, "all_reduce", Kind.COLLECTIVE)])  # not compute: ignored


def test_matches_with_a_rank_map_compares_every_rank_with_the_one_it_follows():
    assert run_of().matches(PREDICTED, ranks=PP_OF, tol=0) == 0.0
    assert run_of().matches(PREDICTED, ranks=[0, 0, 1, 1]) == 0.0  # a list indexed by rank
    assert run_of(1e-3).matches(PREDICTED, ranks=PP_OF) == pytest.approx(3e-3)  # rank 3, shifted 3 ms
    with pytest.raises(AssertionError, match=r"rank 3's compute 'F'.*\(tolerance 0.002 s\)"):
        run_of(1e-3).matches(PREDICTED, ranks=PP_OF, tol=2e-3)
    with pytest.raises(AssertionError, match="rank 2 ran another order"):  # rank r against rank r: none there
        run_of().matches(PREDICTED)


def test_matches_with_a_rank_map_names_the_rank_that_differs_and_the_one_it_follows():
    wrong = Trace([e if e.rank != 2 or e.label != "B" else ev(2, 2, 4, "W") for e in run_of()])
    with pytest.raises(AssertionError, match=r"rank 2 ran another order: event 1 is compute 'W'.*\(its rank 1\)"):
        wrong.matches(PREDICTED, ranks=PP_OF)
    with pytest.raises(AssertionError, match=r"rank 3 ran another order: event 0 is missing"):
        Trace([e for e in run_of() if e.rank != 3]).matches(PREDICTED, ranks=PP_OF)


def test_matches_refuses_a_rank_map_that_leaves_a_rank_out():
    with pytest.raises(ValueError, match=r"ranks \[3\] have events here"):
        run_of().matches(PREDICTED, ranks={0: 0, 1: 0, 2: 1})
    with pytest.raises(AssertionError, match=r"the prediction's ranks \[1\] have events that no rank here follows"):
        run_of().filter(rank=0).matches(PREDICTED, ranks={0: 0})


def test_action_trace_starts_an_action_alone_at_its_first_all_to_all():
    a2a = dict(kind=Kind.COLLECTIVE, stage=None, microbatch=None)
    measured = Trace([
        ev(0, 0.0, 0.1, "all_to_all_uneven: moe 0 dispatch", **a2a),  # before F alone: F starts here
        ev(0, 0.1, 0.2, "all_to_all_uneven: moe 0 combine", **a2a),
        ev(0, 0.2, 1.0, "F"),
        ev(0, 1.0, 2.0, "F", microbatch=1),                            # a pair: its all-to-alls on the lane
        ev(0, 1.0, 1.5, "all_to_all_uneven: moe 0 dispatch", **a2a),
        ev(0, 2.0, 4.0, "B"),
        ev(0, 4.0, 4.5, "optimizer"),                                   # not an action
        ev(1, 0.5, 0.7, "all_to_all_uneven: moe 0 dispatch", **a2a),
        ev(1, 0.7, 1.2, "F"),
    ], world_size=2)
    actions = action_trace(measured)
    assert [(e.rank, e.label, e.microbatch, e.start, e.end) for e in actions] == [
        (0, "F", 0, 0.0, 1.0), (1, "F", 0, 0.5, 1.2), (0, "F", 1, 1.0, 2.0), (0, "B", 0, 2.0, 4.0)]
    assert {e.kind for e in actions} == {Kind.COMPUTE} and actions.world_size == 2
    for r in range(2):  # the tuples of the older call are the same actions
        assert action_spans(measured, r) == [(e.label, e.stage, e.microbatch, e.start, e.end)
                                             for e in actions.filter(rank=r)]


@pytest.mark.cluster
def test_measured_moe_pipeline_matches_simulate_on_every_rank_of_the_mesh(cluster4):
    """Chapter 16's check, on the cluster: DualPipeV on pp=2 x ep=2, every rank against its pp rank."""
    p, m, ep, alpha = 2, 4, 2, 1e-3
    costs = exchange_costs(alpha, ep, F=1e-3, B=2e-3, I=1e-3, W=1e-3)
    cluster4.reset()
    cluster4.run(moe_pipeline_step, "dualpipe_v", p, m, MoESpec(num_experts=4, k=2), ep=ep, costs=costs,
                 profile=latency_only("toy-gpu", alpha), timeout=120)
    actions = action_trace(cluster4.trace())
    predicted = simulate(resolve_schedule("dualpipe_v", p, m), costs)
    topo = Topology(pp=p, dp=ep, ep=ep)
    worst = actions.matches(predicted.events, ranks={r: topo.coords(r).pp for r in range(4)})
    assert worst < 1e-12 and actions.end == pytest.approx(predicted.makespan, abs=1e-12)
    assert {e.rank for e in actions} == {0, 1, 2, 3}
