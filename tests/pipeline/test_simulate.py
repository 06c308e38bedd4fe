"""Pure tests of pipelib.pipeline.simulate: timelines, bubbles against closed forms, memory, deadlocks."""
import pytest

from pipelib.pipeline.schedules import (
    Action,
    Op,
    ScheduleDeadlock,
    as_schedule,
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    looped_bfs,
    naive,
    one_f_one_b,
    zbv,
    zero_bubble_h1,
    zero_bubble_h2,
)
from pipelib.pipeline.simulate import Costs, SimResult, bubble_closed_form, simulate
from pipelib.trace import Event, Kind, Trace

PS = [2, 3, 4, 8]
UNEQUAL = Costs(F=1, B=2, I=1, W=1)
EQUAL = Costs(F=1, B=1, I=0.5, W=0.5)


def ms(p):
    return sorted({1, 2, max(1, p - 1), p, 2 * p, 4 * p})


def grid():
    return [(p, m) for p in PS for m in ms(p)]


@pytest.mark.parametrize("p,m", grid())
@pytest.mark.parametrize("costs", [UNEQUAL, EQUAL], ids=["B=2F", "B=F"])
@pytest.mark.parametrize("gen,name", [(gpipe, "gpipe"), (one_f_one_b, "1f1b")])
def test_gpipe_and_1f1b_bubble_is_the_closed_form(gen, name, costs, p, m):
    r = simulate(gen(p, m), costs)
    assert r.bubble == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert r.bubble == pytest.approx(bubble_closed_form(name, p, m, costs=costs), abs=1e-12)
    assert r.bubble_relative == pytest.approx((p - 1) / m)
    assert r.makespan == pytest.approx((m + p - 1) * (costs.F + costs.B))


@pytest.mark.parametrize("p", PS)
def test_naive_is_stop_and_wait(p):
    r = simulate(naive(p, 3), UNEQUAL)
    assert r.bubble == pytest.approx((p - 1) / p) == bubble_closed_form("naive", p, 3)
    assert r.makespan == pytest.approx(3 * p * 3)


@pytest.mark.parametrize("p,m", [(p, m) for p in PS for m in (p, 2 * p, 4 * p)] + [(4, 5), (3, 4)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_bubble_is_the_closed_form(p, m, v):
    r = simulate(interleaved_1f1b(p, m, v), UNEQUAL.scaled(1 / v))  # a chunk is 1/v of a stage
    assert r.bubble == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-9)
    assert bubble_closed_form("interleaved_1f1b", p, m, v, relative=True) == pytest.approx((p - 1) / (v * m))
    assert r.bubble < simulate(one_f_one_b(p, m), UNEQUAL).bubble


def test_interleaved_below_p_microbatches_is_worse_than_the_formula():
    r = simulate(interleaved_1f1b(4, 2, 2), UNEQUAL.scaled(0.5))
    assert r.bubble > (4 - 1) / (2 * 2 + 4 - 1)
    with pytest.raises(ValueError, match="no closed form"):
        bubble_closed_form("interleaved_1f1b", 4, 2, 2)


def test_two_stage_utilisation_reference_numbers():
    # FACTS.md: 2 stages, m=1 -> 50 % utilisation, m=4 -> 80 %, m=8 -> 89 %.
    util = [1 - simulate(one_f_one_b(2, m)).bubble for m in (1, 4, 8)]
    assert [round(u, 2) for u in util] == [0.5, 0.8, 0.89]


@pytest.mark.parametrize("p,m", grid())
def test_peak_inflight_1f1b_is_min_p_minus_rank_m_and_gpipe_is_m(p, m):
    assert simulate(one_f_one_b(p, m)).peak_inflight == tuple(min(p - r, m) for r in range(p))
    assert simulate(gpipe(p, m)).peak_inflight == (m,) * p


@pytest.mark.parametrize("p,m", [(p, m) for p in PS for m in (p, 2 * p, 4 * p)])
def test_zero_bubble_h1_cuts_the_bubble_to_a_third_at_1f1b_memory(p, m):
    costs = Costs(F=1, B=2, I=1, W=1)  # B = I + W
    zb, base = simulate(zero_bubble_h1(p, m), costs), simulate(one_f_one_b(p, m), costs)
    assert zb.bubble < base.bubble
    assert zb.bubble == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
    assert zb.bubble_relative == pytest.approx((p - 1) / (3 * m)) == pytest.approx(base.bubble_relative / 3)
    assert max(zb.peak_inflight) == max(base.peak_inflight) == p  # the first rank sets the peak
    # Deferred Ws keep activations (freed at W, not I): every rank now holds p, as in the paper.
    assert zb.peak_inflight == (p,) * p and base.peak_inflight == tuple(range(p, 0, -1))


@pytest.mark.parametrize("costs", [Costs(F=1, I=1.5, W=0.5), Costs(F=1, I=0.8, W=1.2)])
def test_zero_bubble_h1_general_costs(costs):
    # Bubble per rank (p-1) max(F, F+I-W): W fills the drain, but no rank starts before the fill.
    for p, m in [(3, 6), (4, 8)]:
        r = simulate(zero_bubble_h1(p, m), costs)
        assert r.bubble == pytest.approx(bubble_closed_form("zb_h1", p, m, costs=costs), abs=1e-12)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_zbv_bubble_near_zero_for_large_m(p):
    chunk = Costs(F=0.5, B=1, I=0.5, W=0.5)  # two chunks per rank, each half a stage
    rs = {m: simulate(zbv(p, m), chunk) for m in (2 * p, 4 * p, 16 * p)}
    for m, r in rs.items():
        assert r.bubble == pytest.approx(bubble_closed_form("zbv", p, m, costs=chunk), abs=1e-12)
        assert r.bubble < simulate(zero_bubble_h1(p, m), UNEQUAL).bubble
    assert rs[16 * p].bubble < 0.01
    assert max(rs[4 * p].peak_inflight) == 2 * p  # 2p half-size chunks: 1F1B's p stages' worth


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_zb_h2_is_a_parallelogram_at_2p_minus_1_microbatches_of_memory(p):
    for m in range(1, 4 * p + 1):
        r = simulate(zero_bubble_h2(p, m), UNEQUAL)
        assert max(r.peak_inflight) == min(2 * p - 1, m)  # Qi et al.: (2p - 1) M_B
        if m >= p:  # the step's span: ZB-H1's bubble, (p-1) F per rank
            assert r.bubble == pytest.approx(bubble_closed_form("zb_h2", p, m, costs=UNEQUAL), abs=1e-12)
            assert r.bubble == pytest.approx(simulate(zero_bubble_h1(p, m), UNEQUAL).bubble, abs=1e-12)
        # each rank's own span (Qi et al.'s count): no idle once m >= 2p-1; ZB-H1 idles (p-1-r) F
        assert (max(r.own_span_idle) == 0) == (m >= 2 * p - 1 or p == 1), m
    h1 = simulate(zero_bubble_h1(p, 4 * p), UNEQUAL)
    assert h1.own_span_idle == pytest.approx([(p - 1 - r) * UNEQUAL.F for r in range(p)])


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_zbv_has_no_idle_in_each_ranks_own_span(p):
    chunk = Costs(F=0.5, B=1, I=0.5, W=0.5)
    for m in range(2 * p - 1, 4 * p + 1):
        assert max(simulate(zbv(p, m), chunk).own_span_idle) == 0, m
    assert simulate(zbv(p, 4 * p), chunk).bubble_relative == pytest.approx((p - 1) / (24 * p))
    assert max(simulate(zbv(p, 2 * p - 2), chunk).own_span_idle) > 0


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 12)])
def test_v_schedules_send_twice_the_messages_of_1f1b(p, m):
    def sends(s):
        return len(simulate(s).events.filter(kind=Kind.SEND))
    assert sends(one_f_one_b(p, m)) == sends(zero_bubble_h1(p, m)) == 2 * m * (p - 1)
    assert sends(zbv(p, m)) == sends(dualpipe_v(p, m)) == 4 * m * (p - 1)  # 2p stages, turn local
    assert sends(interleaved_1f1b(p, m, 2)) == 2 * m * (2 * p - 1)          # loop back to rank 0


def test_stage_slowest_forward_and_another_slowest_backward():
    """GPipe's step is sum(f + b) + (m-1)(max f + max b), not (m-1) max(f + b)."""
    p, m = 4, 8
    costs = Costs(F=1, B=2, stage_factor=(1, 3, 1, 1), backward_factor=(1, 1, 2, 1))
    f = [costs.compute(Op.F, s) for s in range(p)]
    b = [costs.compute(Op.B, s) for s in range(p)]
    assert (f, b) == ([1, 3, 1, 1], [2, 2, 4, 2])
    r = simulate(gpipe(p, m), costs)
    assert r.makespan == pytest.approx(sum(f) + sum(b) + (m - 1) * (max(f) + max(b)))
    assert r.makespan > sum(f) + sum(b) + (m - 1) * max(x + y for x, y in zip(f, b))
    with pytest.raises(ValueError, match="backward_factor"):
        Costs(backward_factor=(1, -1))


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 6, 3)])
def test_looped_bfs_has_interleavings_bubble_and_gpipes_memory(p, m, v):
    chunk = UNEQUAL.scaled(1 / v)
    bfs, inter = simulate(looped_bfs(p, m, v), chunk), simulate(interleaved_1f1b(p, m, v), chunk)
    assert bfs.bubble == pytest.approx(inter.bubble, abs=1e-12)
    assert bfs.bubble == pytest.approx(bubble_closed_form("looped_bfs", p, m, v, costs=chunk), abs=1e-12)
    assert bfs.peak_inflight == (m * v,) * p       # m microbatches of every chunk: GPipe's m stages


def test_dualpipe_v_simulates():
    r = simulate(dualpipe_v(4, 16), Costs(F=0.5, B=1, I=0.5, W=0.5))
    assert 0 < r.bubble < simulate(one_f_one_b(4, 16)).bubble


def test_closed_form_argument_errors():
    with pytest.raises(ValueError, match="no closed form for schedule 'dualpipe_v'"):
        bubble_closed_form("dualpipe_v", 4, 16)
    with pytest.raises(ValueError, match="F = I = W"):
        bubble_closed_form("zbv", 4, 16, costs=Costs(F=1, I=2, W=1))
    with pytest.raises(ValueError, match="m=0"):
        bubble_closed_form("gpipe", 4, 0)


# --------------------------------------------------------------------------- events


def test_timeline_golden_two_stages():
    r = simulate(one_f_one_b(2, 1), UNEQUAL)
    assert {str(a): t for a, t in r.times.items()} == {
        "0F0": (0, 1), "1F0": (1, 2), "1B0": (2, 4), "0B0": (4, 6)}
    assert isinstance(r, SimResult) and isinstance(r.events, Trace)
    compute = r.events.filter(kind=Kind.COMPUTE)
    assert [(e.rank, e.label, e.stage, e.microbatch) for e in compute] == [
        (0, "F", 0, 0), (1, "F", 1, 0), (1, "B", 1, 0), (0, "B", 0, 0)]
    assert all(isinstance(e, Event) for e in r.events)


def test_messages_become_transfer_events_and_cost_time():
    costs = Costs(F=1, B=2, p2p=lambda nbytes: nbytes / 1000, message_bytes=250)  # 0.25 s each
    p, m = 4, 6
    r = simulate(gpipe(p, m), costs)
    transfers = r.events.filter(kind=Kind.TRANSFER)
    assert len(transfers) == 2 * (p - 1) * m  # activations down, gradients up
    assert {(e.rank, e.peer) for e in transfers} == {(r_, r_ + 1) for r_ in range(p - 1)} | {
        (r_ + 1, r_) for r_ in range(p - 1)}
    assert all(e.bytes == 250 and e.duration == pytest.approx(0.25) for e in transfers)
    assert r.events.bytes_sent() == 250 * 2 * (p - 1) * m
    # GPipe: the fill and the drain each cross p-1 links.
    assert r.makespan == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * 0.25)
    assert r.events.filter(kind=Kind.RECV_WAIT, rank=p - 1).events[0].end == pytest.approx((p - 1) * 1.25)


def test_same_rank_neighbours_send_nothing():
    r = simulate(zbv(2, 4), Costs(p2p=0.5))
    # The V turns on rank 1 (stages 1 and 2) and ends on rank 0: only 0<->1 links are used.
    assert all({e.rank, e.peer} == {0, 1} for e in r.events.filter(kind=Kind.TRANSFER))
    assert len(r.events.filter(kind=Kind.TRANSFER)) == 2 * 2 * 4  # stage 0->1 and 2->3, both ways


def test_memory_in_bytes_and_over_time():
    r = simulate(one_f_one_b(3, 6), Costs(activation_bytes=100))
    assert r.peak_bytes == (300, 200, 100)
    assert [r.events.peak_memory(k) for k in range(3)] == [300, 200, 100]
    assert r.memory[0][-1][1] == 0 and max(n for _, n in r.memory[0]) == 3


def test_a_slow_stage_widens_the_bubble():
    even = simulate(one_f_one_b(4, 8))
    slow = simulate(one_f_one_b(4, 8), Costs(stage_factor=(1, 2, 1, 1)))
    assert slow.bubble > even.bubble
    # The slow stage sets the pace: 8 microbatches through stage 1 take 8 * 6 s.
    assert slow.makespan >= 8 * 6


def test_costs_reject_negative_values():
    with pytest.raises(ValueError, match="'F': -1"):
        Costs(F=-1)


def test_deadlock_names_every_blocked_rank():
    s = as_schedule({0: "0F0 0B0 0F1 0B1".split(), 1: "1F0 1F1 1B0 1B1".split()})
    with pytest.raises(ScheduleDeadlock) as e:
        simulate(s)
    msg = str(e.value)
    assert "rank 0 waits at step 1 on 0B0: it needs 1B0 (stage 1, on rank 1)" in msg
    assert "rank 1 waits at step 1 on 1F1: it needs 0F1 (stage 0, on rank 0)" in msg
    assert "step    rank 0    rank 1" in msg and ">>0B0" in msg and ">>1F1" in msg


def test_simulate_checks_structure_and_optionally_order():
    with pytest.raises(ValueError, match="has 2 forwards"):
        simulate(as_schedule({0: ["0F0", "0F0", "0B0"]}))
    swapped = as_schedule({0: "0F0 0F1 0B0 0B1".split(), 1: "1F1 1B1 1F0 1B0".split()})
    assert simulate(swapped).makespan > 0  # runnable with tagged messages...
    with pytest.raises(ValueError, match="out of order"):
        simulate(swapped, order="pair")  # ...but not when messages between ranks are one queue


def test_actions_keep_rank_order():
    r = simulate(interleaved_1f1b(4, 8, 2), UNEQUAL.scaled(0.5))
    for acts in r.schedule.actions:
        starts = [r.times[a][0] for a in acts]
        assert starts == sorted(starts)
        ends = [r.times[a][1] for a in acts]
        assert all(e <= s for e, s in zip(ends, starts[1:]))
    # Every cross-rank input arrived before the action that needs it started.
    a = Action(4, Op.F, 0)
    assert r.times[a][0] >= r.times[Action(3, Op.F, 0)][1]


# ----------------------------------------------------------------------------- all-to-all
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_all_to_all_is_paid_serially_by_zbv_and_hidden_by_dualpipe_v(p, m):
    """An expert-parallel all-to-all in every F, B and I: ZB-V pays it on each action, DualPipeV
    hides it inside its overlapped F&B pairs; without one the two tie."""
    chunk = UNEQUAL.scaled(0.5)
    assert simulate(zbv(p, m), chunk).makespan == simulate(dualpipe_v(p, m), chunk).makespan
    a2a = Costs(F=0.5, B=1.0, I=0.5, W=0.5, all_to_all=0.5)
    z, d = simulate(zbv(p, m), a2a), simulate(dualpipe_v(p, m), a2a)
    assert d.makespan < z.makespan
    for acts in z.schedule.actions:  # ZB-V: every action its compute + all-to-all
        for a in acts:
            start, end = z.times[a]
            assert end - start == pytest.approx(a2a.compute(a.op, a.stage) + (0 if a.op is Op.W else 0.5))


def test_an_overlapped_pair_takes_the_longer_of_compute_and_all_to_all():
    s = dualpipe_v(2, 4)
    for a2a, pair in [(0.25, 1.5), (1.0, 2.0)]:  # F + B = 1.5 of compute; two all-to-alls
        r = simulate(s, Costs(F=0.5, B=1.0, I=0.5, W=0.5, all_to_all=a2a))
        pairs = [(a, b) for acts in s.actions for a, b in zip(acts, acts[1:])
                 if a.op is Op.F and b.op is Op.B and a.stage != b.stage]
        assert pairs
        for a, b in pairs:
            assert r.times[b][1] - r.times[a][0] == pytest.approx(pair)
            assert r.times[a][1] == r.times[b][0]


def test_no_all_to_all_leaves_every_timeline_unchanged():
    for s in [one_f_one_b(4, 8), zbv(4, 8), dualpipe_v(4, 8), zero_bubble_h1(4, 8)]:
        assert simulate(s, UNEQUAL).times == simulate(s, Costs(F=1, B=2, I=1, W=1, all_to_all=0.0)).times
    with pytest.raises(ValueError, match="all_to_all"):
        Costs(all_to_all=-1)
