"""One attention step (forward and backward) of any variant on a cluster, and its reference.

    results = cluster.run(attention_step, "ring", 64, heads=4, layout="zigzag")
    check_attention(results, reference_attention(64, heads=4, layout="zigzag", n=4))

Every rank draws the same full Q, K, V and output gradient dO from `seed`, keeps its shard,
runs the variant (`variants.variant_info`) forward, then backward with its shard of dO (so the
gradients are those of the loss sum(O * dO)). It returns a `pipelib.results.StepResult` whose
grads are named by shard ("dq[r]", ...), measured by one `Device.measure` scope on an empty
tracker (this step's bytes only): `peak_bytes`, `bytes_sent` (one entry: the step) and `times`
(the step, on the device's clock). Its stats hold the output shard, the bytes sent forward and
backward (nested scopes) and the (query, key) pairs computed.

Introduced in chapter 17.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.checks import checked_by
from pipelib.context_parallel.partition import attention_inputs, check_layout, split_sequence
from pipelib.context_parallel.variants import variant_info
from pipelib.results import StepResult, check_against_reference
from pipelib.runtime.device import current
from pipelib.runtime.mesh import Mesh
from pipelib.runtime.place import to_rank_device
from pipelib.topology import Topology


def _check_attention_call(world_size, variant, seq_len, *, batch=1, heads=4, head_dim=8, layout="zigzag",
                          tile=None, kv_heads=None, group=None, **_):
    from pipelib.context_parallel.variants import check_attention_step

    if group is None:  # a subgroup's size is the engines' to know
        check_attention_step(variant, seq_len, world_size, batch=batch, heads=heads, head_dim=head_dim,
                             layout=layout, tile=tile, kv_heads=kv_heads)


@checked_by(_check_attention_call)
def attention_step(variant: str, seq_len: int, *, batch: int = 1, heads: int = 4, head_dim: int = 8,
                   layout: str = "zigzag", causal: bool = True, dtype=torch.float64, seed: int = 0,
                   group=None, inputs=None, tile: int | None = None,
                   kv_heads: int | None = None) -> StepResult | None:
    """Forward and backward of `variant` ("ring", "allgather", "ulysses") on this rank of
    `group`; None on a rank outside it. `inputs`, if given, is this rank's (q, k, v, dout)
    shards (to feed ranks different shapes on purpose); `tile`: see `ring_attention`;
    `kv_heads`: grouped-query attention, k and v with H_kv heads (the ring only)."""
    attention = variant_info(variant).attention
    if dist.get_rank(group) < 0:
        return None
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if inputs is None:
        check_layout(seq_len, n, layout, context=f"rank {dist.get_rank()}: attention_step({variant!r})")
        full = attention_inputs(seq_len, batch, heads, head_dim, dtype, seed, kv_heads)
        inputs = [split_sequence(t, n, me, layout) for t in full]
    q, k, v, dout = [t.clone().requires_grad_(i < 3) for i, t in enumerate(to_rank_device(list(inputs)))]
    dev, stats = current(), {}
    with dev.measure(fresh_memory=True) as step:   # this step's bytes only, not an earlier step's
        with dev.measure() as forward, dev.memory.saved_activations():
            out = attention(q, k, v, group, layout=layout, causal=causal, stats=stats, tile=tile)
        with dev.measure() as backward:
            out.backward(dout)
    stats.update(out=out.detach(), bytes_forward=forward.bytes_sent, bytes_backward=backward.bytes_sent)
    return StepResult(grads={f"d{x}[{me}]": t.grad for x, t in zip("qkv", (q, k, v))}, stats=stats,
                      times=(step.time,), peak_bytes=step.peak_bytes, bytes_sent=(step.bytes_sent,))


def reference_attention(seq_len: int, n: int, *, batch: int = 1, heads: int = 4, head_dim: int = 8,
                        layout: str = "zigzag", causal: bool = True, dtype=torch.float64, seed: int = 0,
                        kv_heads: int | None = None) -> dict:
    """One process, `torch.nn.functional.scaled_dot_product_attention` on the full sequence:
    {"out": [shard per rank], "grads": {"dq[r]": shard, ...}} under `layout`'s shards. With
    `kv_heads`, k and v have H_kv heads and SDPA runs with `enable_gqa=True`."""
    q, k, v, dout = attention_inputs(seq_len, batch, heads, head_dim, dtype, seed, kv_heads)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    gqa = {"enable_gqa": True} if kv_heads not in (None, heads) else {}
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
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


def cp_group(ranks: int):
    """This rank's group on a 1-axis "cp" mesh over ranks 0..ranks-1 (`Mesh.first`), None off
    it. Every rank of the world calls it, in one order: groups are made collectively. One rank
    alone has no cp group in the topology, and the group of one rank must be made by every rank
    (`Mesh.__getitem__` of a size-1 axis), so all the world's ranks then sit on the grid, along dp."""
    mesh = Mesh(Topology(dp=dist.get_world_size())) if ranks == 1 else Mesh.first(ranks, "cp")
    group = mesh["cp"] if mesh.contains else None
    return group if dist.get_rank() < ranks else None


def _check_probe_call(world_size, variant, seq_len, ranks, capacity=None, *, batch=1, heads=4, head_dim=8,
                      layout="zigzag", tile=None, kv_heads=None, **_):
    from pipelib.context_parallel.variants import check_attention_step

    check_attention_step(variant, seq_len, world_size, ranks=ranks, batch=batch, heads=heads, head_dim=head_dim,
                         layout=layout, tile=tile, kv_heads=kv_heads)


@checked_by(_check_probe_call)
def memory_probe(variant: str, seq_len: int, ranks: int, capacity: int | None = None, **kw) -> dict | None:
    """One step of `variant` on ranks 0..ranks-1 (`cp_group`), on a simulated device of
    `capacity` bytes (None: the device's own): {"fits": True, "peak": bytes measured} or
    {"fits": False, "need": bytes it asked for} when the device ran out of memory. None off the
    group. Every rank of the world calls it."""
    from pipelib.runtime.memtrack import SimulatedOutOfMemoryError

    group = cp_group(ranks)
    if group is None:
        return None
    try:
        with current().overrides(capacity=capacity):
            return {"fits": True, "peak": attention_step(variant, seq_len, group=group, **kw).peak_bytes}
    except SimulatedOutOfMemoryError as e:
        return {"fits": False, "need": e.need}
