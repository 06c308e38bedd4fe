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
