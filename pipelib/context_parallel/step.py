"""One attention step (forward and backward) of any variant on a cluster, and its reference.

    results = cluster.run(attention_step, "ring", 64, heads=4, layout="zigzag")
    check_attention(results, reference_attention(64, heads=4, layout="zigzag", n=4))

Every rank draws the same full Q, K, V and output gradient dO from `seed`, keeps its shard,
runs the variant forward, then backward with its shard of dO (so the gradients are those of
the loss sum(O * dO)). It returns a `pipelib.results.StepResult` whose grads are named by shard
("dq[r]", ...) and whose stats hold its output shard, the bytes it sent forward and backward,
the (query, key) pairs it computed, its peak memory (on a fresh memory tracker: this step's
bytes only) and its device time.

Introduced in chapter 17.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.comm import p2p
from pipelib.context_parallel.allgather import allgather_attention
from pipelib.context_parallel.partition import check_layout, split_sequence
from pipelib.context_parallel.ring import ring_attention
from pipelib.context_parallel.ulysses import ulysses_attention
from pipelib.results import StepResult, check_against_reference
from pipelib.runtime.device import current

VARIANTS = {"ring": ring_attention, "allgather": allgather_attention, "ulysses": ulysses_attention}


def attention_inputs(seq_len: int, batch: int = 1, heads: int = 4, head_dim: int = 8,
                     dtype=torch.float64, seed: int = 0):
    """The full (q, k, v, dout), each (B, H, S, D), the same on every rank for one seed."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=torch.float64).to(dtype)
            for _ in range(4)]


def attention_step(variant: str, seq_len: int, *, batch: int = 1, heads: int = 4, head_dim: int = 8,
                   layout: str = "zigzag", causal: bool = True, dtype=torch.float64, seed: int = 0,
                   group=None, inputs=None, tile: int | None = None) -> StepResult | None:
    """Forward and backward of `variant` ("ring", "allgather", "ulysses") on this rank of
    `group`; None on a rank outside it. `inputs`, if given, is this rank's (q, k, v, dout)
    shards (to feed ranks different shapes on purpose); `tile`: see `ring_attention`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown attention variant {variant!r}; use one of {sorted(VARIANTS)}")
    if dist.get_rank(group) < 0:
        return None
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if inputs is None:
        check_layout(seq_len, n, layout, context=f"rank {dist.get_rank()}: attention_step({variant!r})")
        inputs = [split_sequence(t, n, me, layout) for t in attention_inputs(seq_len, batch, heads, head_dim, dtype, seed)]
    q, k, v, dout = [t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs)]
    dev = current()
    dev.memory = dev.fresh_memory()  # this step's bytes only, not what an earlier step left tracked
    stats: dict = {}
    p2p.reset_counters()
    t0 = dev.clock.now()
    with dev.memory.saved_activations():
        out = VARIANTS[variant](q, k, v, group, layout=layout, causal=causal, stats=stats, tile=tile)
    sent_forward = p2p.counters()["bytes_sent"]
    out.backward(dout)
    stats.update(out=out.detach(), bytes_forward=sent_forward,
                 bytes_backward=p2p.counters()["bytes_sent"] - sent_forward,
                 peak_memory=dev.memory.peak, time=dev.clock.now() - t0)
    return StepResult(grads={f"d{x}[{me}]": t.grad for x, t in zip("qkv", (q, k, v))}, stats=stats)


def reference_attention(seq_len: int, n: int, *, batch: int = 1, heads: int = 4, head_dim: int = 8,
                        layout: str = "zigzag", causal: bool = True, dtype=torch.float64, seed: int = 0) -> dict:
    """One process, `torch.nn.functional.scaled_dot_product_attention` on the full sequence:
    {"out": [shard per rank], "grads": {"dq[r]": shard, ...}} under `layout`'s shards."""
    q, k, v, dout = attention_inputs(seq_len, batch, heads, head_dim, dtype, seed)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    shards = {f"d{x}[{r}]": split_sequence(t.grad, n, r, layout) for x, t in zip("qkv", (q, k, v)) for r in range(n)}
    return {"out": [split_sequence(out.detach(), n, r, layout) for r in range(n)], "grads": shards}


def check_attention(results, reference: dict, **tol):
    """Assert every rank's output shard and its dQ, dK, dV shards equal the single process's
    (`check_against_reference`; `tol`: rtol, atol). Returns the worst |difference|."""
    rs = [r for r in results if r is not None]
    worst = 0.0
    for r, want in enumerate(reference["out"]):
        got = rs[r].stats["out"]
        torch.testing.assert_close(got, want, msg=lambda e, r=r: f"output shard of rank {r}: {e}", **tol)
        worst = max(worst, (got.double() - want.double()).abs().max().item())
    return max(worst, check_against_reference(rs, ref_grads=reference["grads"], **tol).max_abs_diff)


def prefix_group(size: int):
    """The process group of ranks 0..size-1 (all of them made on the first call, which every
    rank of the world must make: `dist.new_group` is collective), kept on this rank's device."""
    dev = current()
    groups = dev.groups.get("context_parallel_prefix_groups")
    if groups is None:
        world = dist.get_world_size()
        groups = dev.groups["context_parallel_prefix_groups"] = {
            k: dist.new_group(list(range(k))) for k in range(1, world + 1)}
    return groups[size]


def memory_probe(variant: str, seq_len: int, ranks: int, capacity: int | None = None, **kw) -> dict | None:
    """One step of `variant` on ranks 0..ranks-1, on a simulated device of `capacity` bytes
    (None: the device's own): {"fits": True, "peak": bytes measured} or {"fits": False,
    "need": bytes it asked for} when the device ran out of memory. None off the group."""
    from pipelib.runtime.memtrack import SimulatedOutOfMemoryError

    group = prefix_group(ranks)
    if dist.get_rank(group) < 0:
        return None
    dev = current()
    mem = dev.memory
    before, held = mem.capacity, dict(mem.bytes)
    mem.capacity = capacity if capacity is not None else before  # the step's fresh tracker inherits it
    try:
        r = attention_step(variant, seq_len, group=group, **kw)
        return {"fits": True, "peak": r.stats["peak_memory"]}
    except SimulatedOutOfMemoryError as e:
        return {"fits": False, "need": e.need}
    finally:
        dev.memory = mem
        mem.capacity = before
        mem.bytes.update(held)
