"""The DDP step on paper (pipelib.data_parallel.efficiency) and the simulated cluster agree
exactly; the formulas behave as chapter 07 says (psi cancels in the bandwidth term)."""
import pytest

from pipelib.costmodel import get_profile
from pipelib.data_parallel.efficiency import (
    DDPStep,
    all_reduce_time,
    crossover_params,
    ddp_step_model,
    scaled_profile,
    step_parts,
    two_ranks_slower,
)
from pipelib.model import GPTConfig
from pipelib.trace import Event, Kind, Trace

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)


def test_step_arithmetic():
    s = DDPStep(forward=1.0, backward=2.0, optimizer=0.5, comm=1.0)
    assert s.compute == 3.0 and s.step == 4.5 and s.efficiency == 0.75 and s.overhead == pytest.approx(1 / 3)


def test_scaled_profile():
    h = get_profile("h100")
    p = scaled_profile("h100", 4, "pcie5")
    assert p.flops == h.flops / 4 and p.mem_bandwidth == h.mem_bandwidth and p.link.name == "pcie5"
    for bad, words in ((dict(factor=0), "factor=0"), (dict(link="carrier-pigeon"), "carrier-pigeon")):
        with pytest.raises(ValueError, match=words):
            scaled_profile("h100", **{"factor": 1, **bad})


def test_all_reduce_time_is_the_ring():
    link = get_profile("toy-gpu").link
    assert all_reduce_time([1000], 4, "toy-gpu") == pytest.approx(6 * link.alpha + 1.5 * 4000 / link.beta)
    assert all_reduce_time([10, 20], 2, "toy-gpu") == pytest.approx(4 * link.alpha + 120 / link.beta)


def test_psi_cancels_and_tokens_decide():
    """Big models at a fixed batch: comm / compute is the same whatever psi; 4x the tokens, 1/4."""
    prof = scaled_profile("h100", 100, "pcie5")
    big = [GPTConfig(vocab_size=64, block_size=16, n_layer=l, n_head=4, n_embd=w) for l, w in ((12, 768), (24, 2048))]
    o = [ddp_step_model(c, 8, 2, prof).overhead for c in big]
    assert o[0] == pytest.approx(o[1], rel=0.03)
    quarter = ddp_step_model(big[1], 8, 2, scaled_profile("h100", 25, "pcie5")).overhead
    assert quarter == pytest.approx(4 * o[1], rel=0.02)
    assert ddp_step_model(CFG, 8, 1, prof).comm == 0.0
    assert two_ranks_slower(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4), 16, prof)


def test_step_parts_sums_each_lane():
    t = Trace([Event(0, Kind.COMPUTE, "F", 0, 1), Event(0, Kind.COMPUTE, "B", 1, 3),
               Event(0, Kind.COLLECTIVE, "all_reduce", 2, 4), Event(0, Kind.RECV_WAIT, "wait all-reduce", 3, 4),
               Event(0, Kind.RECV_WAIT, "all_reduce step 0", 2, 3), Event(1, Kind.COMPUTE, "F", 0, 9),
               Event(0, Kind.COMPUTE, "optimizer", 4, 4.5)])
    assert step_parts(t) == {"forward": 1, "backward": 2, "optimizer": 0.5, "comm": 2, "exposed": 1}


@pytest.mark.cluster
@pytest.mark.parametrize("bucket_bytes", [None, 4096, 1 << 20])
def test_the_virtual_clock_equals_the_model(cluster4, bucket_bytes):
    from pipelib.data_parallel.runner import run_ddp

    prof = scaled_profile("h100", 50, "pcie5")
    step = "all_reduce" if bucket_bytes is None else "buckets"
    kw = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
    for n in (2, 4):
        res = run_ddp(cluster4, step, CFG, ranks=n, steps=1, batch=4 * n, profile=prof, **kw)
        model = ddp_step_model(CFG, 4, n, prof, bucket_bytes=bucket_bytes)
        parts = step_parts(cluster4.trace())
        assert res[0].times[0] == pytest.approx(model.step, rel=1e-9)
        assert parts["comm"] == pytest.approx(model.comm, rel=1e-9) == parts["exposed"]
        assert parts["forward"] + parts["backward"] == pytest.approx(model.compute, rel=1e-9)


def test_crossover_closed_form():
    nv, pcie = scaled_profile("h100", 1, "nvlink4"), scaled_profile("h100", 1, "pcie5")
    psi = crossover_params(49152, nv)
    # at psi*, the compute saved equals the all-reduce: 3 psi T / F = 2 alpha + 4 psi / beta
    assert 3 * psi * 49152 / nv.flops == pytest.approx(2 * nv.link.alpha + 4 * psi / nv.link.beta)
    assert crossover_params(49152, pcie) > psi                      # a slower link needs a bigger model
    assert crossover_params(12288, pcie) == float("inf")            # PCIe's bandwidth alone loses below 26k tokens
    assert crossover_params(49152, nv, buckets=3) == pytest.approx(3 * psi)


BIG = GPTConfig(vocab_size=64, block_size=32, n_layer=24, n_head=4, n_embd=2048)   # 1.2 B parameters


def test_overlapped_step_model_bounds():
    """Step 3 on paper: never faster than compute or than forward + the all-reduces, never slower
    than step 2; the last bucket (ready when backward ends) is always exposed."""
    from pipelib.data_parallel.buckets import plan_buckets
    from pipelib.memory import gpt_param_shapes

    for link, factor in (("pcie5", 192), ("pcie5", 4), ("nvlink4", 192)):
        prof = scaled_profile("h100-pcie-cluster", factor, link)
        for bb in (1 << 20, 25 << 20):
            flat = ddp_step_model(BIG, 8, 2, prof, bucket_bytes=bb)
            over = ddp_step_model(BIG, 8, 2, prof, bucket_bytes=bb, overlap=True)
            assert over.comm == flat.comm and over.compute == flat.compute
            assert flat.forward + max(flat.backward, flat.comm) + flat.optimizer <= over.step <= flat.step
            sizes = [(k, int(torch_prod(s))) for k, s in gpt_param_shapes(BIG).items()]
            last = all_reduce_time([plan_buckets(sizes, bb)[-1].numel], 2, prof)
            assert over.exposed >= last * (1 - 1e-12)
    assert DDPStep(1.0, 2.0, 0.5, 1.0, exposed=0.25).step == 3.75


def torch_prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out


def test_mfu_scales_the_flops():
    p = scaled_profile("h100-pcie-cluster", 2, "pcie5", mfu=0.45)
    assert p.flops == pytest.approx(756e12 * 0.45 / 2) and "45% MFU" in p.name
    with pytest.raises(ValueError, match="mfu=1.5"):
        scaled_profile("h100", mfu=1.5)
    # at 45% of peak the same step computes 1/0.45 times longer: the no-overlap overhead x 0.45 (+ latency)
    o1 = ddp_step_model(BIG, 8, 2, scaled_profile("h100-pcie-cluster", 192, "pcie5")).overhead
    o45 = ddp_step_model(BIG, 8, 2, scaled_profile("h100-pcie-cluster", 192, "pcie5", mfu=0.45)).overhead
    assert o45 == pytest.approx(0.45 * o1, rel=1e-9)


def test_bandwidth_bounds_with_and_without_overlap():
    """2 ranks lose at every size below T = 4F/(3 beta) without overlap, 4F/(5 beta) with ideal
    overlap; the H100 PCIe card (756 TFLOP/s) over PCIe 5 has F/beta = 15,120."""
    from pipelib.data_parallel.efficiency import crossover_tokens

    p = scaled_profile("h100-pcie-cluster", 1, "pcie5")
    assert p.flops_per_link_byte == pytest.approx(15_120)
    assert crossover_tokens(p) == pytest.approx(4 * 15_120 / 3) and crossover_tokens(p, 4) == crossover_tokens(p)
    assert crossover_tokens(p, overlap=True) == pytest.approx(4 * 15_120 / 5)
    for overlap in (False, True):
        t = crossover_tokens(p, overlap=overlap)
        assert crossover_params(t * 0.99, p, overlap=overlap) == float("inf")
        assert crossover_params(t * 1.01, p, overlap=overlap) < float("inf")
    # between the two bounds, a 1.2 B model: 2 ranks lose without overlap, win with it (the step model)
    tokens = 16_000
    prof = scaled_profile("h100-pcie-cluster", tokens / (16 * 32), "pcie5")
    assert two_ranks_slower(BIG, 16, prof) and not two_ranks_slower(BIG, 16, prof, overlap=True)


@pytest.mark.cluster
def test_simulated_overlap_between_the_bounds(cluster4):
    """The cluster's step 3 (virtual clock) lies between the ideal overlap and step 2."""
    from pipelib.data_parallel.runner import run_ddp

    prof = scaled_profile("h100-pcie-cluster", 50, "pcie5")
    for bb in (4096, 1 << 20):
        res = run_ddp(cluster4, "overlap", CFG, ranks=2, steps=1, batch=8, profile=prof, bucket_bytes=bb)
        flat = ddp_step_model(CFG, 4, 2, prof, bucket_bytes=bb)
        t = res[0].times[0]
        assert flat.forward + max(flat.backward, flat.comm) + flat.optimizer <= t * (1 + 1e-9)
        assert t <= flat.step * (1 + 1e-9)


def test_overhead_breakdown_is_the_closed_form():
    """Chapter 07's milestone on paper: the step model's overhead, times the GPT's FLOPs over
    6 psi T, is the closed form's bandwidth term plus its latency term, to rounding."""
    from pipelib.data_parallel.buckets import plan_buckets
    from pipelib.data_parallel.efficiency import overhead_breakdown
    from pipelib.memory import gpt_param_shapes

    prof = scaled_profile("h100-pcie-cluster", 1, "pcie5")
    o = overhead_breakdown(BIG, 49152, 2, prof)
    run = ddp_step_model(BIG, 8, 2, scaled_profile("h100-pcie-cluster", 192, "pcie5"))   # 8 x 32 tokens, 192 x slower
    assert o.plain.overhead == pytest.approx(run.overhead, rel=1e-12)
    assert o.plain.overhead * o.flops_over_6psit == pytest.approx(o.bandwidth + o.latency, rel=1e-12)
    assert o.bandwidth == pytest.approx(4 / 3 * 1 / 2 * 15_120 / 49152) and o.flops_per_link_byte == 15_120
    assert o.flops_over_6psit > 1           # attention's FLOPs outweigh the position embedding's none
    sizes = [(k, int(torch_prod(s))) for k, s in gpt_param_shapes(BIG).items()]
    plan = plan_buckets(sizes, 25 << 20)
    assert o.buckets == len(plan) and o.tail[1] == all_reduce_time([plan[-1].numel], 2, prof)
    assert o.tail[1] <= o.overlapped.exposed <= o.plain.comm
    # psi cancels in the bandwidth term; (N-1)/N grows it by 3/2 from 2 to 4 ranks; 4 x fewer tokens, 4 x
    other = GPTConfig(vocab_size=64, block_size=32, n_layer=12, n_head=4, n_embd=768)
    assert overhead_breakdown(other, 49152, 2, prof).bandwidth == pytest.approx(o.bandwidth)
    assert overhead_breakdown(BIG, 49152, 4, prof).bandwidth == pytest.approx(1.5 * o.bandwidth)
    assert overhead_breakdown(BIG, 49152 / 4, 2, prof).plain.overhead == pytest.approx(4 * o.plain.overhead)
    one = overhead_breakdown(CFG, 512, 2, prof)                  # CFG fits one bucket: nothing before it
    assert one.buckets == 1 and one.tail[0] == 0.0 and one.overlapped.exposed == pytest.approx(one.tail[1])
    alone = overhead_breakdown(BIG, 49152, 1, prof)
    assert alone.plain.comm == 0 and alone.tail == (0.0, 0.0) and alone.bandwidth == 0
    with pytest.raises(ValueError, match="tokens=0"):
        overhead_breakdown(BIG, 0, 2, prof)


def test_crossover_tokens_for_any_n():
    """Without overlap 4F/(3 beta) whatever n; with ideal overlap 4(n-1)/(3n-1) F/beta."""
    from pipelib.data_parallel.efficiency import crossover_tokens

    p = scaled_profile("h100", 1, "nvlink4")
    for n in (2, 3, 4, 8, 64):
        assert crossover_tokens(p, n) == pytest.approx(4 / 3 * p.flops_per_link_byte)
        assert crossover_tokens(p, n, overlap=True) == pytest.approx(4 * (n - 1) / (3 * n - 1) * p.flops_per_link_byte)
    assert crossover_tokens(p, 2, itemsize=2) == pytest.approx(crossover_tokens(p, 2) / 2)
