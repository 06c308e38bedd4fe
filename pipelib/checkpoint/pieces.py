"""Which part of a whole tensor a rank holds: cut it by a placement, put it back, check coverage.

    piece = Piece(shape=(96, 64), split=Split(dim=0, fused=3, index=1, count=2), flat=(0, 3072))
    local = piece.cut(full)          # what this rank holds: its tp shard, then a ZeRO range of it
    piece.put(full, local)           # and back into the whole tensor
    check_covered(key, shape, pieces)  # every element held by some piece, or a clear error

A piece is the monolith's tensor (`shape`) seen through at most two cuts, in the order the
strategies make them (`pipelib.parallelize`): tensor parallelism splits it along `dim` into
`count` shards (in `fused` blocks, q, k and v each split alone:
`tensor_parallel.layers.tp_shard_rows`, joined back by `placement.join_shards`), and ZeRO
keeps elements [start, stop) of that shard flattened (its flat buffers, `zero_units.FlatUnit.
pieces`). Replicated data (DDP, a pipeline stage's whole weights) is a piece with neither.
Resharding is "gather by placement, split by the new placement" (DESIGN.md section 7): the
pieces of the saved layout are `put` into the whole tensor, and the new layout's `cut` out of it.

Pure tensor arithmetic: no process group. Introduced in chapter 18.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelib.checkpoint.errors import IncompatibleCheckpointError


@dataclass(frozen=True)
class Split:
    """Tensor parallelism's cut: shard `index` of `count` along `dim`, in `fused` blocks."""

    dim: int
    fused: int
    index: int
    count: int


@dataclass(frozen=True)
class Piece:
    """This rank's part of the whole tensor of shape `shape`: `split` (None: whole), then
    elements `flat` = (start, stop) of the result flattened (None: all of them)."""

    shape: tuple[int, ...]
    split: Split | None = None
    flat: tuple[int, int] | None = None

    @property
    def whole(self) -> bool:
        return self.split is None and self.flat is None

    def cut(self, full: torch.Tensor) -> torch.Tensor:
        """This piece of `full` (a new tensor)."""
        local = full if self.split is None else _tp_split(full, self.split)
        if self.flat is not None:
            local = local.reshape(-1)[self.flat[0]:self.flat[1]]
        return local.clone()

    def indices(self) -> torch.Tensor:
        """The flat indices into the whole tensor of this piece's elements, in its order."""
        numel = 1
        for s in self.shape:
            numel *= s
        return self.cut(torch.arange(numel).view(self.shape)).reshape(-1)

    def put(self, full: torch.Tensor, local: torch.Tensor) -> None:
        """Write `local` (this piece's values) into `full` where it belongs."""
        if self.whole:
            full.copy_(local.reshape(full.shape))
        elif self.split is None:
            full.view(-1)[self.flat[0]:self.flat[1]] = local.reshape(-1)
        else:
            full.view(-1)[self.indices()] = local.reshape(-1).to(full.dtype)

    def numel(self) -> int:
        if self.flat is not None:
            return self.flat[1] - self.flat[0]
        n = 1
        for s in self.shape:
            n *= s
        return n // (self.split.count if self.split is not None else 1)

    def to_dict(self) -> dict:
        return {"shape": list(self.shape),
                "split": None if self.split is None else [self.split.dim, self.split.fused,
                                                          self.split.index, self.split.count],
                "flat": None if self.flat is None else list(self.flat)}

    @classmethod
    def from_dict(cls, d: dict) -> Piece:
        return cls(tuple(d["shape"]), None if d["split"] is None else Split(*d["split"]),
                   None if d["flat"] is None else tuple(d["flat"]))


def _tp_split(full: torch.Tensor, s: Split) -> torch.Tensor:
    """`tp_shard_rows` along any dim: shard `index` of `count` of each of the `fused` blocks."""
    if full.shape[s.dim] % (s.fused * s.count):
        raise IncompatibleCheckpointError(
            f"a tensor of shape {tuple(full.shape)} cannot be cut into {s.count} shards of {s.fused} "
            f"block(s) along dim {s.dim}: {full.shape[s.dim]} is not a multiple of {s.fused * s.count}")
    blocks = full.chunk(s.fused, dim=s.dim)
    return torch.cat([b.chunk(s.count, dim=s.dim)[s.index] for b in blocks], dim=s.dim)


def global_shape(local_shape, split: Split | None) -> tuple[int, ...]:
    """The whole tensor's shape from a tp shard's (equal shards: tensor parallelism requires them)."""
    shape = list(local_shape)
    if split is not None:
        shape[split.dim] *= split.count
    return tuple(shape)


def check_covered(key: str, shape, pieces: list[Piece]) -> None:
    """Raise unless the pieces together hold every element of the tensor `key` of `shape`."""
    if any(p.whole for p in pieces):
        return
    numel = 1
    for s in shape:
        numel *= s
    seen = torch.zeros(numel, dtype=torch.bool)
    for p in pieces:
        if p.split is None:
            seen[p.flat[0]:p.flat[1]] = True
        else:
            seen[p.indices()] = True
    if not bool(seen.all()):
        missing = int((~seen).sum())
        raise IncompatibleCheckpointError(
            f"checkpoint: the saved pieces of {key} (shape {tuple(shape)}) leave {missing} of {numel} "
            f"elements uncovered: a rank's file or its manifest entry is missing; load an earlier step")
