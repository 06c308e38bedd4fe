"""Recomputation inside pipeline stages: the GPT on 4 simulated ranks under 1F1B (and zero
bubble's split backward) with each policy applied to the stage modules from outside: the same
loss and gradients as without it, bit for bit, and less memory on every rank."""
import pytest

from pipelib.recipe import Recipe
import torch

from pipelib.model import GPTConfig
from pipelib.pipeline.simulate import Costs
from pipelib.recompute.pipeline import recompute_gpt_step, run_recompute_gpt_step
from pipelib.results import check_against_reference

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("one_thread")]

CFG = GPTConfig(vocab_size=65, block_size=32, n_layer=8, n_head=4, n_embd=32)
CASES = [("none", None), ("full", None), ("every_k", 2), ("selective", None)]
M, ROWS = 4, 2


def _all(schedule):
    return [recompute_gpt_step(schedule, 4, M, CFG, policy=pol, k=k, batch_size=M * ROWS,
                               costs=Costs()) for pol, k in CASES]


@pytest.fixture(scope="module", params=["1f1b", "zb_h1"])
def results(request, cluster4):
    per_rank = cluster4.run(_all, request.param, timeout=120)
    return {case: [per_rank[r][i] for r in range(4)] for i, case in enumerate(CASES)}


@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: c[0])
def test_same_as_without_recomputation_bit_for_bit(results, case):
    base, got = results[("none", None)], results[case]
    for a, b in zip(got, base):
        assert a.grads.keys() == b.grads.keys()
        assert all(torch.equal(a.grads[n], b.grads[n]) for n in a.grads)
        assert (a.loss is None) == (b.loss is None) and (a.loss is None or torch.equal(a.loss, b.loss))
    check_against_reference(got, Recipe(CFG, batch_size=M * ROWS).first_step(), shared={"embed.wte.weight"})


def test_every_rank_holds_less(results):
    none = [r.stats["peak_rerun_bytes"] for r in results[("none", None)]]
    for case in CASES[1:]:
        peaks = [r.stats["peak_rerun_bytes"] for r in results[case]]
        assert all(p < q for p, q in zip(peaks, none)), (case, peaks, none)
    full = [r.stats["peak_rerun_bytes"] for r in results[("full", None)]]
    assert max(full) < max(none) / 3


def test_bad_policy_fails_before_any_engine_work():
    class NoCluster:
        world_size = 4

        def run(self, *a, **k):
            raise AssertionError("an engine was asked to work")

    with pytest.raises(ValueError, match=r"k=0; pass an integer >= 1"):
        run_recompute_gpt_step(NoCluster(), "1f1b", 4, 4, CFG, policy="every_k", k=0)
    with pytest.raises(ValueError, match="unknown recomputation policy 'half'"):
        run_recompute_gpt_step(NoCluster(), "1f1b", 4, 4, CFG, policy="half")


def _capacity():
    from pipelib.runtime.device import current

    return current().memory.capacity, current().profile.memory


def test_only_recomputation_fits_the_ranks_simulated_device(cluster4):
    """A one-stage pipeline on rank 0 with half the activation room it needs: out of memory
    without recomputation (the cluster stays usable), fits with it, same gradients."""
    from pipelib.runtime.errors import RankError

    kw = dict(batch_size=M * ROWS, costs=Costs())
    none = run_recompute_gpt_step(cluster4, "1f1b", 1, M, CFG, policy="none", **kw)[0]
    fixed = none.peak_bytes - none.stats["peak_rerun_bytes"]
    device = fixed + none.stats["peak_rerun_bytes"] // 2
    with pytest.raises(RankError, match="SimulatedOutOfMemoryError"):
        run_recompute_gpt_step(cluster4, "1f1b", 1, M, CFG, policy="none", capacity=device, **kw)
    full = run_recompute_gpt_step(cluster4, "1f1b", 1, M, CFG, policy="full", capacity=device, **kw)[0]
    assert full.peak_bytes <= device
    # the small device was a scoped override: every rank has its own capacity back, OOM or not
    assert all(cap == own for cap, own in cluster4.run(_capacity))
    assert all(torch.equal(full.grads[n], none.grads[n]) for n in none.grads)
