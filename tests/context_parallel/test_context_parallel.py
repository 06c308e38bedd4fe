"""Ring attention, all-gather and Ulysses on live ranks: equal to full SDPA (outputs and dQ,
dK, dV), causal and not, fp32 and fp64, 2, 3 and 4 ranks, every layout; bytes = the formulas;
balance and overlap on the simulated clock; bad input named."""
import math
import os
import sys

import pytest
import torch

from pipelib.context_parallel.costs import crossover_shard_len, ring_peak_bytes
from pipelib.context_parallel.partition import LAYOUTS, imbalance
from pipelib.context_parallel.step import check_attention, reference_attention
from pipelib.context_parallel.variants import REGISTRY, variant_bytes
from pipelib.runtime.errors import RankError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comm"))
from subgroups import group as _group  # noqa: E402  tests/comm/subgroups.py

pytestmark = pytest.mark.cluster
GROUPS = {2: (0, 1), 3: (1, 2, 3), 4: (0, 1, 2, 3)}
S, HEADS, D = 24, 12, 4   # 24 splits into 2n chunks for n = 2, 3, 4; 12 heads over 2, 3, 4 ranks
DTYPES = (torch.float32, torch.float64)


def _matrix(ranks):
    from pipelib.context_parallel.step import attention_step

    g = _group(ranks)
    return {(var, layout, causal, str(dtype)): attention_step(var, S, heads=HEADS, head_dim=D, layout=layout,
                                                               causal=causal, dtype=dtype, group=g)
            for var in REGISTRY for layout in LAYOUTS for causal in (False, True) for dtype in DTYPES}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_variant_equals_sdpa_and_sends_the_formula(cluster4, n):
    per_rank = cluster4.run(_matrix, GROUPS[n])
    per_rank = [r for r, rank in zip(per_rank, range(4)) if rank in GROUPS[n]]
    for key in per_rank[0]:
        var, layout, causal, dt = key
        dtype = getattr(torch, dt.replace("torch.", ""))
        results = [r[key] for r in per_rank]
        ref = reference_attention(S, n, heads=HEADS, head_dim=D, layout=layout, causal=causal, dtype=dtype)
        tol = dict(rtol=0, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
        check_attention(results, ref, **tol)
        want = variant_bytes(var, 1, HEADS, S // n, D, dtype.itemsize, n)
        for r in results:
            assert (r.stats["bytes_forward"], r.stats["bytes_backward"]) == (want["forward"], want["backward"]), key
            assert r.bytes_sent == (want["forward"] + want["backward"],), key
        if var == "ring":
            for r in results:
                assert r.peak_bytes == ring_peak_bytes(1, HEADS, S // n, D, dtype.itemsize, layout), key


def _timed(variant, seq, layout, heads, head_dim):
    from pipelib.context_parallel.step import attention_step

    return attention_step(variant, seq, heads=heads, head_dim=head_dim, layout=layout, causal=True,
                          dtype=torch.float32).times[0]


def _busy(trace, n):
    return [trace.busy(r) for r in range(n)]


def test_balance_from_the_trace(cluster4):
    work = {}
    for layout in ("contiguous", "zigzag"):
        cluster4.reset()
        cluster4.run(_timed, "ring", 64, layout, 2, 8)
        work[layout] = _busy(cluster4.trace(), 4)
    assert imbalance(work["zigzag"]) <= 1.05
    assert imbalance(work["contiguous"]) == pytest.approx(7 / 4, abs=0.06)   # (2n-1)/n for n = 4


def test_overlap_hides_transfer_when_shards_are_compute_bound(cluster4):
    from pipelib.costmodel import PROFILES
    from pipelib.trace import Kind

    p = PROFILES["toy-gpu"]
    heads, head_dim = 1, 4
    cstar = crossover_shard_len(p.flops, p.link.alpha, p.link.beta, 1, heads, head_dim, 4, pairs_share=0.5)
    for times, least in ((2, 0.9), (4, 1.0)):       # shards 2 and 4 times the crossover
        c = 2 * math.ceil(times * cstar / 2)
        cluster4.reset()
        cluster4.run(_timed, "ring", 4 * c, "zigzag", heads, head_dim)
        tr = cluster4.trace()
        for r in range(4):
            transfer = sum(e.duration for e in tr.filter(rank=r, kind=Kind.TRANSFER))
            waited = sum(e.duration for e in tr.filter(rank=r, kind=Kind.RECV_WAIT))
            assert 1 - waited / transfer >= least, (times, r, waited, transfer)
            fwd_wait = [e for e in tr.filter(rank=r, kind=Kind.RECV_WAIT) if e.label.startswith("ring_attention ")]
            assert not fwd_wait, fwd_wait
            assert tr.span <= 1.05 * tr.busy(r), (r, tr.span, tr.busy(r))


def _bad(case):
    import torch.distributed as dist

    from pipelib.context_parallel.step import attention_step

    r = dist.get_rank()
    if case == "shape":
        shards = [torch.zeros(1, 2, 4 if r else 6, 4) for _ in range(4)]
        return attention_step("ring", 16, inputs=shards)
    if case == "dtype":
        shards = [torch.zeros(1, 2, 4, 4, dtype=torch.float64 if r == 2 else torch.float32) for _ in range(4)]
        return attention_step("allgather", 16, inputs=shards)
    if case == "odd":
        return attention_step("ring", 12, layout="zigzag", inputs=[torch.zeros(1, 2, 3, 4)] * 4)
    if case == "uneven":
        return attention_step("allgather", 50, layout="contiguous")
    return attention_step("ulysses", 16, heads=6)


@pytest.mark.parametrize("case, message", [
    ("shape", r"ring_attention: ranks disagree; shape/dtype differs: rank 0 \(1, 2, 6, 4\) float32, "
              r"rank 1 \(1, 2, 4, 4\)"),
    ("dtype", r"allgather_attention: ranks disagree; .*rank 2 \(1, 2, 4, 4\) float64"),
    ("odd", r"sequence length 12 does not split into 2n = 8 chunks"),
    ("uneven", r"attention_step\('allgather'\): sequence length 50 does not split into n = 4 shards \(50 % 4 = 2\)"),
    ("heads", r"ulysses_attention: 6 heads do not split over 4 ranks \(6 % 4 = 2\)"),
])
def test_bad_input_is_named_on_every_rank(cluster4, case, message):
    with pytest.raises(RankError, match=message):
        cluster4.run(_bad, case)
    assert cluster4.run(_timed, "ring", 16, "zigzag", 2, 4)   # still usable


def _probe(seq, ranks, capacity):
    from pipelib.context_parallel.step import memory_probe

    return memory_probe("ring", seq, ranks, capacity, heads=2, head_dim=4, dtype=torch.float32)


def test_longest_context_grows_linearly_with_ranks(cluster4):
    from pipelib.context_parallel.costs import max_shard_len

    capacity = 64 * 1024
    # one rank alone needs no receive buffers: its longest shard is a little longer; from two on, c
    longest = {n: max_shard_len(capacity, 1, 2, 4, 4, "zigzag", ranks=n) for n in (1, 2, 4)}
    assert longest[2] == longest[4] < longest[1]
    for n, c in longest.items():
        fits = cluster4.run(_probe, n * c, n, capacity)[:n]
        over = cluster4.run(_probe, n * (c + 2), n, capacity)[:n]
        assert all(f["fits"] and f["peak"] == ring_peak_bytes(1, 2, c, 4, 4, ranks=n) for f in fits), fits
        assert not any(o["fits"] for o in over), over
    assert cluster4.run(_timed, "ring", 16, "zigzag", 2, 4)   # the device's capacity is back


def test_torch_private_ring_template_beside_pipelib(cluster4):
    from pipelib.context_parallel.torch_ring import torch_ring_available, torch_ring_step

    why = torch_ring_available()
    if why is not None:
        pytest.skip(f"torch's private ring template moved: {why}")
    for causal in (False, True):
        res = cluster4.run(torch_ring_step, 32, causal=causal, dtype=torch.float64)
        ref = reference_attention(32, 4, layout="contiguous", causal=causal)
        assert check_attention(res, ref, rtol=1e-5, atol=1e-5) < 1e-5   # it merges in fp32


def _tiled(layout, variant):
    from pipelib.context_parallel.step import attention_step

    return attention_step(variant, S, heads=HEADS, head_dim=D, layout=layout, causal=True, tile=2)


@pytest.mark.parametrize("variant", ["ring", "allgather", "ulysses"])
def test_tiles_inside_shards_change_nothing_but_memory(cluster4, variant):
    for layout in ("zigzag", "striped"):
        res = cluster4.run(_tiled, layout, variant)
        check_attention(res, reference_attention(S, 4, heads=HEADS, head_dim=D, layout=layout), rtol=0, atol=1e-12)
    if variant == "ring":
        assert res[0].peak_bytes == ring_peak_bytes(1, HEADS, S // 4, D, 8, "striped", tile=2)


def test_the_benchmark_timers_run(cluster4):
    from pipelib.context_parallel.timing import time_alone, time_attention, time_rank_alone

    for times in (cluster4.run(time_attention, "ring", 16, 2, heads=2, head_dim=4),
                  cluster4.run(time_alone, 16, 2, heads=2, head_dim=4)):
        assert all(len(t) == 2 and min(t) > 0 for t in times), times
    assert len(time_rank_alone(16, 4, 3, 2, heads=2, head_dim=4)) == 2


def _probe_after_stale_bytes(seq, ranks, capacity):
    from pipelib.context_parallel.step import memory_probe
    from pipelib.runtime.device import current

    mem = current().memory
    mem.add("parameters", 10**6, "an earlier step's model")  # what a pipeline step leaves tracked
    try:
        return memory_probe("ring", seq, ranks, capacity, heads=2, head_dim=4, dtype=torch.float32), \
            current().memory is mem and mem.bytes["parameters"] >= 10**6
    finally:
        mem.bytes["parameters"] -= 10**6


def test_memory_probe_counts_only_its_own_step(cluster4):
    """Bytes an earlier step left on the device's tracker (a pipeline step's parameters) neither
    inflate the probe's peak nor its out-of-memory test; the device's tracker is given back."""
    capacity = 64 * 1024
    for (r, kept) in cluster4.run(_probe_after_stale_bytes, 32, 2, capacity)[:2]:
        assert r["fits"] and r["peak"] == ring_peak_bytes(1, 2, 16, 4, 4) and kept, r


def _on_cp_mesh(variant, c, heads, head_dim):
    from pipelib.context_parallel.step import attention_step, cp_group

    group = cp_group(4)
    return attention_step(variant, 4 * c, heads=heads, head_dim=head_dim, dtype=torch.float32, group=group)


@pytest.mark.parametrize("c, heads, head_dim", [(4, 4, 8), (8, 32, 256), (256, 4, 8)])  # latency, bytes, compute
def test_registry_predicts_the_measured_step(cluster4, c, heads, head_dim):
    """On the "cp" mesh: the bytes the trace tags with axis "cp" are the registry's formula, and
    the predicted step time is within 3% of the simulated one, so it picks the same fastest."""
    from pipelib.costmodel import get_profile

    measured, predicted = {}, {}
    for name, info in REGISTRY.items():
        cluster4.reset()
        res = cluster4.run(_on_cp_mesh, name, c, heads, head_dim)
        want = info.bytes(1, heads, c, head_dim, 4, 4)
        assert cluster4.trace().bytes_sent(0, axis="cp") == res[0].bytes_sent[0] == sum(want.values())
        measured[name] = max(r.times[0] for r in res)
        predicted[name] = info.predicted_time(get_profile("toy-gpu"), 1, heads, c, head_dim, 4, 4)
        assert predicted[name] == pytest.approx(measured[name], rel=0.03), name
    assert min(measured, key=measured.get) == min(predicted, key=predicted.get)


def test_unknown_variant_lists_the_registry():
    from pipelib.context_parallel.variants import variant_info

    names = r"\['ring', 'allgather', 'ulysses'\]"
    with pytest.raises(ValueError, match=rf"unknown attention variant 'tree'; use one of {names}"):
        variant_info("tree")
    assert REGISTRY["ring"].twin is not None and REGISTRY["ulysses"].twin is None


def test_names_are_compared_only_in_the_registries():
    """No variant or layout name is compared or branched on outside `variants` and `layouts`."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2] / "pipelib" / "context_parallel"
    names = "|".join((*REGISTRY, "contiguous", "zigzag", "striped", "alone"))
    pattern = re.compile(rf"""(==|!=|\bin)\s*\(?["']({names})["']|["']({names})["']\s*(==|!=|in\b)""")
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted(root.glob("*.py")) if p.stem not in ("variants", "layouts")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
