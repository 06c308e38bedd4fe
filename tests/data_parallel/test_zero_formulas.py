"""ZeRO's formulas: the paper's numbers, seed 003's milestone, padding, errors, figures (pure);
ZeRO-3's timing model against the virtual clock (one cluster test)."""
import pytest

from pipelib.data_parallel.zero_formulas import (
    check_stage,
    milestone_table,
    padded_numel,
    zero3_times,
    zero_comm_bytes,
    zero_state_bytes,
)
from pipelib.model import MLPConfig
from pipelib.recipe import Recipe


def test_the_papers_table_and_seed_003s_milestone():
    gb = milestone_table(7_500_000_000, 64)  # ZeRO paper, Figure 1: 120 / 31.4 / 16.6 / 1.9 GB
    assert [round(gb[s], 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
    gb = milestone_table(100_000_000, 2)     # seed 003: 1.6 / 0.9 (ZeRO-2) / 0.8 (ZeRO-3) GB
    assert [round(gb[s], 2) for s in range(4)] == [1.6, 1.0, 0.9, 0.8]
    big = milestone_table(10_000_000_000, 8)
    assert round(big[0]) == 160 and round(big[3]) == 20


@pytest.mark.parametrize("mixed,p,g,k", [(True, 2, 2, 12), (False, 4, 4, 8)])
def test_bytes_per_stage(mixed, p, g, k):
    psi, n = 1200, 4
    assert zero_state_bytes(psi, n, 0, mixed).total == 16 * psi
    s1, s2, s3 = (zero_state_bytes(psi, n, s, mixed) for s in (1, 2, 3))
    assert (s1.params, s1.grads, s1.optimizer) == (p * psi, g * psi, k * psi // n)
    assert (s2.params, s2.grads, s2.optimizer) == (p * psi, g * psi // n, k * psi // n)
    assert s3.total == 16 * psi // n
    assert zero_state_bytes(psi, n, 1, mixed, num_tensors=3).optimizer == k * psi // n + 12


def test_padding_and_communication():
    assert padded_numel([63, 90, 40], 4) == 64 + 92 + 40
    assert padded_numel([63, 90, 40], 1) == 193
    assert zero_comm_bytes(196, 4, 2, mixed_precision=False) == 2 * 3 * 196 * 4 // 4
    assert zero_comm_bytes(196, 4, 3, mixed_precision=False) == 3 * 3 * 196 * 4 // 4
    assert zero_comm_bytes(196, 1, 3) == 0


@pytest.mark.parametrize("bad", [4, -1, 1.5, "3", True, None])
def test_stage_outside_0_to_3_is_refused(bad):
    with pytest.raises(ValueError, match="is not a ZeRO stage; use 0 .* 3 \\(and parameters\\)"):
        check_stage(bad)


def test_memory_figure_stacks_measured_beside_formula():
    from pipelib.viz.zero import loss_curves_figure, milestone_figure, zero_memory_figure

    rows = [{"stage": s, "measured": {"parameters": 10, "gradients": 20, "optimizer": 30},
             "formula": {"parameters": 10, "gradients": 20, "optimizer": 30}} for s in range(4)]
    fig = zero_memory_figure(rows, capacity=50)
    assert [t.name for t in fig.data] == ["parameters", "gradients", "optimizer"]
    assert len(fig.data[0].y) == 8 and fig.layout.barmode == "stack"
    assert len(milestone_figure(1e9, [1, 2], {0: [16, 16], 3: [16, 8]}).data) == 2
    assert len(loss_curves_figure({"a": [3, 2, 1]}).data) == 1


def test_traffic_with_gradient_accumulation_and_fp32_gradients():
    psi, n = 1200, 4
    ddp = zero_comm_bytes(psi, n, 0, accumulate=8)
    assert ddp == zero_comm_bytes(psi, n, 0) == zero_comm_bytes(psi, n, 1, accumulate=8)  # once per step
    for k in (1, 2, 8):  # ZeRO-2: (k+1)(N-1)/N psi, ZeRO-3: 3k(N-1)/N psi (16-bit elements)
        assert zero_comm_bytes(psi, n, 2, accumulate=k) == (k + 1) * 3 * psi * 2 // 4
        assert zero_comm_bytes(psi, n, 3, accumulate=k) == 3 * k * 3 * psi * 2 // 4
        assert zero_comm_bytes(psi, n, 3, accumulate=k, reshard_after_forward=False) == 2 * k * 3 * psi * 2 // 4
    # fp32 gradients under bf16 parameters: the reductions carry 4 bytes, the gathers 2
    assert zero_comm_bytes(psi, n, 1, fp32_grads=True) == (4 + 2) * 3 * psi // 4
    with pytest.raises(ValueError, match="accumulate=0"):
        zero_comm_bytes(psi, n, 2, accumulate=0)


def test_family_table():
    from pipelib.data_parallel.zero_family import root_unsharded_bytes, zero_family

    rows = {r.name.split(" (")[0]: r for r in zero_family(64, 8)}
    for stage, name in enumerate(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP")):
        assert rows[name].gpu == zero_state_bytes(64 * 1000, 64, stage).total / (64 * 1000)
    # ZeRO++: cross-node volume 3 M -> 0.75 M (M = the 16-bit model, 2 bytes per parameter)
    assert rows["ZeRO-3 / FSDP"].cross_node == 3 * 2 and rows["ZeRO++"].cross_node == 0.75 * 2
    assert rows["FSDP reshard_after_forward=False"].sent == 2 / 3 * rows["ZeRO-3 / FSDP"].sent
    # HSDP over one node of 8: an eighth of the states, only the gradient shard's all-reduce crosses nodes
    assert rows["HSDP"].gpu == 2 and rows["HSDP"].cross_node == 4 / 8
    one_group = {r.name.split(" (")[0]: r for r in zero_family(8, 8)}
    assert one_group["HSDP"].sent == one_group["ZeRO-3 / FSDP"].sent and one_group["HSDP"].cross_node == 0
    assert root_unsharded_bytes(128_000, 8192) == 2_097_152_000  # about 2 GB in bf16
    with pytest.raises(ValueError, match="multiple of node_size=8"):
        zero_family(12, 8)


def test_zero3_timing_model_says_when_prefetch_hides_everything():
    from pipelib.costmodel import get_profile

    toy = get_profile("toy-gpu")
    short, long = (zero3_times([256, 256, 256], rows, 4, toy) for rows in (8, 32))
    assert short.forwards[0] < short.gathers[0] and short.prefetch_saves is None  # partly hidden: no claim
    assert long.forwards[0] > long.gathers[0] and long.prefetch_saves == 2 * long.gathers[0]
    assert short.extra == long.extra  # the gathers and Adam do not depend on the rows
    assert long.adam_full == 4 * long.adam_shard and long.no_reshard_saves == sum(long.gathers)
    with pytest.raises(ValueError, match="has no layer"):
        zero3_times([256], 32, 4, toy)


@pytest.mark.cluster
@pytest.mark.usefixtures("one_thread")
def test_zero3_timing_model_against_the_clock(cluster4):
    """Three layers of different sizes, one not divisible by 4 (padding): the clock's ZeRO-3
    step minus stage 0's, and what prefetch and reshard_after_forward=False take off, equal
    `zero3_times` to rounding (the virtual clock adds the same terms)."""
    from pipelib.costmodel import get_profile
    from pipelib.data_parallel.zero_runner import train_zero

    spec = Recipe(MLPConfig(in_features=128, hidden=250, out_features=64, num_layers=3), lr=1e-3)
    n, rows = 4, 64
    model = zero3_times([128, 250, 250, 64], rows, n, get_profile("toy-gpu"))
    assert model.prefetch_saves is not None  # every layer computes longer than its neighbours' gathers
    t = {}
    for name, stage, kw in (("stage 0", 0, {}), ("ZeRO-3", 3, {}), ("prefetch", 3, {"prefetch": True}),
                            ("no reshard", 3, {"reshard_after_forward": False})):
        cluster4.reset()  # clocks from 0: after earlier tests they stand at large values, where a
        # difference of two sums of many terms rounds by more than 1e-9 s (train_zero does not reset)
        run = spec.replace(steps=1, batch_size=rows * n)
        t[name] = train_zero(cluster4, run, stage, world_size=n, **kw)[0].times[0]
    assert t["ZeRO-3"] - t["stage 0"] == pytest.approx(model.extra, abs=1e-9)
    assert t["ZeRO-3"] - t["prefetch"] == pytest.approx(model.prefetch_saves, abs=1e-9)
    assert t["ZeRO-3"] - t["no reshard"] == pytest.approx(model.no_reshard_saves, abs=1e-9)
