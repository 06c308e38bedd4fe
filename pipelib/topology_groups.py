"""The names of a topology's axes, single, derived and combined, and their groups by arithmetic.

    axis_parts("loss")          # ("dp", "cp"): the ranks whose losses are averaged
    axis_parts("tp-dp-cp")      # ("tp", "dp", "cp"): any '-'-joined set of axes
    dims(topology, ("dp", "cp"))  # ([(size, stride) varying], [(size, stride) fixed])

Pure (no torch), used by `pipelib.topology.Topology.groups`, `group_of`, `size` and
`local_rank`. A group of a set of axes is the ranks that vary along exactly those axes, every
other coordinate fixed (Megatron-Core's `RankGenerator.get_ranks("tp-dp")`, torch's
`DeviceMesh._flatten`). A rank is a mixed-radix number: the index along each axis times its
stride (`Topology.order`, the last axis fastest), so a group is a base (the fixed
coordinates) plus every offset of the varying ones, both computed once a listing: every group
of a 10,752-rank grid takes milliseconds, with no per-rank search.

The data-parallel axis may be cut in two, outer x inner, with the inner index varying fastest:
- expert parallelism: `ep` is the inner cut (ep consecutive dp indices), `edp` the outer one
  (the dp indices with the same dp % ep: the ranks holding the same experts);
- HSDP: `dp_shard` is the inner cut (runs of dp // dp_replicate consecutive dp indices),
  `dp_replicate` the outer one (the dp indices with the same dp % dp_shard).
A combined name names at most one of dp and these cuts (ep and dp_shard do not nest in general).

Named derived axes are aliases: `loss` is "dp-cp" (the ranks whose losses are averaged,
torchtitan's `loss` mesh); `etp`, expert tensor parallelism, is "tp": the experts are split
along tp exactly as the dense layers are (a separate expert tp degree is not modelled yet).
"""
from __future__ import annotations

from types import MappingProxyType

GRID = ("pp", "dp", "cp", "tp")                      # the axes that multiply into the world
DP_CUTS = MappingProxyType({"ep": "inner", "edp": "outer", "dp_shard": "inner", "dp_replicate": "outer"})
ALIASES = MappingProxyType({"loss": ("dp", "cp"), "etp": ("tp",)})
DERIVED = ("loss", "edp", "etp", "dp_shard", "dp_replicate")  # named derived axes (beside ep)
NAMES = (*GRID, "ep", *DERIVED)                      # every single name a group list answers to


def axis_parts(name) -> tuple[str, ...]:
    """The axes `name` stands for, aliases expanded ("loss" -> ("dp", "cp")); a ValueError
    naming the value for an unknown name, an axis given twice, or two cuts of dp."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"unknown axis {name!r}; use one of {NAMES}, or several joined by '-' (e.g. 'dp-cp')")
    parts: list[str] = []
    for part in name.split("-"):
        if part not in NAMES:
            raise ValueError(f"unknown axis {part!r} in {name!r}; use one of {NAMES}, or several joined "
                             f"by '-' (e.g. 'dp-cp')")
        parts += ALIASES.get(part, (part,))
    twice = sorted({p for p in parts if parts.count(p) > 1})
    if twice:
        raise ValueError(f"axis {name!r} names {twice} twice; name each axis once (loss is dp-cp, etp is tp)")
    cuts = [p for p in parts if p == "dp" or p in DP_CUTS]
    if len(cuts) > 1:
        raise ValueError(f"axis {name!r} combines {cuts}, which all lie within dp; name at most one of "
                         f"dp, {', '.join(DP_CUTS)}")
    return tuple(parts)


def _inner(topology, cut: str) -> int:
    """The size of dp's inner cut for `cut` (ep, or HSDP's dp_shard)."""
    return topology.ep if cut in ("ep", "edp") else topology.dp // topology.dp_replicate


def dims(topology, parts) -> tuple[list, list]:
    """(varying, fixed): the (size, stride) of every digit of a rank that moves within a group
    of `parts` and of every digit that stays fixed (dp counted as outer x inner when cut)."""
    strides, step = {}, 1
    for axis in reversed(topology.order):
        strides[axis] = step
        step *= getattr(topology, axis)
    varying, fixed = [], []
    for axis in GRID:
        n, s = getattr(topology, axis), strides[axis]
        cut = next((p for p in parts if p in DP_CUTS), None) if axis == "dp" else None
        if cut is None:
            (varying if axis in parts else fixed).append((n, s))
            continue
        k = _inner(topology, cut)
        inner, outer = (k, s), (n // k, s * k)
        varying.append(inner if DP_CUTS[cut] == "inner" else outer)
        fixed.append(outer if DP_CUTS[cut] == "inner" else inner)
    return varying, fixed


def offsets(digits) -> list[int]:
    """Every sum of index x stride over `digits` ((size, stride) pairs), ascending."""
    out = [0]
    for n, s in digits:
        if n > 1:
            out = [o + i * s for o in out for i in range(n)]
    return sorted(out)


def group_size(topology, parts) -> int:
    """The ranks in one group of `parts`."""
    out = 1
    for n, _ in dims(topology, parts)[0]:
        out *= n
    return out


def smallest_rank(varying, rank: int) -> int:
    """`rank` with its varying digits set to 0: the smallest rank of its group."""
    return rank - sum(rank // s % n * s for n, s in varying)


def group_index(varying, rank: int) -> int:
    """`rank`'s place in its group (ranks ascending): its varying digits read as one number,
    the digit of the largest stride most significant."""
    out = 0
    for n, s in sorted(varying, key=lambda d: -d[1]):
        out = out * n + rank // s % n
    return out
