"""How a sequence of length S is cut into the shards of n ranks: contiguous, zigzag, striped.

Under causal masking query i sees keys 0..i, so later positions cost more. Cutting the
sequence into n contiguous shards gives the last rank about 2n/(n+1) times the mean work and
rank 0 almost none. Two cures:

- ``zigzag`` (ring-flash-attention; Llama 3's context parallelism): the sequence is cut into 2n
  chunks and rank r takes chunks r and 2n-1-r, one cheap and one expensive: every rank then
  has exactly the same number of (query, key) pairs to compute;
- ``striped`` (Brandon et al. 2023, "Striped Attention"): rank r takes positions r, r+n,
  r+2n, ...: every rank sees almost the same triangle.

A shard is a list of *pieces*: (start, stop) within the rank's local tensor and the global
positions of those rows. Masks are made from positions, so one attention routine serves
every layout, and a pair of pieces is skipped when no query sees any key (causal).

No process group and no runtime module: torch for index tensors only (importing torch loads
torch.distributed, so the layering test does not count it pure). Introduced in chapter 17.
"""
from __future__ import annotations

import torch

from pipelib.checks import check_int, check_rank
from pipelib.context_parallel.layouts import REGISTRY, layout_info

LAYOUTS = tuple(REGISTRY)   # the names, in the book's order (`layouts`: one entry each)


def check_layout(seq_len: int, n: int, layout: str, context: str = "context parallel") -> int:
    """Raise a ValueError naming every value unless `seq_len` splits evenly for `layout` over
    `n` ranks; return the shard length S / n."""
    check_int(n, "n", context=context, hint="the number of ranks the sequence is split over")
    check_int(seq_len, "seq_len", context=context, hint="the full sequence length")
    info = layout_info(layout, context)
    parts = info.chunks_per_rank * n
    if seq_len % parts:
        what = f"{info.chunks_per_rank}n = {parts} chunks" if info.chunks_per_rank > 1 else f"n = {parts} shards"
        what += f" ({info.rule})" if info.rule else ""
        raise ValueError(f"{context}: sequence length {seq_len} does not split into {what} "
                         f"({seq_len} % {parts} = {seq_len % parts}); pad the sequence to a multiple "
                         f"of {parts} or use another number of ranks")
    return seq_len // n


def shard_pieces(seq_len: int, n: int, rank: int, layout: str = "zigzag") -> list[tuple[int, int, torch.Tensor]]:
    """Rank `rank`'s shard: [(start, stop, positions)], pieces in the order they sit locally."""
    check_layout(seq_len, n, layout)
    check_rank(rank, n, "context parallel")
    pieces, start = [], 0
    for r in layout_info(layout).ranges(seq_len, n, rank):
        pieces.append((start, start + len(r), torch.arange(r.start, r.stop, r.step)))
        start += len(r)
    return pieces


def tile_pieces(pieces, tile: int | None):
    """`pieces` cut into tiles of at most `tile` rows (None: unchanged), the blocks
    flash-attention loops over inside one shard: the score block then has at most tile^2
    entries, whatever the shard length."""
    if tile is None:
        return pieces
    check_int(tile, "tile", context="context parallel", hint="rows per attention tile, or None for whole pieces")
    return [(a + i, min(a + i + tile, b), pos[i:i + tile]) for a, b, pos in pieces for i in range(0, b - a, tile)]


def shard_positions(seq_len: int, n: int, rank: int, layout: str = "zigzag") -> torch.Tensor:
    """The global positions of rank `rank`'s rows, in local order."""
    return torch.cat([p for _, _, p in shard_pieces(seq_len, n, rank, layout)])


def split_sequence(x: torch.Tensor, n: int, rank: int, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """Rank `rank`'s shard of `x` along `dim` (the sequence dimension; (B, H, S, D) by default)."""
    return x.index_select(dim, shard_positions(x.shape[dim], n, rank, layout)).contiguous()


def join_sequence(shards, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """The inverse of `split_sequence`: the n shards put back in sequence order."""
    n = len(shards)
    seq_len = n * shards[0].shape[dim]
    pos = torch.cat([shard_positions(seq_len, n, r, layout) for r in range(n)])
    return torch.cat(list(shards), dim).index_select(dim, torch.argsort(pos))


def visible_pairs(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> int:
    """How many (query, key) pairs are not masked: the work of attending `q_pos` to `k_pos`."""
    if not causal:
        return len(q_pos) * len(k_pos)
    return int(torch.searchsorted(torch.sort(k_pos).values, q_pos, right=True).sum())


def work_per_rank(seq_len: int, n: int, layout: str, causal: bool = True) -> list[int]:
    """(query, key) pairs each rank computes in ring attention: its queries against every key
    (fully masked pieces skipped). Contiguous causal: rank r has r c^2 + c(c+1)/2; zigzag (chunks of h = c/2):
    (2n-1) h^2 + h(h+1), the same for every rank."""
    check_layout(seq_len, n, layout, "work_per_rank")
    return [visible_pairs(shard_positions(seq_len, n, r, layout), torch.arange(seq_len), causal)
            for r in range(n)]


def imbalance(work) -> float:
    """max / mean of the work per rank: 1 is perfect balance; the step waits for the max."""
    if not len(work) or sum(work) <= 0:
        raise ValueError(f"imbalance: work={list(work)!r}; pass each rank's work, at least one rank with work > 0")
    return max(work) * len(work) / sum(work)


def attention_inputs(seq_len: int, batch: int = 1, heads: int = 4, head_dim: int = 8,
                     dtype=torch.float64, seed: int = 0, kv_heads: int | None = None):
    """The full (q, k, v, dout), each (B, H, S, D), the same on every rank for one seed; with
    `kv_heads`, k and v keep their first H_kv heads (grouped-query attention)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = [torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=torch.float64).to(dtype)
                     for _ in range(4)]
    if kv_heads is not None:
        k, v = k[:, :kv_heads].contiguous(), v[:, :kv_heads].contiguous()
    return [q, k, v, dout]
