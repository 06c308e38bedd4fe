"""One entry per shard layout: how a sequence of S positions is cut over n ranks.

    layout_info("zigzag").ranges(16, 4, 1)     # (range(2, 4), range(12, 14)): chunks r and 2n-1-r
    layout_info("striped").chunks_per_rank    # 1: rank r takes positions r, r+n, r+2n, ...

A `Layout` says how many of the sequence's equal chunks each rank holds (the sequence must
split into chunks_per_rank * n of them), the global positions of a rank's pieces in local order
(ranges: no torch), and the rule in words for the errors. This module is the only place where
a layout's name is compared or mapped: `partition` makes index tensors from the ranges and
`costs.ring_peak_bytes` sizes the score block from the longest piece, c / chunks_per_rank.

Pure: no torch. Introduced in chapter 17 (why each layout: `partition`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType


def _contiguous(seq_len: int, n: int, rank: int) -> tuple[range, ...]:
    c = seq_len // n
    return (range(rank * c, (rank + 1) * c),)


def _zigzag(seq_len: int, n: int, rank: int) -> tuple[range, ...]:
    h = seq_len // (2 * n)
    return range(rank * h, (rank + 1) * h), range((2 * n - 1 - rank) * h, (2 * n - rank) * h)


def _striped(seq_len: int, n: int, rank: int) -> tuple[range, ...]:
    return (range(rank, seq_len, n),)


@dataclass(frozen=True)
class Layout:
    """One way to cut the sequence: `ranges(seq_len, n, rank)` gives rank's pieces' positions."""

    name: str
    chunks_per_rank: int                          # the sequence splits into chunks_per_rank * n chunks
    ranges: Callable[[int, int, int], tuple[range, ...]]
    rule: str = ""                                # how the chunks are dealt, for errors

    def longest_piece(self, shard_len: int) -> int:
        """Rows of a rank's longest piece (the score block of one piece pair is its square)."""
        return shard_len // self.chunks_per_rank


REGISTRY = MappingProxyType({info.name: info for info in (
    Layout("contiguous", 1, _contiguous),
    Layout("zigzag", 2, _zigzag, "zigzag gives each rank chunks r and 2n-1-r"),
    Layout("striped", 1, _striped),
)})


def layout_info(name: str, context: str = "context parallel") -> Layout:
    """The registry entry for `name`; a ValueError lists the layouts."""
    info = REGISTRY.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"{context}: unknown layout {name!r}; use one of {tuple(REGISTRY)}")
    return info
