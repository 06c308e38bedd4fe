"""ZeRO-3's prefetch and reshard_after_forward=False, gradient accumulation's traffic, and the
optimizer step charged on the timeline: each equal to one process, each timed on the virtual clock.

The MLP has two 256 x 256 layers: with 32 rows per rank a layer's forward (2 x 32 x 256 x 256
FLOPs, 0.42 ms on toy-gpu) lasts longer than its all-gather on 4 ranks (3 (alpha + shard / beta),
0.35 ms), so prefetching must hide every gather but the first of each pass, exactly.
"""
import pytest

from pipelib.data_parallel.zero_formulas import adam_bytes_moved, padded_numel, zero_comm_bytes, zero_state_bytes
from pipelib.data_parallel.zero_runner import train_zero
from pipelib.results import check_against_reference
from pipelib.model import GPTConfig, MLPConfig
from pipelib.recipe import Recipe

pytestmark = pytest.mark.usefixtures("one_thread")

ODD = Recipe(MLPConfig(in_features=6, hidden=9, out_features=4, num_layers=3), lr=1e-3)  # 193 parameters
GPT = Recipe(GPTConfig(vocab_size=29, block_size=8, n_layer=2, n_head=2, n_embd=12), lr=1e-3)
PEN = Recipe(MLPConfig(in_features=256, hidden=256, out_features=256, num_layers=2), lr=1e-3)
TOL = dict(rtol=1e-5, atol=1e-6)
OPTIONS = [dict(prefetch=True), dict(reshard_after_forward=False), dict(prefetch=True, reshard_after_forward=False)]


@pytest.mark.cluster
@pytest.mark.parametrize("spec", [ODD, GPT], ids=["mlp", "gpt-tied"])
@pytest.mark.parametrize("kw", OPTIONS, ids=["prefetch", "no-reshard", "both"])
def test_stage3_options_equal_one_process(cluster4, spec, kw):
    ref = spec.replace(steps=3, batch_size=8).reference()
    res = train_zero(cluster4, spec.replace(steps=3, batch_size=8), 3, world_size=4, **kw)
    agreed = check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
    assert agreed.num_tensors == 2 * len(ref.params)
    padded = res[0].stats["padded"]
    if spec is ODD:  # no tied weight: exactly the formula (2 psi without resharding, else 3 psi)
        want = zero_comm_bytes(padded, 4, 3, False, reshard_after_forward=kw.get("reshard_after_forward", True))
        assert res[0].stats["bytes_sent"] == (want,) * 3


@pytest.mark.cluster
def test_prefetch_hides_all_but_the_first_gather_of_each_pass(cluster4):
    from pipelib.costmodel import get_profile

    link = get_profile("toy-gpu").link
    n, rows = 4, 32
    gather = (n - 1) * (link.alpha + 4 * (256 * 256 + 256) // n / link.beta)  # one layer's all-gather
    layer_forward = 2 * rows * 256 * 256 / get_profile("toy-gpu").flops
    assert layer_forward > gather  # the precondition of the exact claim below
    t = {}
    for name, kw in (("plain", {}), ("prefetch", {"prefetch": True}), ("no-reshard", {"reshard_after_forward": False})):
        cluster4.reset()
        res = train_zero(cluster4, PEN.replace(steps=1, batch_size=rows * n), 3, **kw)
        t[name] = res[0].times[0]
        if name == "prefetch":
            from pipelib.trace import Kind

            events = [e for e in cluster4.trace().events if e.rank == 0]
            pre = [e for e in events if e.kind == Kind.COLLECTIVE and e.label.startswith("all_gather: prefetch")]
            comp = [e for e in events if e.kind == Kind.COMPUTE]
            assert len(pre) == 2  # one per pass: the other gather of each pass has nothing before it
            # each prefetched gather ran on the second lane while a layer computed
            assert all(any(c.start < p.end and p.start < c.end for c in comp) for p in pre)
    assert t["prefetch"] <= t["plain"]
    # 2 layers: the second layer's forward gather and the first layer's backward gather are hidden
    assert abs((t["plain"] - t["prefetch"]) - 2 * gather) < 1e-9
    # without resharding, backward gathers nothing: both backward gathers are gone
    assert abs((t["plain"] - t["no-reshard"]) - 2 * gather) < 1e-9


@pytest.mark.cluster
def test_prefetch_holds_two_layers_at_once(cluster4):
    layer = 4 * (256 * 256 + 256)
    plain = train_zero(cluster4, PEN.replace(steps=1, batch_size=8 * 4), 3)[0].stats
    pre = train_zero(cluster4, PEN.replace(steps=1, batch_size=8 * 4), 3, prefetch=True)[0].stats
    keep = train_zero(cluster4, PEN.replace(steps=1, batch_size=8 * 4), 3, reshard_after_forward=False)[0].stats
    assert pre["gathered peak"] == 2 * layer and keep["gathered peak"] == 2 * layer  # two of two layers
    assert plain["gathered peak"] <= 2 * layer


@pytest.mark.cluster
@pytest.mark.parametrize("k", [1, 2, 4])
def test_traffic_with_gradient_accumulation(cluster4, k):
    """Per optimizer step: stages 0-1 reduce once; 2 reduce-scatters after every backward; 3
    also gathers per micro-batch. Counted from the trace, equal to the formulas; and equal to
    one process on the whole batch."""
    padded = padded_numel([63, 90, 40], 4)
    ref = ODD.replace(steps=2, batch_size=8 * k).reference()
    for stage in range(4):
        res = train_zero(cluster4, ODD.replace(steps=2, batch_size=8 * k), stage, accumulate=k)
        check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
        want = zero_comm_bytes(padded, 4, stage, False, accumulate=k)
        assert res[0].stats["bytes_sent"] == (want, want), (stage, k)
    assert zero_comm_bytes(padded, 4, 2, False, accumulate=k) == (k + 1) * 3 * padded * 4 // 4


@pytest.mark.cluster
def test_optimizer_step_is_charged_and_n_times_cheaper(cluster4):
    from pipelib.costmodel import get_profile

    bw = get_profile("toy-gpu").mem_bandwidth
    for stage in (0, 1, 3):
        cluster4.reset()
        res = train_zero(cluster4, ODD.replace(steps=1, batch_size=8), stage)
        opt = [e for e in cluster4.trace().events if e.rank == 0 and e.label == "optimizer"]
        numel = padded_numel([63, 90, 40], 4) // (1 if stage == 0 else 4)
        assert res[0].stats["optimizer bytes"] == adam_bytes_moved(numel)
        assert len(opt) == 1 and opt[0].end - opt[0].start == pytest.approx(28 * numel / bw, rel=1e-12)


def test_options_outside_stage_3_are_refused_before_any_communication():
    import torch

    from pipelib.data_parallel.zero import ZeRO

    with pytest.raises(ValueError, match="only stage 3 does"):
        ZeRO(ODD.build(), None, 2, prefetch=True)
    with pytest.raises(ValueError, match="reduce_dtype=torch.float16"):
        ZeRO(ODD.build(), None, 2, mixed_precision=True, reduce_dtype=torch.float16)

    class NoCluster:
        world_size = 4

        def run(self, *a, **k):
            raise AssertionError("engine work started")

    with pytest.raises(ValueError, match="accumulate=3"):
        train_zero(NoCluster(), ODD.replace(batch_size=8), 1, accumulate=3)


@pytest.mark.cluster
@pytest.mark.parametrize("rows", [2, 8])
def test_prefetch_never_costs_time_when_compute_is_short(cluster4, rows):
    """A layer's forward shorter than a gather: prefetching hides the gathers only in part, and
    a reduce-scatter waits for the gather in flight (one link); still never slower, and equal
    to one process."""
    plain = train_zero(cluster4, PEN.replace(steps=1, batch_size=rows * 4), 3)
    pre = train_zero(cluster4, PEN.replace(steps=1, batch_size=rows * 4), 3, prefetch=True)
    assert pre[0].times[0] <= plain[0].times[0]
    for name, g in plain[0].grads.items():
        assert (pre[0].grads[name] - g).abs().max() == 0, name  # the same sums, in the same order


@pytest.mark.cluster
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hsdp_on_a_2x2_mesh_equals_one_process(cluster4, stage):
    """ZeRO within shard groups {0, 1}, {2, 3}, replicated across {0, 2}, {1, 3}: the same
    steps as one process; each rank sends its group's ZeRO bytes plus one all-reduce of its
    gradient shard across the replicas."""
    from pipelib.data_parallel.zero_formulas import hsdp_comm_bytes
    from pipelib.data_parallel.zero_runner import train_hsdp

    ref = ODD.replace(steps=3, batch_size=8).reference()
    res = train_hsdp(cluster4, ODD.replace(steps=3, batch_size=8), stage, shard=2)
    check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
    assert res[0].losses == pytest.approx(ref.losses, rel=1e-5)
    want = hsdp_comm_bytes(padded_numel([63, 90, 40], 2), 2, 2, stage, mixed_precision=False)
    assert all(r.stats["bytes_sent"] == (want,) * 3 for r in res)
    # sharded over 2, not 4: each rank holds half of the optimizer state
    want = zero_state_bytes(padded_numel([63, 90, 40], 2), 2, stage, False, num_tensors=3)
    assert res[0].stats["memory"]["optimizer"] == want.optimizer
