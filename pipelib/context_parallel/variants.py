"""One entry per context-parallel variant: its function and everything that depends on which it is.

    info = variant_info("ulysses")
    info.attention(q, k, v, group, layout="zigzag")     # ulysses_attention
    info.bytes(1, 4, 8, 8, 4, n=4)                      # {"forward": 3072, "backward": 3072}, exact
    info.predicted_time(get_profile("toy-gpu"), 1, 4, 8, 8, 4, n=4)   # seconds, alpha-beta + roofline
    variant_info("ring").twin                           # torch's ring template (`torch_ring_step`)

A `Variant` holds the attention function (same arguments for all: q, k, v shards, the group,
layout, causal, stats, tile), the exact bytes one rank sends forward and backward
(`costs.*_bytes`, checked against the counters by the tests), the predicted step time on a
device profile (`costs.*_time`: compute at the roofline, messages at alpha + n / beta, overlapped
only where the variant overlaps them) and torch's built-in twin, if any. This module is the only
place where a variant's name is compared or mapped: a new variant is its function, its formulas
and one line below. Shard layouts have their own registry (`layouts`).

Introduced in chapter 17.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from pipelib.context_parallel import costs
from pipelib.context_parallel.allgather import allgather_attention
from pipelib.context_parallel.ring import ring_attention
from pipelib.context_parallel.torch_ring import torch_ring_step
from pipelib.context_parallel.ulysses import ulysses_attention


@dataclass(frozen=True)
class Variant:
    """What pipelib knows about one way to split attention over ranks."""

    name: str
    attention: Callable           # (q, k, v, group, *, layout, causal, stats, tile) -> output shard
    bytes: Callable[..., dict]    # (batch, heads, shard_len, head_dim, itemsize, n) -> forward/backward
    predicted_time: Callable[..., float]   # (profile, batch, heads, shard_len, head_dim, itemsize, n, causal)
    twin: Callable | None = None  # torch's built-in, in `attention_step`'s format (contiguous shards)
    paper: str = ""
    splits_heads: bool = False    # the heads are split over the ranks (they must divide)
    grouped_kv: bool = False      # takes k, v with fewer heads than q (grouped-query attention)


REGISTRY = MappingProxyType({info.name: info for info in (
    Variant("ring", ring_attention, costs.ring_bytes, costs.ring_time, torch_ring_step,
            "Liu, Zaharia & Abbeel 2023", grouped_kv=True),
    Variant("allgather", allgather_attention, costs.allgather_bytes, costs.allgather_time,
            paper="Llama 3, Dubey et al. 2024"),
    Variant("ulysses", ulysses_attention, costs.ulysses_bytes, costs.ulysses_time,
            paper="DeepSpeed-Ulysses, Jacobs et al. 2023", splits_heads=True),
)})


def variant_info(name: str) -> Variant:
    """The registry entry for `name`; a ValueError lists the variants."""
    info = REGISTRY.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"unknown attention variant {name!r}; use one of {list(REGISTRY)}")
    return info


def variant_bytes(variant: str, batch: int, heads: int, shard_len: int, head_dim: int, itemsize: int,
                  n: int) -> dict:
    """{"forward", "backward"} bytes one rank sends in one step of `variant` (exact)."""
    return variant_info(variant).bytes(batch, heads, shard_len, head_dim, itemsize, n)


def check_attention_step(variant: str, seq_len: int, world_size: int, *, ranks: int | None = None,
                         batch: int = 1, heads: int = 4, head_dim: int = 8, layout: str = "zigzag",
                         tile: int | None = None, kv_heads: int | None = None) -> int:
    """Every argument of chapter 17's `attention_step` and `memory_probe` checked in the notebook
    process, before any engine works: the variant and layout by name, `ranks` (default: the
    whole cluster) against the cluster, the sequence split, the sizes, Ulysses' heads over the
    ranks, grouped-query heads (the ring only). Returns the shard length; a ValueError names the
    value and what to change (the engines would raise the same, a step later)."""
    from pipelib.checks import check_int
    from pipelib.context_parallel.partition import check_layout

    info = variant_info(variant)
    n = world_size if ranks is None else check_int(ranks, "ranks", context=f"{variant} attention",
                                                    hint="ranks the sequence is split over")
    if n > world_size:
        raise ValueError(f"{variant} attention: ranks={n} is larger than the cluster ({world_size} ranks); use "
                         f"ranks <= {world_size} or start Cluster(world_size={n})")
    check_int(batch, "batch", minimum=0, context=f"{variant} attention")
    check_int(heads, "heads", context=f"{variant} attention")
    check_int(head_dim, "head_dim", context=f"{variant} attention")
    if tile is not None:
        check_int(tile, "tile", context=f"{variant} attention", hint="rows per attention tile, or None")
    shard = check_layout(seq_len, n, layout, context=f"{variant} attention")
    if info.splits_heads and heads % n:
        raise ValueError(f"ulysses attention: {heads} heads do not split over {n} ranks ({heads} % {n} = "
                         f"{heads % n}); use a number of ranks that divides the heads, or ring attention")
    if kv_heads is not None:
        if not info.grouped_kv:
            raise ValueError(f"{variant} attention: kv_heads={kv_heads}; grouped-query attention is built for "
                             f"{[v for v, i in REGISTRY.items() if i.grouped_kv]} only: use one of them or "
                             f"kv_heads=None")
        costs.check_attention_sizes(f"{variant} attention", max(batch, 1), heads, shard, head_dim, 1, n, kv_heads)
    return shard
