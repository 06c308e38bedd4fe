"""Ranks laid out on a grid of parallelism axes: rank <-> coordinates, and the groups of each axis.

    topo = Topology(dp=2, tp=2)                 # 4 ranks; order ("pp", "dp", "cp", "tp")
    topo.coords(3)                              # Coords(pp=0, dp=1, cp=0, tp=1)
    topo.rank(dp=1, tp=0)                       # 2
    topo.group_of("tp", 3)                      # (2, 3): the ranks that split rank 3's layers
    topo.groups("dp")                           # ((0, 2), (1, 3)): every dp group, in one order
    topo.groups("dp-tp")                        # ((0, 1, 2, 3),): a combined axis
    topo.tied_pairs(0, 1)                       # the tied embedding's pairs (pp indices 0 and 1)

Pure: no process starts, no torch (DESIGN.md section 2). `pipelib.runtime.mesh.Mesh` makes one
process group per group listed here, and the planner of chapter 15 reasons on it without a
cluster.

Beside the four axes and ep, the topology names the derived groups as pure rank lists, as
Megatron-Core's `RankGenerator.get_ranks("tp-dp")` and torchtitan's `ParallelDims` do
(`pipelib.topology_groups`): any '-'-joined set of axes ("dp-cp", "tp-pp": the ranks that vary
along exactly those axes, every other coordinate fixed); `loss` (dp x cp, the ranks whose losses
are averaged); `edp` (expert data parallel: the dp ranks holding the same experts, those with
the same dp % ep); `etp` (expert tensor parallel, the tp groups for now); HSDP's `dp_shard`
(runs of dp // dp_replicate consecutive dp indices) and `dp_replicate` (the dp indices with the
same index mod dp_shard). Groups are listed sorted by their smallest rank, the order in which
every rank makes them; a group's ranks are ascending, so along one axis group rank i is index i
along it, and in a combined group the outermost axis (in `order`) is the most significant digit,
as torch's `DeviceMesh._flatten` numbers them.

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

from pipelib import topology_groups as tg
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
    dp_replicate: int = 1  # HSDP: dp = dp_replicate x dp_shard (ZeRO within a shard group)

    def __post_init__(self):
        for axis in (*AXES, "ep", "dp_replicate"):
            check_int(getattr(self, axis), axis, context="Topology", hint="ranks along the axis; 1 means unused")
        order = tuple(self.order)
        if sorted(order) != sorted(AXES):
            raise ValueError(f"Topology: order={order!r} must name each of {AXES} once, outermost "
                             f"first, e.g. {DEFAULT_ORDER} (tp innermost)")
        object.__setattr__(self, "order", order)
        if self.dp % self.ep:
            raise ValueError(f"Topology: ep={self.ep} does not divide dp={self.dp}; experts are spread "
                             f"over the data-parallel ranks, so pass an ep that divides dp")
        if self.dp % self.dp_replicate:
            raise ValueError(f"Topology: dp_replicate={self.dp_replicate} does not divide dp={self.dp}; HSDP "
                             f"cuts dp into dp_replicate x dp_shard, so pass a dp_replicate that divides dp")

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def dp_shard(self) -> int:
        """HSDP's shard group size: dp // dp_replicate (dp when there is no HSDP)."""
        return self.dp // self.dp_replicate

    def size(self, axis: str) -> int:
        """Ranks in a group of `axis`: "dp", "tp", "pp", "cp", "ep", a derived axis ("loss",
        "edp", "etp", "dp_shard", "dp_replicate") or a '-'-joined set ("dp-cp")."""
        if axis in (*AXES, "ep"):
            return getattr(self, axis)
        return tg.group_size(self, tg.axis_parts(axis))

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
        """The ranks of `rank`'s group along `axis` (any name `size` takes), ascending: along one
        axis group rank i is the rank at index i."""
        self.coords(rank)  # a ValueError for a rank off the grid
        varying, _ = tg.dims(self, tg.axis_parts(axis))
        first = tg.smallest_rank(varying, rank)
        return tuple(first + o for o in tg.offsets(varying))

    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """Every group along `axis`, each once, ordered by their smallest rank: the order in
        which every rank must create them (making a process group is collective)."""
        varying, fixed = tg.dims(self, tg.axis_parts(axis))
        inside = tg.offsets(varying)
        return tuple(tuple(b + o for o in inside) for b in tg.offsets(fixed))

    def local_rank(self, axis: str, rank: int) -> int:
        """`rank`'s index in its group along `axis` (its group rank)."""
        self.coords(rank)
        return tg.group_index(tg.dims(self, tg.axis_parts(axis))[0], rank)

    def tied_pairs(self, first: int = 0, last: int | None = None) -> tuple[tuple[int, int], ...]:
        """For every pp group (in `groups("pp")` order), the sorted pair of its ranks at pp indices
        `first` and `last` (default the last stage): the ranks holding the two copies of a tied
        embedding/head weight (Megatron-LM's embedding group). Empty when first == last."""
        last = self.pp - 1 if last is None else last
        for name, i in (("first", first), ("last", last)):
            if not is_int_at_least(i, 0) or i >= self.pp:
                raise ValueError(f"Topology.tied_pairs: {name}={i!r} is not a pp index of {self}; "
                                 f"pass 0..{self.pp - 1}")
        if first == last:
            return ()
        return tuple(tuple(sorted((g[first], g[last]))) for g in self.groups("pp"))

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
        if self.dp_replicate > 1:
            ep += f" (dp = dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard})"
        return f"Topology({sizes}{ep}; {self.world_size} ranks, order {' > '.join(self.order)})"

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep,
                "order": list(self.order), "dp_replicate": self.dp_replicate}

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        known = {"dp", "tp", "pp", "cp", "ep", "order", "dp_replicate"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"Topology.from_dict: unknown keys {sorted(extra)}; use some of {sorted(known)}")
        d = dict(d)
        if "order" in d:
            d["order"] = tuple(d["order"])
        return cls(**d)

    def table(self) -> str:
        """Every rank and its coordinates, one line each (chapter 15 draws it as a grid); ep and
        HSDP's dp_replicate and dp_shard indices when used."""
        axes = list(self.order) + (["ep"] if self.ep > 1 else [])
        axes += ["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else []
        lines = ["rank  " + "  ".join(f"{a:>2}" for a in axes)]
        for r in range(self.world_size):
            c = self.coords(r)._asdict()
            at = [c[a] if a in c else self.local_rank(a, r) for a in axes]
            lines.append(f"{r:>4}  " + "  ".join(f"{i:>{max(2, len(a))}}" for a, i in zip(axes, at)))
        return "\n".join(lines)

