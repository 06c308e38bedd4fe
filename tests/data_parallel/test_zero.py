"""ZeRO stages 0-3 on the cluster: equal to one process, bytes measured against the formulas.

Simulated devices, virtual clock. The MLP below has 193 parameters (odd: no world size divides
it; its layers hold 63, 90 and 40), so the padding of every layer is exercised. After 3 Adam
steps every stage leaves the parameters of one process training on the whole batch, on 2 and 4
ranks; each rank's measured bytes of parameters, gradients and optimizer state equal
`zero_state_bytes` of the padded count exactly; the bytes each rank sends per step, counted
from the trace, are 2 psi (N-1)/N (stages 0-2) and 3 psi (N-1)/N (stage 3) of the padded count.
"""
import pytest
import torch

from pipelib.data_parallel.zero_formulas import padded_numel, zero_comm_bytes, zero_state_bytes
from pipelib.data_parallel.zero_runner import train_zero
from pipelib.results import check_against_reference
from pipelib.model import GPTConfig, MLPConfig
from pipelib.recipe import Recipe

pytestmark = pytest.mark.usefixtures("one_thread")  # the single-process references share 2 cores

ODD = Recipe(MLPConfig(in_features=6, hidden=9, out_features=4, num_layers=3), lr=1e-3)  # 193 parameters
GPT = Recipe(GPTConfig(vocab_size=29, block_size=8, n_layer=2, n_head=2, n_embd=12), lr=1e-3)
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_stage_equals_one_process(cluster4, n, stage):
    ref = ODD.replace(steps=3, batch_size=8).reference()
    psi = sum(p.numel() for p in ref.params.values())
    assert psi == 193 and psi % n
    res = train_zero(cluster4, ODD.replace(steps=3, batch_size=8), stage, world_size=n)
    assert res[n:] == [None] * (4 - n)
    agreed = check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
    assert agreed.num_tensors == 2 * len(ref.params)
    mean = [sum(r.losses[s] for r in res[:n]) / n for s in range(3)]  # each rank: its rows' mean
    assert mean == pytest.approx(ref.losses, rel=1e-5)


@pytest.mark.cluster
@pytest.mark.parametrize("stage", [1, 3])
def test_gpt_with_tied_weights_and_mixed_precision(cluster4, stage):
    ref = GPT.replace(steps=3, batch_size=8).reference()
    res = train_zero(cluster4, GPT.replace(steps=3, batch_size=8), stage, world_size=4)
    check_against_reference(res, ref_grads=ref.grads, ref_params=ref.params, shared=True, **TOL)
    # the head reuses the embedding's weight: stage 3 gathers that layer once more in forward
    emb_shard = (29 * 12 + 8 * 12) // 4
    extra = 3 * emb_shard * 4 if stage == 3 else 0
    assert res[0].stats["bytes_sent"][0] == zero_comm_bytes(res[0].stats["padded"], 4, stage, False) + extra
    # bf16 parameters and gradients, fp32 master weights: against one process doing the same
    ref16 = GPT.replace(steps=3, batch_size=8, mixed_precision=True).reference()
    res16 = train_zero(cluster4, GPT.replace(steps=3, batch_size=8, mixed_precision=True), stage, world_size=4)
    check_against_reference(res16, ref_params=ref16.params, shared=True, rtol=0, atol=2e-3)
    assert sum(r.losses[-1] for r in res16) / 4 == pytest.approx(ref16.losses[-1], abs=2e-2)


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mixed", [False, True])
def test_bytes_equal_the_formulas(cluster4, n, mixed):
    sizes = [63, 90, 40]
    padded = padded_numel(sizes, n)
    for stage in range(4):
        cluster4.reset()
        res = train_zero(cluster4, ODD.replace(steps=2, batch_size=8, mixed_precision=mixed), stage, world_size=n)
        trace = cluster4.trace()
        want = zero_state_bytes(padded, n, stage, mixed, num_tensors=len(sizes))
        for r in range(n):
            s = res[r].stats
            assert s["padded"] == padded and s["psi"] == 193
            got = s["memory"]
            assert (got["parameters"], got["gradients"], got["optimizer"]) == \
                (want.params, want.grads, want.optimizer), (stage, r, got, want)
            tracked = s["tracker"]  # the device's memory tracker holds the same bytes
            assert (tracked["parameters"], tracked["gradients"], tracked["optimizer"]) == \
                (want.params, want.grads, want.optimizer)
            per_step = zero_comm_bytes(padded, n, stage, mixed)
            assert trace.bytes_sent(r) == 2 * per_step, (stage, r)   # counted from the trace
            assert s["bytes_sent"] == (per_step, per_step)          # and from the counters
        assert all(trace.bytes_sent(r) == 0 for r in range(n, 4))


@pytest.mark.cluster
def test_stage3_holds_one_layer_at_a_time(cluster4):
    """The peak of ZeRO-3 is its shards plus the largest gathered layer(s), far below stage 0."""
    res0 = train_zero(cluster4, GPT.replace(steps=1, batch_size=8), 0, world_size=4)
    res3 = train_zero(cluster4, GPT.replace(steps=1, batch_size=8), 3, world_size=4)
    m0, m3 = res0[0].stats["memory"], res3[0].stats["memory"]
    assert m3["parameters"] * 4 <= m0["parameters"] + 4 * 4 * 4  # a quarter, plus padding
    assert res3[0].stats["peak"] < res0[0].stats["peak"]


def test_bad_input_is_refused_before_any_engine_work():
    class NoCluster:  # any engine work would fail: run() is never reached
        world_size = 4

        def run(self, *a, **k):
            raise AssertionError("engine work started")

    with pytest.raises(ValueError, match="stage=4 is not a ZeRO stage; use 0"):
        train_zero(NoCluster(), ODD, 4)
    with pytest.raises(ValueError, match="stage=-1"):
        train_zero(NoCluster(), ODD, -1)
    with pytest.raises(ValueError, match="world_size=8 is larger than the cluster, which has 4 ranks"):
        train_zero(NoCluster(), ODD, 1, world_size=8)
    with pytest.raises(ValueError, match="global batch 6 does not divide by world_size=4"):
        train_zero(NoCluster(), ODD.replace(batch_size=6), 1)


def _wrap_different_models(stage):
    import torch.distributed as dist

    from pipelib.data_parallel.zero import ZeRO

    model = ODD.replace(seed=1 if dist.get_rank() == 2 else 0).build()
    ZeRO(model, None, stage=stage)


@pytest.mark.cluster
def test_replicas_that_differ_are_named(cluster4):
    from pipelib.runtime.errors import RankError

    with pytest.raises(RankError, match=r"layers.0.0.weight.*differs.*rank\(s\) \[2\]"):
        cluster4.run(_wrap_different_models, 3)
    assert cluster4.run(lambda: 1) == [1] * 4  # still usable


def test_bad_stage_or_dtype_is_refused_before_any_communication():
    from pipelib.data_parallel.zero import ZeRO

    model = ODD.build()  # no process group exists in this process: any collective would fail
    with pytest.raises(ValueError, match="stage=7 is not a ZeRO stage"):
        ZeRO(model, None, stage=7)
    with pytest.raises(ValueError, match="param_dtype=torch.float64; mixed precision here keeps bf16"):
        ZeRO(model, None, stage=1, mixed_precision=True, param_dtype=torch.float64)


def _accumulate(stage, group=None):
    """Two half batches, backward twice, one step: the same as one step on the whole batch."""
    import torch.distributed as dist

    from pipelib.data_parallel.zero import ZeRO
    from pipelib.recipe import loss_of

    zero = ZeRO(ODD.build(), group, stage=stage)
    x, y = ODD.replace(batch_size=8).batch(0, dist.get_rank(), dist.get_world_size())
    for half in (slice(0, 1), slice(1, 2)):
        (loss_of(zero, x[half], y[half]) / 2).backward()
    zero.step()
    return zero.full_parameters()


@pytest.mark.cluster
@pytest.mark.parametrize("stage", [1, 3])
def test_gradient_accumulation(cluster4, stage):
    ref = ODD.replace(steps=1, batch_size=8).reference()
    for params in cluster4.run(_accumulate, stage):
        for k, v in ref.params.items():
            torch.testing.assert_close(params[k], v, **TOL)


class _Any(torch.nn.Module):
    """Not one of the book's models: blocks in a ModuleList, a root parameter, a frozen layer."""

    def __init__(self, device=None):
        super().__init__()
        self.embed = torch.nn.Linear(3, 4, device=device)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(4, 4, device=device), torch.nn.ReLU())
                                          for _ in range(2))
        self.frozen = torch.nn.Linear(4, 4, device=device).requires_grad_(False)
        self.scale = torch.nn.Parameter(torch.ones(4, device=device))


def test_units_of_any_model():
    """The book's models keep their layers; any other model is cut into its children, the items
    of a ModuleList one by one (per block, as FSDP is applied), and frozen parameters join none."""
    from pipelib.data_parallel.zero_units import build_units, unit_modules

    assert [n for n, _ in unit_modules(ODD.build())] == ["layers.0", "layers.1", "layers.2"]
    assert [n for n, _ in unit_modules(GPT.build())] == ["embed", "blocks.0", "blocks.1", "head"]
    model = _Any()
    units, uses = build_units(model, 2, 0, torch.float32)
    assert [(u.name, u.numel) for u in units] == [("embed", 16), ("blocks.0", 20), ("blocks.1", 20), ("rest", 4)]
    assert uses[model] == [units[-1]] and uses[model.blocks[1]] == [units[2]]
    assert not any(id(p) in {id(q) for _, q in u.params} for u in units for p in model.frozen.parameters())
    policy = unit_modules(_Any(), lambda m: isinstance(m, torch.nn.Linear))
    assert [n for n, _ in policy] == ["embed", "blocks.0.0", "blocks.1.0", "frozen"]
    named = _Any()
    assert [m for _, m in unit_modules(named, ["blocks.1", named.embed])] == [named.blocks[1], named.embed]
    with pytest.raises(ValueError, match="not a submodule of the model"):
        unit_modules(named, [torch.nn.Linear(1, 1)])


def test_buffers_live_on_the_parameters_device():
    """Every flat buffer is made where the parameters are (a CUDA model stays on its GPU): shown
    on torch's meta device, which allocates nothing."""
    from pipelib.data_parallel.zero_units import build_units

    units, _ = build_units(_Any(device="meta"), 2, 1, torch.float32)
    assert {u.flat.device.type for u in units} == {u.flat_grads().device.type for u in units} == {"meta"}
    assert {p.device.type for u in units for _, p in u.params} == {"meta"}


def test_optimizer_argument_is_checked_before_any_communication():
    from pipelib.data_parallel.zero import ZeRO

    model = _Any()  # no process group exists in this process: any collective would fail
    with pytest.raises(TypeError, match="pass the optimizer's class"):
        ZeRO(model, None, 1, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="adamw=True with optimizer="):
        ZeRO(model, None, 1, optimizer=torch.optim.SGD, adamw=True)


@pytest.mark.cluster
def test_bench_contestants_race_in_turn_smoke(cluster4):
    """Smoke test of bench/data_parallel_zero.py's race: pipelib's ZeRO-3 and stage 0 and torch's
    FSDP2 built side by side, one step each in turn (alternate_steps), every time measured."""
    from pipelib.data_parallel.zero_bench import zero_bench_setup, zero_bench_times

    spec = Recipe(MLPConfig(in_features=8, hidden=16, out_features=4, num_layers=2), lr=1e-3)
    psi = cluster4.run(zero_bench_setup, spec.replace(batch_size=8))[0]
    out = cluster4.run(zero_bench_times, ("zero3", "fsdp2", "zero0"), 2)
    assert psi > 0 and all(o == out[0] for o in out)  # every rank holds the slowest rank's times
    assert sorted(out[0]) == ["fsdp2", "zero0", "zero3"] and all(len(v) == 2 for v in out[0].values())


def _clipped_sgd_step(stage, group=None):
    import torch.distributed as dist

    from pipelib.data_parallel.zero import ZeRO
    from pipelib.recipe import loss_of

    zero = ZeRO(ODD.build(), group, stage=stage, optimizer=torch.optim.SGD, lr=0.5)
    x, y = ODD.replace(batch_size=8).batch(0, dist.get_rank(), dist.get_world_size())
    loss_of(zero, x, y).backward()
    norm = zero.clip_grad_norm_(0.1)
    zero.step()
    return norm, zero.full_parameters()


@pytest.mark.cluster
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_global_norm_clipping_of_sharded_gradients_equals_torch(cluster4, stage):
    """torch.nn.utils.clip_grad_norm_ on one process, the whole batch, then SGD: the same norm
    and the same parameters as ZeRO clipping its shards with one all-reduce of a scalar."""
    from pipelib.recipe import loss_of

    model = ODD.build()
    x, y = ODD.replace(batch_size=8).batch(0)
    loss_of(model, x, y).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1).item()
    assert norm > 0.1  # the clip must act for the test to mean something
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    for got_norm, params in cluster4.run(_clipped_sgd_step, stage):
        assert got_norm == pytest.approx(norm, rel=1e-5)
        for k, p in model.named_parameters():
            torch.testing.assert_close(params[k], p.detach(), **TOL)
