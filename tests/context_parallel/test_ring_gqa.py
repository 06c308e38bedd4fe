"""Ring attention with grouped-query attention (fewer K/V heads than query heads) and with
16-bit inputs (fp32 accumulators): equal to one process's attention, forward and backward,
against torch's SDPA with `enable_gqa` and against SDPA on K/V heads repeated by hand; the
bytes sent are H_kv / H of multi-head attention's; the memory tracker's peak is `ring_memory`'s."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from pipelib.context_parallel import costs
from pipelib.context_parallel.partition import LAYOUTS, split_sequence
from pipelib.context_parallel.partition import attention_inputs
from pipelib.context_parallel.step import check_attention, reference_attention
from pipelib.runtime.errors import RankError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comm"))
from subgroups import group as _group  # noqa: E402  tests/comm/subgroups.py

S, HEADS, D = 24, 6, 4   # 24 splits into 2n chunks for n = 2, 3, 4


def _gqa(kv_heads, ranks, dtype=torch.float64):
    from pipelib.context_parallel.step import attention_step

    g = _group(ranks)
    return {(layout, causal): attention_step("ring", S, heads=HEADS, head_dim=D, layout=layout, causal=causal,
                                             dtype=dtype, group=g, kv_heads=kv_heads)
            for layout in LAYOUTS for causal in (False, True)}


def _repeated_reference(kv_heads, n, layout, causal):
    """One process, K/V heads repeated by hand (no enable_gqa); dK, dV folded over each group."""
    q, k, v, dout = attention_inputs(S, 1, HEADS, D, torch.float64, 0, kv_heads)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    g = HEADS // kv_heads
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)
    out.backward(dout)
    return {"out": [split_sequence(out.detach(), n, r, layout) for r in range(n)],
            "grads": {f"d{x}[{r}]": split_sequence(t.grad, n, r, layout) for x, t in zip("qkv", (q, k, v))
                      for r in range(n)}}


@pytest.mark.cluster
@pytest.mark.parametrize("kv_heads, n", [(1, 4), (2, 2), (3, 4), (6, 3)])
def test_gqa_ring_equals_one_process(cluster4, kv_heads, n):
    ranks = {2: (0, 1), 3: (1, 2, 3), 4: (0, 1, 2, 3)}[n]
    per_rank = [r for r, rank in zip(cluster4.run(_gqa, kv_heads, ranks), range(4)) if rank in ranks]
    for key in per_rank[0]:
        layout, causal = key
        results = [r[key] for r in per_rank]
        assert results[0].grads["dk[0]"].shape[1] == kv_heads                     # only H_kv heads came back
        for ref in (reference_attention(S, n, heads=HEADS, head_dim=D, layout=layout, causal=causal,
                                        kv_heads=kv_heads),
                    _repeated_reference(kv_heads, n, layout, causal)):
            check_attention(results, ref, rtol=0, atol=1e-12)
        want = costs.ring_bytes(1, HEADS, S // n, D, 8, n, kv_heads=kv_heads)
        mha = costs.ring_bytes(1, HEADS, S // n, D, 8, n)
        assert want["forward"] * HEADS == mha["forward"] * kv_heads                 # H_kv / H of MHA's
        assert want["backward"] * HEADS == mha["backward"] * kv_heads
        for r in results:
            assert (r.stats["bytes_forward"], r.stats["bytes_backward"]) == (want["forward"], want["backward"]), key
            assert r.peak_bytes == costs.ring_peak_bytes(1, HEADS, S // n, D, 8, layout, kv_heads=kv_heads,
                                                         ranks=n), key


def test_gqa_crossover_scales_with_kv_heads():
    mha = costs.crossover_shard_len(1e12, 0.0, 1e10, 1, 64, 128, 2, pairs_share=0.5)
    gqa = costs.crossover_shard_len(1e12, 0.0, 1e10, 1, 64, 128, 2, pairs_share=0.5, kv_heads=8)
    assert mha == pytest.approx(2 * 1e12 / 1e10) and gqa == pytest.approx(mha * 8 / 64)


def test_memory_counts_receive_buffers_and_fp32_accumulators():
    B, H, c, Dh = 1, 4, 32, 8
    n1 = B * c * Dh
    fp32 = costs.ring_memory(B, H, c, Dh, 4, "zigzag")
    # Q, K, V, O, lse; K/V + next; dK/dV + incoming; dQ; block dQ, dK, dV: 16 B H c D + B H c, and S, P
    assert fp32.total == 4 * (16 * H * n1 + B * H * c + 2 * B * H * (c // 2) ** 2)
    alone = costs.ring_memory(B, H, c, Dh, 4, "zigzag", ranks=1)            # no receive buffers on one rank
    assert fp32.total - alone.total == 2 * fp32.kv_block
    bf16 = costs.ring_memory(B, H, c, Dh, 2, "zigzag")
    assert bf16.accumulators == 4 * 5 * H * n1 and bf16.accumulators == fp32.accumulators   # fp32 either way
    assert costs.ring_bytes(B, H, c, Dh, 2, 4)["backward"] == 3 * 2 * 2 * H * n1 + 4 * 2 * 4 * H * n1


def _half(ranks):
    from pipelib.context_parallel.step import attention_step

    return attention_step("ring", S, heads=HEADS, head_dim=D, dtype=torch.bfloat16, group=_group(ranks), kv_heads=2)


def _worst(results, ref):
    """Largest |difference| of outputs and gradients from `ref` (fp64 truth), results upcast."""
    got = [r.stats["out"] for r in results] + [r.grads[k] for r in results for k in sorted(r.grads)]
    want = ref["out"] + [ref["grads"][k] for r in results for k in sorted(r.grads)]
    return max((g.double() - w.double()).abs().max().item() for g, w in zip(got, want))


@pytest.mark.cluster
def test_bf16_ring_accumulates_in_fp32(cluster4):
    """bf16 inputs: the ring's error from the fp64 truth is of the order of torch's own bf16
    SDPA's. Not equal: the ring computes each block's scores and softmax in bf16 (torch's CPU
    kernel in fp32), a few more roundings of 2^-8; the accumulators are fp32, so the n blocks'
    partial sums add no bf16 rounding each (about twice torch's error here, measured)."""
    res = cluster4.run(_half, (0, 1, 2, 3))
    truth = reference_attention(S, 4, heads=HEADS, head_dim=D, kv_heads=2)
    torch_bf16 = reference_attention(S, 4, heads=HEADS, head_dim=D, kv_heads=2, dtype=torch.bfloat16)
    as_results = [type("R", (), {"stats": {"out": o}, "grads": {k: v for k, v in torch_bf16["grads"].items()
                                                                 if k.endswith(f"[{r}]")}})
                  for r, o in enumerate(torch_bf16["out"])]
    ring_err, torch_err = _worst(res, truth), _worst(as_results, truth)
    assert 0 < ring_err <= 4 * torch_err, (ring_err, torch_err)
    want = costs.ring_bytes(1, HEADS, S // 4, D, 2, 4, kv_heads=2)
    assert want["backward"] == 3 * 2 * 2 * 2 * (S // 4) * D + 4 * 2 * 4 * 2 * (S // 4) * D   # dK/dV sent in fp32
    for r in res:
        assert all(t.dtype == torch.bfloat16 for t in r.grads.values())      # returned at input width
        assert (r.stats["bytes_forward"], r.stats["bytes_backward"]) == (want["forward"], want["backward"])
        assert r.peak_bytes == costs.ring_peak_bytes(1, HEADS, S // 4, D, 2, kv_heads=2, ranks=4)


def _refused(variant, kv_heads):
    from pipelib.context_parallel.step import attention_step

    return attention_step(variant, 16, heads=HEADS, head_dim=D, kv_heads=kv_heads)


@pytest.mark.cluster
@pytest.mark.parametrize("variant, kv_heads, message", [
    ("ring", 4, r"ring_attention: q is \(1, 6, 4, 4\) torch.float64 but k is \(1, 4, 4, 4\).*H_kv dividing q's H"),
    ("allgather", 2, r"allgather_attention: q is \(1, 6, 4, 4\) torch.float64 but k is \(1, 2, 4, 4\)"),
])
def test_unsupported_kv_heads_are_named(cluster4, variant, kv_heads, message):
    with pytest.raises(RankError, match=message):
        cluster4.run(_refused, variant, kv_heads)
