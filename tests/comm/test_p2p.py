"""Point-to-point: checked messages, clear errors naming rank and value, counters, batches."""
import pytest

from pipelib.runtime.errors import RankError

pytestmark = pytest.mark.cluster


def _bad_peer(kind):
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms

    if dist.get_rank() != 1:
        return None
    if kind == "outside":
        comms.isend(torch.ones(2), 7)
    elif kind == "self":
        comms.recv(torch.ones(2), 1)
    elif kind == "tag":
        comms.isend(torch.ones(2), 0, tag=-1)


@pytest.mark.parametrize("kind,pattern", [
    ("outside", r"rank 1 raised ValueError: rank 1: send peer 7 is outside the group \(group ranks are 0\.\.3\)"),
    ("self", r"rank 1: recv to itself \(peer 1 is this rank"),
    ("tag", r"rank 1: tag=-1; pass an integer >= 0 \(a send and its receive must use the same tag\)"),
])
def test_bad_peer_names_rank_and_value(cluster4, kind, pattern):
    with pytest.raises(RankError, match=pattern):
        cluster4.run(_bad_peer, kind)


def _mismatch(numel, dtype):
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms

    r = dist.get_rank()
    if r == 0:
        comms.send(torch.ones(10), 1)
    elif r == 1:
        comms.recv(torch.zeros(numel, dtype=getattr(torch, dtype)), 0)
    return r


@pytest.mark.parametrize("numel,dtype,pattern", [
    (5, "float32", "expected 5 elements of float32 \\(5,\\), but rank 0 sent 10 elements of float32"),
    (20, "float32", "expected 20 elements of float32 \\(20,\\), but rank 0 sent 10 elements"),
    (10, "int32", "expected 10 elements of int32 \\(10,\\), but rank 0 sent 10 elements of float32"),
])
@pytest.mark.gloo_matching  # a real device's checked receive reads the header before posting
def test_mismatched_message_is_an_error_not_a_crash(cluster4, numel, dtype, pattern):
    expected = "rank 1 raised MessageMismatchError: rank 1: recv: receive from rank 0 " + pattern
    with pytest.raises(RankError, match=expected) as err:
        cluster4.run(_mismatch, numel, dtype)
    assert list(err.value.errors) == [1]  # the sender finished: the message was drained
    assert cluster4.run(_mismatch, 10, "float32") == [0, 1, 2, 3]  # and the link is clean


def _exchange():
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms

    r, n = dist.get_rank(), dist.get_world_size()
    comms.reset_counters()
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.zeros(3)
    comms.sendrecv(torch.full((3,), float(r)), right, got, left)
    # two outstanding checked receives from the same peer, waited in reverse order
    a, b = torch.zeros(2), torch.zeros(5)
    if r == 0:
        hs = comms.batch_isend_irecv([comms.P2POp("send", torch.full((2,), 1.0), 1),
                                      comms.P2POp("send", torch.full((5,), 2.0), 1)])
        comms.wait_all(hs)
    elif r == 1:
        ha, hb = comms.irecv(a, 0), comms.irecv(b, 0)
        hb.wait()
        ha.wait()
    # unchecked: irecv posted first, then a blocking send, then the wait (MPI's pattern)
    z = torch.zeros(1000)
    if r in (2, 3):
        h = comms.irecv(z, 5 - r, check=False)
        comms.send(torch.ones(1000), 5 - r, check=False)
        h.wait()
    return got.tolist(), a.tolist(), b.tolist(), z.sum().item(), comms.counters()


@pytest.mark.gloo_matching  # MPI's irecv-then-send pattern, which NCCL's rules refuse
def test_exchanges_batches_order_and_counters(cluster4):
    res = cluster4.run(_exchange)
    for r, (got, a, b, z, cnt) in enumerate(res):
        assert got == [float((r - 1) % 4)] * 3
        if r == 1:
            assert a == [1.0] * 2 and b == [2.0] * 5
        sent = 12 + (28 if r == 0 else 0) + (4000 if r in (2, 3) else 0)
        recvd = 12 + (28 if r == 1 else 0) + (4000 if r in (2, 3) else 0)
        assert (cnt["bytes_sent"], cnt["bytes_received"]) == (sent, recvd), (r, cnt)
        assert z == (1000.0 if r in (2, 3) else 0.0)


def _pingpong_sim():
    from pipelib.comm import lab

    return lab.pingpong([1, 1024, 2**20], repeats=2)


def test_alpha_beta_fit_is_exact_on_sim(cluster4):
    from pipelib.comm.alphabeta import fit_alpha_beta
    from pipelib.costmodel import PROFILES

    link = PROFILES["toy-gpu"].link
    rows = cluster4.run(_pingpong_sim)[0]
    alpha, beta = fit_alpha_beta([r["bytes"] for r in rows], [r["time"] for r in rows])
    assert alpha == pytest.approx(link.alpha, rel=1e-9) and beta == pytest.approx(link.beta, rel=1e-9)
