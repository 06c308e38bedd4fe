"""The chapter-17 helpers that replaced notebook code: `max_shard_len` with a shorter count of
buffers, `forward_wait` read from a trace, `ring_overlap` on the cluster; and the grouped-query
crossover ratio once latency counts."""
import math

import pytest
import torch

from pipelib.context_parallel import costs
from pipelib.trace import Event, Kind, Trace

H, D, TILE = 4, 8, 64


def _short(m):   # the saved tensors, the score block, three K/V-sized buffers
    return m.saved + m.scores + 3 * m.kv_block


def _by_hand(capacity, itemsize, count):
    c = 2
    while count(costs.ring_memory(1, H, c + 2, D, itemsize, "zigzag", TILE)) <= capacity:
        c += 2
    return c


@pytest.mark.parametrize("itemsize", [2, 4])
def test_max_shard_len_takes_a_count(itemsize):
    cap = 4 * 1024 * 1024
    full = costs.max_shard_len(cap, 1, H, D, itemsize, tile=TILE)
    short = costs.max_shard_len(cap, 1, H, D, itemsize, tile=TILE, count=_short)
    assert full == costs.max_shard_len(cap, 1, H, D, itemsize, tile=TILE, count=lambda m: m.total)
    assert full == _by_hand(cap, itemsize, lambda m: m.total) and short == _by_hand(cap, itemsize, _short)
    assert costs.ring_peak_bytes(1, H, full, D, itemsize, tile=TILE) <= cap
    assert costs.ring_peak_bytes(1, H, full + 2, D, itemsize, tile=TILE) > cap
    assert short > full                           # the shorter list of buffers promises more


def test_forward_wait_counts_only_the_forward_receives():
    evs = [Event(0, Kind.RECV_WAIT, "ring_attention forward step 1 chunk 3", 0.0, 2.0),
           Event(1, Kind.RECV_WAIT, "ring_attention forward step 2 chunk 3", 1.0, 1.5),
           Event(1, Kind.RECV_WAIT, "ring_attention_backward kv step 1 chunk 0", 3.0, 7.0),
           Event(0, Kind.TRANSFER, "ring_attention forward step 1 chunk 3", 0.0, 9.0),
           Event(0, Kind.COMPUTE, "F", 0.0, 1.0)]
    assert costs.forward_wait(Trace(evs)) == 2.5
    assert costs.forward_wait(Trace(evs[2:])) == 0


@pytest.mark.parametrize("name", ["h100", "h100-pcie-cluster", "toy-gpu"])
def test_gqa_crossover_ratio_lies_between_hkv_over_h_and_the_latency_stretch(name):
    """a c^2 = alpha + b c: with alpha = 0 the root b / a scales with H_kv exactly; alpha > 0
    lengthens every root, a small b's most, so the ratio rises above H_kv / H but stays below
    H_kv / H times the GQA root's own stretch (the multi-head root is at least its b / a)."""
    from pipelib.costmodel import get_profile

    p = get_profile(name)

    def star(kv, alpha):
        return costs.crossover_shard_len(p.flops, alpha, p.link.beta, 1, 64, 128, 2, pairs_share=0.5, kv_heads=kv)

    g = 8 / 64
    assert math.isclose(star(8, 0.0) / star(64, 0.0), g)
    ratios = [star(8, a) / star(64, a) for a in (p.link.alpha / 4, p.link.alpha, 4 * p.link.alpha)]
    for a, r in zip((p.link.alpha / 4, p.link.alpha, 4 * p.link.alpha), ratios):
        assert g < r <= g * star(8, a) / star(8, 0.0)
    assert ratios == sorted(ratios)               # more latency, further from H_kv / H


@pytest.mark.cluster
def test_ring_overlap_reads_one_step(cluster4):
    from pipelib.context_parallel.timing import ring_overlap
    from pipelib.costmodel import get_profile

    toy = get_profile("toy-gpu")
    cstar = costs.crossover_shard_len(toy.flops, toy.link.alpha, toy.link.beta, 1, 2, 8, 4, pairs_share=0.5)
    below, above = 2 * math.floor(cstar / 2), 2 * math.ceil(cstar / 2)
    under, over = (ring_overlap(cluster4, c, heads=2, head_dim=8, dtype=torch.float32) for c in (below, above))
    assert under["forward_wait"] > 0 == over["forward_wait"]      # the crossover, from the trace
    assert (under["shard_len"], over["shard_len"]) == (below, above)
    for r in (under, over):
        assert r["hidden"] == pytest.approx(1 - r["waited"] / r["transfer"])
    assert not cluster4.trace().events            # the step's trace was taken: nothing left behind
