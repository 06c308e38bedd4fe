"""Blocking sends (chapter 12): GPipe survives them, 1F1B deadlocks into an error naming every
rank and the send it is stuck in, and after a restart the real executor runs the same schedule."""
import pytest

from pipelib.recipe import Recipe
import torch

from pipelib.model import MLP, MLPConfig
from pipelib.pipeline.blocking import check_blocking, stage_input_shapes, train_step_blocking
from pipelib.pipeline.schedules import gpipe, interleaved_1f1b, one_f_one_b, zero_bubble_h1
from pipelib.pipeline.simulate import Costs
from pipelib.pipeline.stage import split_into_stages
from pipelib.pipeline.step import run_train_step
from pipelib.results import check_against_reference

CFG = MLPConfig(in_features=16, hidden=16, out_features=10, num_layers=4)
ROWS = 2  # rows per microbatch
TIMEOUT = 6  # seconds: every run and every gloo operation of the test cluster
STUCK = 2    # seconds before the deadlocked run is declared stuck (before gloo's own timeout)
COSTS = Costs(F=1e-3, B=2e-3)  # modelled durations: no FLOP counting (its first use takes seconds)


def _equal_to_monolith(results, m):
    check_against_reference(results, Recipe(CFG, batch_size=ROWS * m, data_seed=m).first_step())


# ----------------------------------------------------------------------------- no cluster
def test_stage_input_shapes():
    modules = split_into_stages(MLP(CFG).layers, 2)
    assert stage_input_shapes(modules, torch.zeros(3, CFG.in_features)) == [(3, 16), (3, 16)]
    wide = MLPConfig(in_features=5, hidden=7, out_features=2, num_layers=3)
    modules = split_into_stages(MLP(wide).layers, 3)
    assert stage_input_shapes(modules, torch.zeros(4, 5)) == [(4, 5), (4, 7), (4, 7)]


@pytest.mark.parametrize("schedule,match", [
    (interleaved_1f1b(2, 2, 2), r"one stage per rank; .* 4 stages on 2 ranks; run it with"),
    (zero_bubble_h1(2, 2), r"F and B only; .*'0I0'"),
    ({0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]}, r"deadlocks"),
])
def test_what_it_cannot_run_fails_before_any_message(schedule, match):
    with pytest.raises(ValueError, match=match):
        check_blocking(schedule)
    with pytest.raises(ValueError, match=match):
        train_step_blocking(schedule, CFG)  # raises before it asks for a process group


# ----------------------------------------------------------------------------- on a cluster
def _warm_up():
    """Imports and a first forward, before any message: a cold engine is slow (seconds)."""
    import pipelib.pipeline.step  # noqa: F401

    modules = split_into_stages(MLP(CFG).layers, 2)
    return stage_input_shapes(modules, torch.zeros(ROWS, CFG.in_features))


@pytest.fixture(scope="module")
def cluster2():
    from pipelib.runtime.cluster import Cluster

    with Cluster(2, timeout=TIMEOUT) as c:
        c.run(_warm_up, timeout=60)
        yield c


@pytest.mark.cluster
def test_gpipe_with_blocking_sends_equals_the_monolith(cluster2):
    m = 3
    _equal_to_monolith(cluster2.run(train_step_blocking, gpipe(2, m), CFG, m, costs=COSTS), m)


@pytest.mark.cluster
def test_1f1b_with_blocking_sends_deadlocks_into_an_error_naming_every_rank(cluster2):
    from pipelib.runtime.errors import RankTimeoutError

    try:
        with pytest.raises(RankTimeoutError) as err:
            cluster2.run(train_step_blocking, one_f_one_b(2, 3), CFG, 3, costs=COSTS, timeout=STUCK)
    finally:
        cluster2.restart()
    text = str(err.value)
    assert err.value.ranks == [0, 1]
    # rank 0 ran 0F1 and sends its activation; rank 1 ran 1B0 and sends its gradient: both wait
    assert "rank 0 did not finish train_step_blocking" in text
    assert "act of 0F1: send to rank 1" in text
    assert "rank 1 did not finish train_step_blocking" in text
    assert "grad of 1B0: send to rank 0" in text


@pytest.mark.cluster
def test_after_a_restart_the_executor_runs_the_same_schedule(cluster2):
    m = 3
    cluster2.run(_warm_up, timeout=60)
    _equal_to_monolith(run_train_step(cluster2, one_f_one_b(2, m), None, None, CFG, m,
                                     costs=COSTS), m)
