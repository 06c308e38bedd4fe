"""NCCL's matching rules on gloo (`pipelib.runtime.matching`, `pipelib.comm.ordered`): the two
patterns gloo forgives and NCCL does not are caught on a laptop.

- a receive posted before a send to the same peer: fine on gloo (its sends and receives to one
  peer are independent), a hang on NCCL (one stream per pair, in posting order); under NCCL's
  rules it is a `MatchingRuleError` naming the rank, the peer and the fix;
- a tag-matched exchange (rank 1 receives rank 0's second message first, by tag): fine on gloo,
  wrong on NCCL, which ignores tags; under NCCL's rules on a simulated device the header shows
  it, a `MessageMismatchError` naming both (numel, dtype).

Each pattern runs under both rule sets in one spawned 2-rank job: gloo's complete it (the old
behaviour, so the test fails on the old code), NCCL's refuse it. The exchanges that are right
under both (sendrecv, a 2-rank ring all-reduce, whose left and right peers coincide) give the
same values under both. CI also runs the comm, pipeline, data-, tensor- and context-parallel
tests with PIPELIB_P2P_MATCHING=nccl (tests/test_nccl_matching_suite.py).
"""
import pytest

from pipelib.runtime.matching import MATCHING, MATCHING_ENV, matching_for
from pipelib.runtime.spawn import run_spawned


def _patterns():
    import torch
    import torch.distributed as dist

    from pipelib.comm import collectives
    from pipelib.comm import p2p as comms
    from pipelib.comm.message import MessageMismatchError
    from pipelib.runtime.device import Device, DeviceSpec, set_current
    from pipelib.runtime.matching import MatchingRuleError

    r, out = dist.get_rank(), {}
    peer = 1 - r
    for matching in MATCHING:
        # a receive posted before the send to the same peer, on both ranks
        set_current(Device(r, 2, DeviceSpec("cpu", matching=matching)))
        got = torch.zeros(4)
        h = comms.irecv(got, peer, check=False)
        try:
            comms.wait_all([h, comms.isend(torch.full((4,), float(r)), peer, check=False)])
            out[matching, "recv-before-send"] = got.tolist()
        except MatchingRuleError as e:
            out[matching, "recv-before-send"] = str(e)
            w = dist.isend(torch.zeros(4), peer)  # complete the refused pair's receive, outside pipelib
            h.wait()
            w.wait()
        # the same exchange, batched: right under both rules
        got = torch.zeros(4)
        comms.sendrecv(torch.full((4,), float(r)), peer, got, peer, check=False)
        out[matching, "sendrecv"] = got.tolist()
        # a tag-matched exchange on a simulated device (its messages carry a header)
        set_current(Device(r, 2, DeviceSpec("sim", matching=matching)))
        if r == 0:
            comms.wait_all([comms.isend(torch.full((4,), 1.0), 1, tag=1),
                            comms.isend(torch.full((4,), 2, dtype=torch.int32), 1, tag=2)])
        else:
            a, b = torch.zeros(4), torch.zeros(4, dtype=torch.int32)
            try:
                comms.wait_all([comms.irecv(b, 0, tag=2), comms.irecv(a, 0, tag=1)])
                out[matching, "by-tag"] = (a.tolist(), b.tolist())
            except MessageMismatchError as e:
                out[matching, "by-tag"] = str(e)
        # a 2-rank ring: left and right are the same peer
        x = torch.arange(6.0) * (r + 1)
        collectives.all_reduce(x)
        out[matching, "all_reduce"] = x.tolist()
    set_current(None)
    return out


@pytest.fixture(scope="module")
def outcomes():
    return run_spawned(_patterns, 2, timeout=120, env={MATCHING_ENV: ""})


def test_a_receive_before_a_send_is_refused_under_nccl_rules_and_fine_under_gloo(outcomes):
    for r, out in enumerate(outcomes):
        assert out["gloo", "recv-before-send"] == [float(1 - r)] * 4
        msg = out["nccl", "recv-before-send"]
        assert isinstance(msg, str), f"rank {r}: NCCL's rules let a receive-before-send pair through"
        assert f"rank {r}: send: a send to rank {1 - r} posted while the receive 'recv' from rank {1 - r}" in msg
        assert "one batch" in msg and "wait for each other" in msg


def test_a_tag_matched_exchange_is_caught_under_nccl_rules_and_fine_under_gloo(outcomes):
    assert outcomes[1]["gloo", "by-tag"] == ([1.0] * 4, [2] * 4)
    msg = outcomes[1]["nccl", "by-tag"]
    assert isinstance(msg, str), "NCCL's rules matched messages by tag"
    assert "expected 4 elements of int32 (4,), but rank 0 sent 4 elements of float32" in msg


def test_batched_exchanges_and_a_two_rank_ring_agree_under_both_rules(outcomes):
    for r, out in enumerate(outcomes):
        for matching in MATCHING:
            assert out[matching, "sendrecv"] == [float(1 - r)] * 4
            assert out[matching, "all_reduce"] == [3.0 * i for i in range(6)]


def test_which_rules_a_device_follows(monkeypatch):
    monkeypatch.delenv(MATCHING_ENV, raising=False)
    assert (matching_for("cpu"), matching_for("sim"), matching_for("cuda")) == ("gloo", "gloo", "nccl")
    assert matching_for("cpu", "nccl") == "nccl"
    monkeypatch.setenv(MATCHING_ENV, "nccl")
    assert (matching_for("cpu"), matching_for("cpu", "gloo")) == ("nccl", "gloo")
    with pytest.raises(ValueError, match=r"matching='tcp': unknown point-to-point rules; use one of \('gloo'"):
        matching_for("cpu", "tcp")
    monkeypatch.setenv(MATCHING_ENV, "mpi")
    with pytest.raises(ValueError, match=r"PIPELIB_P2P_MATCHING='mpi': unknown"):
        matching_for("sim")
    with pytest.raises(ValueError, match="matching='gloo' on a cuda device"):
        matching_for("cuda", "gloo")
