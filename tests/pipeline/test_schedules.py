"""Pure tests of pipelib.pipeline.schedules: generators, validate, format_table, CSV, and torch's orders."""
from collections import Counter

import pytest

from pipelib.pipeline.schedules import (
    GENERATORS,
    Action,
    Op,
    Schedule,
    ScheduleDeadlock,
    as_schedule,
    dualpipe_v,
    format_table,
    from_csv,
    gpipe,
    interleaved_1f1b,
    interleaved_zero_bubble,
    looped_bfs,
    naive,
    one_f_one_b,
    read_csv,
    schedule_info,
    to_csv,
    validate,
    write_csv,
    zbv,
    zero_bubble_h1,
    zero_bubble_h2,
)

PS = [1, 2, 3, 4, 8]


def ms(p):
    return sorted({1, 2, max(1, p - 1), p, 2 * p, 4 * p})


def cases():
    """(name, args) for every generator, p in PS, m in ms(p) (and v in 1..3 where it applies)."""
    for p in PS:
        for m in ms(p):
            for name in GENERATORS:
                if schedule_info(name).chunked:
                    yield from ((name, (p, m, v)) for v in (1, 2, 3))
                else:
                    yield name, (p, m)


def accepted(name, args):
    p, m = args[:2]
    if name == "dualpipe_v":
        return m >= 2 * p
    if "interleaved" in name:  # torch's rounds; looped BFS takes any m
        return m % max(1, m // p) == 0
    return True


def needs_kind_order(name, args):
    """V schedules (and zero-bubble looped on 2 ranks) mix activations and gradients on a link."""
    return name in ("zbv", "dualpipe_v") or (name == "interleaved_zero_bubble" and args[0] == 2)


# --------------------------------------------------------------------------- actions


def test_action_prints_and_parses_like_torch():
    a = Action(2, Op.F, 0)
    assert str(a) == repr(a) == "2F0"
    assert Action.parse(" 12W34 ") == Action(12, Op.W, 34)
    assert Action(1, "I", 3).op is Op.I
    assert [str(Action.parse(s)) for s in ["0F0", "3B7", "1I2", "5W10"]] == ["0F0", "3B7", "1I2", "5W10"]


@pytest.mark.parametrize("text", ["F0", "0X0", "0F", "0SEND_F0", "", "a0F0"])
def test_action_parse_rejects_with_the_text(text):
    with pytest.raises(ValueError, match="cannot parse action"):
        Action.parse(text)


# --------------------------------------------------------------------------- generators


@pytest.mark.parametrize("name,args", list(cases()), ids=lambda x: str(x))
def test_every_generator_is_valid(name, args):
    if not accepted(name, args):
        with pytest.raises(ValueError, match=f"m={args[1]}"):
            GENERATORS[name](*args)
        return
    s = GENERATORS[name](*args)
    p, m = args[:2]
    v = args[2] if len(args) == 3 else (2 if name in ("zbv", "dualpipe_v") else 1)
    assert (s.num_ranks, s.num_stages, s.num_microbatches) == (p, p * v, m)
    validate(s, order="kind" if needs_kind_order(name, args) else "pair")
    # Counted here independently of validate: one F and one backward per (stage, microbatch).
    count = Counter((a.stage, a.op, a.microbatch) for acts in s.actions for a in acts)
    for stage in range(p * v):
        assert s.stage_to_rank[stage] in range(p)
        for j in range(m):
            assert count[stage, Op.F, j] == 1
            assert count[stage, Op.B, j] + count[stage, Op.I, j] == 1
            assert count[stage, Op.W, j] == count[stage, Op.I, j]
    assert sum(count.values()) == sum(len(acts) for acts in s.actions)


def test_one_f_one_b_golden_order():
    s = one_f_one_b(4, 8)
    rank = lambda r: " ".join(map(str, s.actions[r]))  # noqa: E731
    assert rank(0) == "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7"
    assert rank(3) == "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"
    # m < p: warm-up is capped at m forwards, not p - rank - 1 (torch's _get_pipeline_order
    # draws 0F0 0F1 0F2 here, a forward for a microbatch that does not exist).
    assert " ".join(map(str, one_f_one_b(4, 2).actions[0])) == "0F0 0F1 0B0 0B1"


def test_zb_h2_holds_2p_minus_1_as_qi_et_al():
    """Qi et al.'s ZB-H2 (Table 2, Figure 3): rank 0 runs F1..F7, B1, W1 for p = 4 (here
    0-based, I for B) and holds at most 2p-1 microbatches: forwarded, weight gradient not done."""
    for p in (1, 2, 3, 4, 8):
        for m in range(1, 4 * p + 1):
            s = zero_bubble_h2(p, m)
            for acts in s.actions:
                in_flight = peak = 0
                for a in acts:
                    in_flight += (a.op is Op.F) - (a.op is Op.W)
                    peak = max(peak, in_flight)
                assert peak <= 2 * p - 1, (p, m, acts)
            assert max(sum(a.op is Op.F for a in acts[:2 * p]) for acts in s.actions) == min(2 * p - 1, m)
    first = " ".join(map(str, zero_bubble_h2(4, 8).actions[0][:10]))
    assert first == "0F0 0F1 0F2 0F3 0F4 0F5 0F6 0I0 0W0 0I1"


def test_gpipe_naive_and_placements():
    assert " ".join(map(str, gpipe(2, 3).actions[1])) == "1F0 1F1 1F2 1B0 1B1 1B2"
    assert " ".join(map(str, naive(3, 2).actions[2])) == "2F0 2B0 2F1 2B1"
    assert interleaved_1f1b(4, 8, 2).stage_to_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    assert zbv(3, 6).stage_to_rank == (0, 1, 2, 2, 1, 0)
    assert dualpipe_v(2, 4).stage_to_rank == (0, 1, 1, 0)
    assert zbv(3, 6).stages_of(0) == (0, 5) and zbv(3, 6).num_chunks == 2


@pytest.mark.parametrize("call,value", [
    (lambda: gpipe(0, 4), "p=0"), (lambda: one_f_one_b(4, 0), "m=0"),
    (lambda: naive(-1, 2), "p=-1"), (lambda: interleaved_1f1b(4, 8, 0), "v=0"),
    (lambda: interleaved_1f1b(4, 9, 2), "m=9"), (lambda: interleaved_zero_bubble(2, 5), "m=5"),
    (lambda: zero_bubble_h1(2, 0), "m=0"), (lambda: zbv(0, 3), "p=0"),
    (lambda: dualpipe_v(4, 7), "m=7"), (lambda: gpipe(2.5, 4), "p=2.5"),
])
def test_bad_arguments_name_the_value(call, value):
    with pytest.raises(ValueError, match=value.replace(".", r"\.")):
        call()


def test_interleaved_error_suggests_accepted_m():
    with pytest.raises(ValueError) as e:
        interleaved_1f1b(4, 9, 2)
    assert "multiple" in str(e.value) and "8" in str(e.value) and "12" in str(e.value)


# --------------------------------------------------------------------------- validate


def hand(rows, m=None):
    return as_schedule({r: row.split() for r, row in enumerate(rows)}, num_microbatches=m)


def test_validate_catches_send_order_different_from_receive_order():
    # Rank 1 takes microbatch 1 first: rank 0 sends activations 0, 1 but rank 1 asks for 1, 0.
    s = hand(["0F0 0F1 0B0 0B1", "1F1 1B1 1F0 1B0"])
    with pytest.raises(ValueError) as e:
        validate(s)
    msg = str(e.value)
    assert "from rank 0 to rank 1 arrive out of order" in msg
    assert ">>0F0" in msg and ">>1F1" in msg  # both ends of the mismatch are marked
    assert "rank 0" in msg.splitlines()[2] and "rank 1" in msg.splitlines()[2]  # the table header
    # The same schedule has no dependency cycle: only the message order is wrong.
    validate(hand(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]))


def test_validate_order_kind_separates_activations_and_gradients():
    s = zbv(4, 8)
    with pytest.raises(ValueError, match="out of order"):
        validate(s)  # torch's ZB-V sends 0F6's activation before 7I0's gradient; rank 1 wants the gradient first
    assert validate(s, order="kind") is s
    with pytest.raises(ValueError, match="order="):
        validate(s, order="tags")


def test_validate_names_a_deadlock():
    # Rank 1 runs both forwards before any backward; rank 0 wants 0B0 before sending 0F1.
    s = hand(["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"])
    with pytest.raises(ScheduleDeadlock) as e:
        validate(s)
    msg = str(e.value)
    assert "rank 0 waits at step 1 on 0B0: it needs 1B0" in msg
    assert "rank 1 waits at step 1 on 1F1: it needs 0F1" in msg
    assert ">>0B0" in msg and ">>1F1" in msg
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("rows,m,needle,mark", [
    (["0F0 0F0 0B0", "1F0 1B0"], 1, "stage 0 microbatch 0 has 2 forwards", ">>0F0"),
    (["0F0", "1F0 1B0"], 1, "stage 0 microbatch 0 has 0 B, 0 I and 0 W", None),
    (["0F0 0I0 0B0", "1F0 1B0"], 1, "has 1 B, 1 I and 0 W", ">>0I0"),
    (["0B0 0F0", "1F0 1B0"], 1, "runs its backward before its forward", ">>0B0"),
    (["0F0 0W0 0I0", "1F0 1B0"], 1, "runs 0W0 before 0I0", ">>0W0"),
    (["0F0 0B0", "1F0 1B0"], 2, "stage 0 microbatch 1 has 0 forwards", None),
])
def test_validate_structure_errors(rows, m, needle, mark):
    with pytest.raises(ValueError) as e:
        validate(hand(rows, m))
    assert needle in str(e.value)
    if mark:
        assert mark in str(e.value)


def test_validate_rejects_misplaced_and_out_of_range_actions():
    s = Schedule(((Action(0, Op.F, 0), Action(1, Op.F, 0)), (Action(1, Op.B, 0),)), 2, 1, (0, 1))
    with pytest.raises(ValueError, match="lives on rank 1"):
        validate(s)
    with pytest.raises(ValueError, match="appears on rank 0 and on rank 1"):
        hand(["0F0 1F0", "1B0"])
    s = Schedule(((Action(0, Op.F, 3),),), 1, 1, (0,))
    with pytest.raises(ValueError, match="out of range"):
        validate(s)


# --------------------------------------------------------------------------- tables


def test_format_table_is_fixed_width_and_deterministic():
    s = one_f_one_b(2, 2)
    assert format_table(s) == (
        "step    rank 0    rank 1\n"
        "   0    0F0       1F0\n"
        "   1    0F1       1B0\n"
        "   2    0B0       1F1\n"
        "   3    0B1       1B1"
    )
    assert format_table(s, marks={(1, 2)}).splitlines()[3] == "   2    0B0     >>1F1"
    assert format_table(s, aligned=True) == (
        "slot    rank 0    rank 1\n"
        "   0    0F0\n"
        "   1    0F1       1F0\n"
        "   2              1B0\n"
        "   3    0B0       1F1\n"
        "   4              1B1\n"
        "   5    0B1"
    )
    assert str(s) == format_table(s) == format_table(s.as_dict())


# --------------------------------------------------------------------------- CSV


@pytest.mark.parametrize("gen,args", [(gpipe, (3, 4)), (one_f_one_b, (4, 8)),
                                      (interleaved_1f1b, (2, 4, 3)), (zbv, (3, 7)), (dualpipe_v, (2, 5))])
def test_csv_round_trip(gen, args, tmp_path):
    s = gen(*args)
    back = from_csv(to_csv(s), name=s.name)
    assert back == s
    write_csv(s, tmp_path / "s.csv")
    assert read_csv(tmp_path / "s.csv", name=s.name) == s
    assert to_csv(s).splitlines()[0].split(",")[:2] == [str(a) for a in s.actions[0][:2]]


def test_csv_in_torch_format_parses():
    # torch writes idle slots as empty cells, may add comms/FSDP actions, and DualPipeV pairs.
    text = ("0F0,0SEND_F0,,0F1,0SEND_F1,0RECV_B0,0B0,0REDUCE_GRAD\r\n"
            "1RECV_F0,1F0,(1F1;1B0)OVERLAP_F_B,1SEND_B0,,1B1,1UNSHARD\r\n")
    s = from_csv(text, num_microbatches=2)
    assert s.as_dict() == {0: [Action(0, Op.F, 0), Action(0, Op.F, 1), Action(0, Op.B, 0)],
                           1: [Action(1, Op.F, 0), Action(1, Op.F, 1), Action(1, Op.B, 0), Action(1, Op.B, 1)]}
    with pytest.raises(ValueError, match="CSV row 1"):
        from_csv("0F0\n1Q0\n")


# --------------------------------------------------------------------------- against torch


@pytest.fixture(scope="module")
def ts():
    return pytest.importorskip("torch.distributed.pipelining.schedules")


def torch_order(ts, cls, p, m, v=1):
    """Run torch's own order generation without a process group (it only reads these fields)."""
    o = object.__new__(cls)
    o._num_stages, o.num_stages, o._n_microbatches = p * v, p * v, m
    o.pp_group_size, o.n_local_stages, o._stages = p, v, [None] * v
    o.number_of_rounds = max(1, m // p)
    o.microbatches_per_round = m // o.number_of_rounds
    if cls in (ts.ScheduleGPipe, ts.Schedule1F1B):
        order = o._get_pipeline_order()
    else:
        order = {r: o._calculate_single_rank_operations(r) for r in range(p)}
    o.pipeline_order = order
    return o, order


def flat(order):
    """torch's order as our action strings: idle slots and REDUCE_GRAD dropped, pairs split."""
    out = {}
    for r, acts in order.items():
        out[r] = [str(x) for a in acts if a is not None
                  for x in (a.sub_actions or (a,)) if x.computation_type.value in "FBIW"]
    return out


def ours(s):
    return {r: [str(a) for a in acts] for r, acts in enumerate(s.actions)}


PM = [(2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8), (4, 12), (8, 16)]


@pytest.mark.parametrize("p,m", PM)
def test_orders_match_torch(ts, p, m):
    assert flat(torch_order(ts, ts.ScheduleGPipe, p, m)[1]) == ours(gpipe(p, m))
    for v in (1, 2, 3):
        assert flat(torch_order(ts, ts.ScheduleInterleaved1F1B, p, m, v)[1]) == ours(interleaved_1f1b(p, m, v))
        theirs = torch_order(ts, ts.ScheduleInterleavedZeroBubble, p, m, v)[1]
        assert flat(theirs) == ours(interleaved_zero_bubble(p, m, v))
    assert flat(torch_order(ts, ts.ScheduleInterleavedZeroBubble, p, m)[1]) == ours(zero_bubble_h1(p, m))
    assert flat(torch_order(ts, ts.ScheduleZBVZeroBubble, p, m, 2)[1]) == ours(zbv(p, m))
    if m >= 2 * p:
        assert flat(torch_order(ts, ts.ScheduleDualPipeV, p, m, 2)[1]) == ours(dualpipe_v(p, m))


@pytest.mark.parametrize("p,m", PM + [(4, 2), (3, 5)])
def test_looped_bfs_matches_torch(ts, p, m):
    for v in (1, 2, 3):
        assert flat(torch_order(ts, ts.ScheduleLoopedBFS, p, m, v)[1]) == ours(looped_bfs(p, m, v))


@pytest.mark.parametrize("p,m", PM + [(4, 2), (8, 3)])
def test_zbv_matches_torch_for_small_m(ts, p, m):
    assert flat(torch_order(ts, ts.ScheduleZBVZeroBubble, p, m, 2)[1]) == ours(zbv(p, m))


@pytest.mark.parametrize("p,m", PM)
def test_one_f_one_b_matches_torch(ts, p, m):
    """Equal to Schedule1F1B's drawn order on every rank but the last.

    torch's `_get_pipeline_order` for 1F1B (a drawing; its `_step_microbatches` runs the right
    order) starts the last rank at F1 and ends it at F{m}: an off-by-one. Ours follows what
    torch runs: warm-up min(p - rank, m) forwards counting the first steady one, then 1B1F.
    """
    t, mine = flat(torch_order(ts, ts.Schedule1F1B, p, m)[1]), ours(one_f_one_b(p, m))
    assert all(t[r] == mine[r] for r in range(p - 1))
    assert t[p - 1][0] == f"{p - 1}F1" and mine[p - 1][:2] == [f"{p - 1}F0", f"{p - 1}B0"]


@pytest.mark.parametrize("cls,gen,args", [
    ("ScheduleInterleaved1F1B", interleaved_1f1b, (4, 8, 2)),
    ("ScheduleDualPipeV", dualpipe_v, (4, 10)),
    ("ScheduleGPipe", gpipe, (3, 5)),
])
def test_torch_dumped_csv_loads(ts, tmp_path, cls, gen, args):
    v = args[2] if len(args) == 3 else (2 if gen is dualpipe_v else 1)
    o, _ = torch_order(ts, getattr(ts, cls), args[0], args[1], v)
    ts.PipelineScheduleMulti._dump_csv(o, tmp_path / "torch.csv")  # torch's own writer
    s = read_csv(tmp_path / "torch.csv", num_microbatches=args[1])
    assert ours(s) == ours(gen(*args))


def test_schedule_hash_is_cached_but_never_shipped():
    import pickle

    s = one_f_one_b(4, 8)
    assert hash(s) == hash(one_f_one_b(4, 8)) and s == one_f_one_b(4, 8)
    back = pickle.loads(pickle.dumps(s))  # an engine hashes with its own string seed
    assert "_hash" not in back.__dict__ and back == s
