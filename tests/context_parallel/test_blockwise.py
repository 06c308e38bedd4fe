"""The pure pieces of chapter 17: partitions, the online-softmax merge, the formulas."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from pipelib.context_parallel import blockwise as bw
from pipelib.context_parallel import costs
from pipelib.context_parallel import partition as part


def test_merge_in_any_order_is_exact():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 4, generator=g, dtype=torch.float64) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v)
    blocks = [(0, 3), (3, 4), (4, 9), (9, 10)]
    for order in itertools.permutations(blocks):
        out = lse = None
        for a, b in order:
            o, l = bw.block_attention(q, k[:, :, a:b], v[:, :, a:b], torch.arange(10), torch.arange(a, b), False)
            out, lse = bw.merge_partials(out, lse, o, l)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-13)
        torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 2, -1), rtol=0, atol=1e-13)


@pytest.mark.parametrize("layout", part.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_forward_and_backward_equal_sdpa(layout, causal):
    n, S = 3, 12
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 2, S, 4, generator=g, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    ref.backward(do)
    pieces = [part.shard_pieces(S, n, r, layout) for r in range(n)]
    sh = [[part.split_sequence(t, n, r, layout) for r in range(n)] for t in (q, k, v, do)]
    outs, dqs = [], []
    dks, dvs = [torch.zeros_like(x) for x in sh[1]], [torch.zeros_like(x) for x in sh[2]]
    for r in range(n):
        out, lse = None, None
        for j in reversed(range(n)):  # any order
            o, l, _ = bw.attend_pieces(sh[0][r], sh[1][j], sh[2][j], pieces[r], pieces[j], causal)
            out, lse = bw.merge_partials(out, lse, o, l)
        outs.append(out)
        dq = 0
        for j in range(n):
            a, b, c, _ = bw.attend_pieces_backward(sh[3][r], sh[0][r], sh[1][j], sh[2][j], lse,
                                                   (sh[3][r] * out).sum(-1), pieces[r], pieces[j], causal)
            dq, dks[j], dvs[j] = dq + a, dks[j] + b, dvs[j] + c
        dqs.append(dq)
    for got, want in ((outs, ref), (dqs, leaves[0].grad), (dks, leaves[1].grad), (dvs, leaves[2].grad)):
        torch.testing.assert_close(part.join_sequence(got, layout), want.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_balance(n):
    S = 2 * n * 32
    zig = part.work_per_rank(S, n, "zigzag")
    assert len(set(zig)) == 1                       # exactly equal: max/mean = 1
    h = S // (2 * n)
    assert zig[0] == (2 * n - 1) * h * h + h * (h + 1)
    c = S // n
    assert part.work_per_rank(S, n, "contiguous") == [r * c * c + c * (c + 1) // 2 for r in range(n)]
    assert part.imbalance(part.work_per_rank(S, n, "striped")) < 1.05
    # contiguous: max/mean -> (2n-1)/n when a diagonal block costs half a block, 2n/(n+1) when whole
    assert abs(part.imbalance(part.work_per_rank(S, n, "contiguous")) - (2 * n - 1) / n) < 0.05


def test_bad_sequence_lengths_are_named():
    with pytest.raises(ValueError, match=r"sequence length 30 does not split into 2n = 8 chunks .*30 % 8 = 6"):
        part.check_layout(30, 4, "zigzag")
    with pytest.raises(ValueError, match=r"sequence length 10 does not split into n = 4 shards"):
        part.split_sequence(torch.zeros(1, 1, 10, 2), 4, 0, "contiguous")
    names = r"\('contiguous', 'zigzag', 'striped'\)"
    with pytest.raises(ValueError, match=rf"unknown layout 'diagonal'; use one of {names}"):
        part.check_layout(8, 2, "diagonal")


def test_layout_registry_deals_every_position_once():
    from pipelib.context_parallel.layouts import REGISTRY, layout_info

    assert part.LAYOUTS == tuple(REGISTRY) == ("contiguous", "zigzag", "striped")
    assert layout_info("zigzag").ranges(16, 4, 1) == (range(2, 4), range(12, 14))
    for name, info in REGISTRY.items():
        for n in (1, 2, 3, 4):
            S = 12 * n
            got = sorted(p for r in range(n) for rg in info.ranges(S, n, r) for p in rg)
            assert got == list(range(S)), name
            assert max(len(rg) for rg in info.ranges(S, n, 0)) == info.longest_piece(S // n), name


def test_formulas():
    assert costs.ring_bytes(1, 4, 8, 8, 8, 4) == {"forward": 12288, "backward": 28672}
    assert costs.allgather_bytes(1, 4, 8, 8, 8, 4) == {"forward": 12288, "backward": 12288}
    assert costs.ulysses_bytes(1, 4, 8, 8, 8, 4) == {"forward": 6144, "backward": 6144}
    # crossover without latency: c* = i F / (2 beta)
    assert costs.crossover_shard_len(1e12, 0.0, 1e10, 1, 8, 64, 2) == pytest.approx(100.0)
    # Q, K, V, O saved, K/V, next K/V, dK/dV, incoming dK/dV, dQ, one block's dQ, dK, dV: 16 B H c D;
    # lse B H c; S and P of the zigzag half-shard, 2 B H (c/2)^2 (receive buffers counted since review 17-3)
    assert costs.ring_peak_bytes(1, 4, 8, 8, 8, "zigzag") == 8 * 4 * (16 * 8 * 8 + 8 + 2 * 4 * 4)


def test_figures_draw_from_traces():
    from pipelib.trace import Event, Kind, Trace
    from pipelib.viz.ring import context_figure, overlap_figure, variants_figure, work_figure

    tr = Trace([Event(0, Kind.COMPUTE, "a", 0, 1), Event(1, Kind.COMPUTE, "a", 0, 3)], 2)
    fig = work_figure({"contiguous": tr})
    assert list(fig.data[0].y) == [1, 3] and "max/mean 1.500" in fig.data[0].name
    rows = [{"shard_len": 8, "hidden": 0.5, "step_over_compute": 2.0}]
    assert overlap_figure(rows, 10.0).data[0].y[0] == 50
    assert list(context_figure({1: 10}, {1: 10, 2: 20}).data[0].y) == [10, 20]
    assert len(variants_figure({"ring": {"bytes": 1024, "peak_memory": 2048, "time": 1e-3}}).data) == 3


def test_tiles_bound_the_score_block():
    pieces = part.tile_pieces(part.shard_pieces(16, 2, 0, "zigzag"), 3)
    assert [(a, b) for a, b, _ in pieces] == [(0, 3), (3, 4), (4, 7), (7, 8)]
    assert torch.equal(torch.cat([p for *_, p in pieces]), part.shard_positions(16, 2, 0, "zigzag"))
    assert costs.ring_peak_bytes(1, 1, 64, 1, 4, "zigzag", 8) == 4 * (16 * 64 + 64 + 2 * 64)


def test_deferred_dq_adds_up_to_the_same():
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 8, 4, generator=g, dtype=torch.float64) for _ in range(4))
    pieces = part.shard_pieces(16, 2, 1, "zigzag")
    others = part.shard_pieces(16, 2, 0, "zigzag")
    lse, delta = torch.zeros(1, 2, 8, dtype=torch.float64), torch.zeros(1, 2, 8, dtype=torch.float64)
    dq, dk, dv, pairs = bw.attend_pieces_backward(do, q, k, v, lse, delta, pieces, others, True)
    dq2, dk2, dv2, pairs2, (a, b, finish, later) = bw.attend_pieces_backward(
        do, q, k, v, lse, delta, pieces, others, True, defer_last_dq=True)
    assert not torch.equal(dq, dq2) and later > 0
    dq2[:, :, a:b] += finish()
    assert torch.allclose(dq, dq2) and torch.equal(dk, dk2) and torch.equal(dv, dv2) and pairs == pairs2
