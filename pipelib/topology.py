"""Ranks laid out on a grid of parallelism axes: rank <-> coordinates, and the groups of each axis.

    topo = Topology(dp=2, tp=2)                 # 4 ranks; order ("pp", "dp", "cp", "tp")
    topo.coords(3)                              # Coords(pp=0, dp=1, cp=0, tp=1)
    topo.rank(dp=1, tp=0)                       # 2
    topo.group_of("tp", 3)                      # (2, 3): the ranks that split rank 3's layers
    topo.groups("dp")                           # ((0, 2), (1, 3)): every dp group, in one order

Pure: no process starts, no torch (DESIGN.md section 2). `pipelib.runtime.mesh.Mesh` makes one
process group per group listed here, and the planner of chapter 15 reasons on it without a
cluster.

The order lists the axes outermost first, as torch's `DeviceMesh` and torchtitan's
`ParallelDims` do: the last axis varies fastest, so its groups are runs of consecutive ranks.
The placement rule the book teaches (Megatron-LM's default "tp-cp-ep-dp-pp", read innermost
first): tensor parallelism innermost, because its all-reduces sit on the critical path of every
layer and need the fastest links, those inside a node; then context parallelism, data
parallelism, and pipeline parallelism outermost, whose point-to-point sends are the smallest and
cross nodes best. `check_placement(gpus_per_node)` says when a layout breaks it.

Expert parallelism does not multiply the world: as in Megatron-Core and DeepSpeed-MoE, the
experts are spread over the data-parallel ranks, so `ep` divides `dp` and an ep group is a run of
`ep` consecutive dp ranks at the same other coordinates (chapter 16).

Introduced in chapter 15; every chapter's one-strategy runs are 1-axis topologies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pipelib.checks import check_int, is_int_at_least

AXES = ("pp", "dp", "cp", "tp")           # the axes that multiply into the world size
DEFAULT_ORDER = ("pp", "dp", "cp", "tp")  # outermost first: tp innermost (the placement rule)


class Coords(NamedTuple):
    """A rank's place on the grid: its index along every axis (0 along an axis of size 1)."""

    pp: int = 0
    dp: int = 0
    cp: int = 0
    tp: int = 0
    ep: int = 0


@dataclass(frozen=True)
class Topology:
    """How many ranks along each axis, and the order of the axes (outermost first)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self):
        for axis in (*AXES, "ep"):
            check_int(getattr(self, axis), axis, context="Topology", hint="ranks along the axis; 1 means unused")
        order = tuple(self.order)
        if sorted(order) != sorted(AXES):
            raise ValueError(f"Topology: order={order!r} must name each of {AXES} once, outermost "
                             f"first, e.g. {DEFAULT_ORDER} (tp innermost)")
        object.__setattr__(self, "order", order)
        if self.dp % self.ep:
            raise ValueError(f"Topology: ep={self.ep} does not divide dp={self.dp}; experts are spread "
                             f"over the data-parallel ranks, so pass an ep that divides dp")

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def size(self, axis: str) -> int:
        """Ranks along `axis` ("dp", "tp", "pp", "cp" or "ep")."""
        _check_axis(axis)
        return getattr(self, axis)

    @property
    def used(self) -> tuple[str, ...]:
        """The axes with more than one rank, outermost first (ep after dp)."""
        out = [a for a in self.order if getattr(self, a) > 1]
        return tuple(out) + (("ep",) if self.ep > 1 else ())

    def check_world(self, world_size: int, what: str = "the cluster") -> None:
        """A ValueError unless the grid fits `world_size` ranks exactly or uses its first ranks."""
        if self.world_size > world_size:
            raise ValueError(f"{self} needs {self.world_size} ranks but {what} has {world_size}; "
                             f"lower a degree or start Cluster(world_size={self.world_size})")

    # ------------------------------------------------------------------ coordinates
    def _strides(self) -> dict[str, int]:
        strides, step = {}, 1
        for axis in reversed(self.order):
            strides[axis] = step
            step *= getattr(self, axis)
        return strides

    def coords(self, rank: int) -> Coords:
        """The coordinates of global rank `rank` (0 <= rank < world_size)."""
        if not is_int_at_least(rank, 0) or rank >= self.world_size:
            raise ValueError(f"{self}: rank {rank!r} is outside the grid's ranks 0..{self.world_size - 1}")
        strides = self._strides()
        at = {a: rank // strides[a] % getattr(self, a) for a in AXES}
        return Coords(**at, ep=at["dp"] % self.ep)

    def rank(self, **coords: int) -> int:
        """The global rank at `coords` (axes left out are 0); `ep` is part of dp, not given."""
        unknown = set(coords) - set(AXES)
        if unknown:
            raise ValueError(f"Topology.rank: unknown axes {sorted(unknown)}; give some of {AXES}")
        strides, rank = self._strides(), 0
        for axis, i in coords.items():
            if not (isinstance(i, int) and 0 <= i < getattr(self, axis)):
                raise ValueError(f"{self}: {axis}={i!r} is outside 0..{getattr(self, axis) - 1}")
            rank += i * strides[axis]
        return rank

    # ------------------------------------------------------------------ groups
    def group_of(self, axis: str, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group along `axis`, in axis order (group rank i is the i-th)."""
        _check_axis(axis)
        c = self.coords(rank)._asdict()
        if axis == "ep":
            first = c["dp"] - c["dp"] % self.ep
            return tuple(self.rank(**{**_grid(c), "dp": first + i}) for i in range(self.ep))
        return tuple(self.rank(**{**_grid(c), axis: i}) for i in range(getattr(self, axis)))

    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """Every group along `axis`, each once, ordered by their smallest rank: the order in
        which every rank must create them (making a process group is collective)."""
        seen = {self.group_of(axis, r) for r in range(self.world_size)}
        return tuple(sorted(seen))

    # ------------------------------------------------------------------ placement
    def check_placement(self, gpus_per_node: int) -> list[str]:
        """What breaks the placement rule on nodes of `gpus_per_node` GPUs (empty: nothing).

        Every tensor-parallel group should sit inside one node (its all-reduces are on every
        layer's critical path), and so should context parallelism's ring where it fits."""
        problems = []
        for axis in ("tp", "cp"):
            size = getattr(self, axis)
            if size == 1:
                continue
            split = [g for g in self.groups(axis) if len({r // gpus_per_node for r in g}) > 1]
            if split and (axis == "tp" or size <= gpus_per_node):
                problems.append(f"{axis} groups cross nodes of {gpus_per_node} GPUs (e.g. ranks {split[0]}); "
                                f"put {axis} innermost in the order, with {axis} <= {gpus_per_node}")
        return problems

    # ------------------------------------------------------------------ printing, JSON
    def __str__(self) -> str:
        sizes = " x ".join(f"{a}={getattr(self, a)}" for a in self.order if getattr(self, a) > 1) or "1 rank"
        ep = f" (ep={self.ep} within dp)" if self.ep > 1 else ""
        return f"Topology({sizes}{ep}; {self.world_size} ranks, order {' > '.join(self.order)})"

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep,
                "order": list(self.order)}

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        known = {"dp", "tp", "pp", "cp", "ep", "order"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"Topology.from_dict: unknown keys {sorted(extra)}; use some of {sorted(known)}")
        d = dict(d)
        if "order" in d:
            d["order"] = tuple(d["order"])
        return cls(**d)

    def table(self) -> str:
        """Every rank and its coordinates, one line each (chapter 15 draws it as a grid)."""
        axes = list(self.order) + (["ep"] if self.ep > 1 else [])
        lines = ["rank  " + "  ".join(f"{a:>2}" for a in axes)]
        for r in range(self.world_size):
            c = self.coords(r)._asdict()
            lines.append(f"{r:>4}  " + "  ".join(f"{c[a]:>2}" for a in axes))
        return "\n".join(lines)


def _grid(c: dict) -> dict:
    return {a: c[a] for a in AXES}


def _check_axis(axis: str) -> None:
    if axis not in (*AXES, "ep"):
        raise ValueError(f"unknown axis {axis!r}; use one of {(*AXES, 'ep')}")
