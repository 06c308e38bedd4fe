"""1F1B with paired messages (chapter 12): picotron's order, one batch_isend_irecv per exchange,
equal to the monolith on 2 and 4 ranks, and its virtual-clock step time predicted exactly."""
import pytest

from pipelib.recipe import Recipe

from pipelib.model import MLPConfig
from pipelib.pipeline.paired import Msg, paired_program, predict_paired, train_step_paired
from pipelib.pipeline.schedules import Action, one_f_one_b
from pipelib.pipeline.simulate import Costs, simulate
from pipelib.pipeline.step import run_train_step
from pipelib.results import check_against_reference

CFG = MLPConfig(in_features=16, hidden=16, out_features=10, num_layers=4)
ROWS = 2
T_MSG = 50e-6
COSTS = Costs(F=1e-3, B=2e-3, p2p=T_MSG)
SIZES = [(p, m) for p in (1, 2, 3, 4, 5) for m in (1, 2, 3, 4, 6, 8)]


# ----------------------------------------------------------------------------- no cluster
@pytest.mark.parametrize("mode", ["paired", "serial"])
@pytest.mark.parametrize("p,m", SIZES)
def test_program_runs_1f1b_and_every_message_has_its_partner(p, m, mode):
    progs = [paired_program(p, m, r, mode) for r in range(p)]
    for r, prog in enumerate(progs):
        assert tuple(a for a in prog if isinstance(a, Action)) == one_f_one_b(p, m).actions[r]
    msgs = [(r, x) for r, prog in enumerate(progs) for t in prog if not isinstance(t, Action) for x in t]
    sends = sorted((r, x.peer, x.kind, x.microbatch) for r, x in msgs if x.op == "send")
    recvs = sorted((x.peer, r, x.kind, x.microbatch) for r, x in msgs if x.op == "recv")
    assert sends == recvs and len(sends) == 2 * m * (p - 1)
    widest = max((len(t) for prog in progs for t in prog if not isinstance(t, Action)), default=1)
    assert widest == (2 if mode == "paired" and p > 1 and m > 1 else 1)


def test_steady_state_pairs_a_send_with_the_next_receive():
    prog = paired_program(4, 8, 1)
    assert Msg("send", "act", 2, 2) in prog[8] and Msg("recv", "grad", 2, 0) in prog[8]
    assert prog[10] == (Msg("send", "grad", 0, 0), Msg("recv", "act", 0, 3))
    with pytest.raises(ValueError, match="mode must be one of"):
        paired_program(2, 2, 0, "blocking")


@pytest.mark.parametrize("p,m", SIZES)
def test_overlap_orders_the_three_runners_by_whole_messages(p, m):
    executor = simulate(one_f_one_b(p, m), COSTS).makespan
    paired, serial = (max(predict_paired(p, m, COSTS, mode)) for mode in ("paired", "serial"))
    assert executor <= paired + 1e-12 and paired <= serial + 1e-12
    for slower, faster in ((paired, executor), (serial, paired)):
        k = (slower - faster) / T_MSG
        assert abs(k - round(k)) < 1e-6, (p, m, k)
    if m == 1:  # one microbatch down and back: nothing to overlap, all three equal
        assert abs(serial - executor) < 1e-12


# ----------------------------------------------------------------------------- on a cluster
@pytest.fixture(scope="module")
def paired4(cluster4):
    """The shared 4-engine cluster, pipelib.pipeline.paired imported on every engine first."""
    cluster4.run(lambda: __import__("pipelib.pipeline.paired") and None, timeout=60)
    return cluster4


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["paired", "serial"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 2), (4, 6)])
def test_paired_1f1b_equals_the_monolith_and_its_prediction(paired4, p, m, mode):
    from pipelib.costmodel import get_profile

    costs = Costs(F=1e-3, B=2e-3, p2p=get_profile("toy-gpu").message_time, message_bytes=ROWS * 64)
    paired4.reset()
    res = paired4.run(train_step_paired, p, m, CFG, m, batch_size=ROWS * m, costs=costs, mode=mode)
    check_against_reference(res[:p], Recipe(CFG, batch_size=ROWS * m, data_seed=m).first_step())
    assert res[p:] == [None] * (4 - p)
    assert abs(paired4.trace().span - max(predict_paired(p, m, costs, mode))) < 1e-9
    if mode == "paired":
        paired4.reset()
        run_train_step(paired4, one_f_one_b(p, m), None, None, CFG, m, batch_size=ROWS * m,
                       costs=costs)
        assert paired4.trace().span <= max(predict_paired(p, m, costs, mode)) + 1e-12
