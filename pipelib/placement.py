"""Where each parameter of the monolith lives, and the one way to put a layout back together.

    par = parallelize(model, mesh, plan); par.placements                # {name: Placement}
    whole = unshard(local, par.placements, groups={"tp": mesh["tp"]})  # {name: the monolith's tensor}

A `Placement` says which mesh axis splits a parameter (None: replicated), along which dim and
in how many fused pieces (q, k and v of one projection, each split alone), or, under ZeRO, at
which offset of which flat unit buffer it sits (`FlatSlice`: the buffer is cut in equal shards
over the dp axis, so a parameter's elements may straddle ranks), and which pipeline stage holds
it. `unshard` gathers every split tensor over its axis (torch's all-gather: a check
or a checkpoint, not the method, so it costs no modelled time and records no event) and joins
the shards as `tensor_parallel.layers.tp_shard_rows` cut them. Tensor parallelism's full
gradients and parameters, `parallelize.Parallel.unshard` and (chapter 18) a resharding
checkpoint, "gather by placement, split by the new placement", all go through it.

Introduced with the spine (chapter 15).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class FlatSlice:
    """A parameter inside a ZeRO unit's flat buffer: elements [offset, offset + numel) of the
    buffer `unit`, viewed as `shape`. The buffer is padded and cut in equal shards, one per rank
    of the placement's axis (`pipelib.data_parallel.zero_units.FlatUnit`)."""

    unit: str
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where one parameter of the monolith lives: the axis that splits it (None: replicated),
    the split dim and fused pieces (q, k, v) or its place in a flat ZeRO buffer (`flat`), and
    its pipeline stage (None: no pipeline), and for an expert's parameter its global expert id
    (held whole by the ep rank that owns the expert: its name is already the global one)."""

    axis: str | None = None
    dim: int | None = None
    fused: int = 1
    stage: int | None = None
    flat: FlatSlice | None = None
    expert: int | None = None   # the global expert id of an expert's parameter (axis "ep")


def join_shards(shards: list[torch.Tensor], dim: int, fused: int = 1) -> torch.Tensor:
    """The full tensor from the ranks' shards cut along `dim` (in `fused` pieces, each split alone)."""
    if fused == 1:
        return torch.cat(shards, dim=dim)
    pieces = [s.chunk(fused, dim=dim) for s in shards]  # [rank][q, k, v]
    return torch.cat([pieces[r][f] for f in range(fused) for r in range(len(shards))], dim=dim)


def unshard(local: Mapping[str, torch.Tensor], places: Mapping[str, Placement],
            groups: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """{name: whole tensor}: each of this rank's `local` tensors gathered over its placement's
    axis (`groups[axis]`, every rank of it calling) and joined; replicated ones cloned. A flat
    placement's local tensor is this rank's shard of its unit, under the unit's name: each unit
    is gathered once and every parameter cut from it."""
    out = {name: _cut(flat, place.flat) for name, place, flat in _gather_flat(local, places, groups)}
    units = {place.flat.unit for place in places.values() if place.flat is not None}
    for name, t in local.items():
        place = places.get(name, Placement())
        if name in units or place.flat is not None:
            continue
        group = groups.get(place.axis) if place.axis is not None else None
        size = dist.get_world_size(group) if place.axis is not None else 1
        if size == 1 or place.expert is not None:  # replicated, or a whole expert its owner holds
            out[name] = t.detach().clone()
            continue
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.detach().contiguous(), group=group)
        out[name] = join_shards(parts, place.dim, place.fused)
    return out


def _gather_flat(local, places, groups):
    """(name, placement, the whole flat buffer of its unit) for every flat placement."""
    whole = {}
    for name, place in places.items():
        if place.flat is None:
            continue
        unit = place.flat.unit
        if unit not in whole:
            shard = local[unit].detach().contiguous()
            group = groups.get(place.axis)
            parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, shard, group=group)
            whole[unit] = torch.cat(parts)
        yield name, place, whole[unit]


def _cut(flat: torch.Tensor, where: FlatSlice) -> torch.Tensor:
    return flat[where.offset:where.offset + where.numel].view(where.shape).clone()
