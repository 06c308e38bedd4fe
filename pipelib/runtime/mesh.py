"""The process groups of a `Topology`, made once per engine: `mesh["tp"]` is this rank's tp group.

    mesh = Mesh(Topology(dp=2, tp=2))       # on every rank, in the same order (Cluster.run)
    mesh["tp"], mesh["dp"]                   # this rank's groups along each axis
    mesh["loss"], mesh["edp"], mesh["etp"]   # derived axes (pipelib.topology_groups)
    Mesh(topo, extra=("tp-pp",))["tp-pp"]    # a combined axis, asked for when the mesh is made
    mesh.coords, mesh.size("tp")             # Coords(pp=0, dp=1, cp=0, tp=1), 2
    Mesh.first(2)                            # a 1-axis mesh over ranks 0 and 1 of a larger world
    Mesh(Topology(dp=2), on=(1, 3))          # a grid on given ranks of the world
    Mesh(Topology(dp=4, dp_replicate=2))["dp_shard"]   # HSDP's shard and replica groups
    mesh.tied_group(0, 1), mesh.grid_group() # the tied embedding's pair; the grid's ranks

The only place in pipelib that calls `torch.distributed.new_group` (a test checks): it is
collective (every rank of the world must call it for every group, in the same order, even for
groups it is not in) and slow (a rendezvous), so a group is made once per engine and kept in
`Device.groups` under (axis, ranks); a second `Mesh` of the same topology costs nothing.
A mesh makes, in this order, on every rank: the groups of the used axes, those of the derived
axes (`topology_groups.DERIVED`) and of the `extra` combined axes, each only where it differs
from one already made (`mesh["loss"] is mesh["dp"]` when cp = 1), the groups of one rank, the
tied embedding's pairs, and the grid's group when the grid leaves ranks of the world out.
Every group is also registered with its axis (`Device.axes`: "dp", "edp", "dp-cp", the tied
pairs as "pp"), so the events it carries are tagged with it (`Event.axis`) and a trace can
count the bytes of each axis.

Strategies never see the mesh: they take one group (`DDP(model, mesh["dp"])`). Only
`pipelib.parallelize` and the trainer hold the whole mesh, as torchtitan's `parallelize_llama`.
`to_device_mesh()` gives torch's `DeviceMesh` over the same groups, for the built-in twins
(FSDP2, DTensor), so the twin and the from-scratch strategy share their groups.

Introduced with chapter 15; the one-strategy chapters use 1-axis meshes (`Mesh.first`).
"""
from __future__ import annotations

import torch.distributed as dist

from pipelib.runtime.device import current
from pipelib.topology import AXES, Coords, Topology
from pipelib.topology_groups import DERIVED


class Mesh:
    """This rank's view of a topology: its coordinates and its group along every axis, derived
    axis and `extra` combined axis ("tp-pp"; the same on every rank). `on`: the global ranks the
    grid lies on, ascending (grid rank i is global rank on[i], as the ranks of torch's
    `DeviceMesh`); default the first ranks of the world."""

    def __init__(self, topology: Topology, *, extra=(), on=None, device=None):
        if not isinstance(topology, Topology):
            raise TypeError(f"Mesh: pass a pipelib.topology.Topology, not {type(topology).__name__}")
        self.topology, self.dev = topology, device or current()
        world = dist.get_world_size()
        topology.check_world(world, "the process group's world")
        self.grid_ranks = tuple(range(topology.world_size)) if on is None else tuple(on)
        if (len(self.grid_ranks) != topology.world_size or list(self.grid_ranks) != sorted(set(self.grid_ranks))
                or not all(isinstance(r, int) and 0 <= r < world for r in self.grid_ranks)):
            raise ValueError(f"Mesh: on={on!r} must be {topology.world_size} distinct ranks of the world "
                             f"(0..{world - 1}), ascending, one per rank of {topology}")
        self.global_rank = dist.get_rank()
        self._grid_rank = self.grid_ranks.index(self.global_rank) if self.global_rank in self.grid_ranks else None
        self.extra = tuple(extra)
        for name in self.extra:
            topology.size(name)  # a ValueError naming a bad one, before any group is made
        self._groups: dict[str, object] = {}
        self._lists: dict[str, tuple] = {}  # name -> every group of it, for the made ones
        for axis in (*topology.used, *DERIVED, *self.extra):  # one order on every rank
            self._make_axis(axis)
        # an axis of size 1 is this rank alone: every rank makes every rank's group of one
        # here, eagerly (new_group is collective: made lazily by some ranks only, it would hang)
        self._alone = self._make_alone()
        for axis in (*AXES, "ep", *DERIVED, *self.extra):
            self._groups.setdefault(axis, self._alone)
        if topology.pp > 1:  # the tied embedding's pairs, by every rank too (later calls find them made)
            self.tied_group()
        partial = topology.world_size < world  # the grid's group, untagged: the checkpoint's own traffic
        self._grid = _make_group(self.grid_ranks, None, self.dev, kind="grid") if partial else None
        self.coords: Coords | None = None if self._grid_rank is None else topology.coords(self._grid_rank)

    def _global(self, ranks) -> tuple[int, ...]:
        """Grid ranks as global ranks (the same where the grid starts at rank 0)."""
        return tuple(self.grid_ranks[r] for r in ranks)

    def _make_axis(self, axis: str) -> None:
        """Make `axis`'s groups, unless they are one rank each or, for a derived axis, those of an
        axis made already (then this rank's group of that axis serves)."""
        if axis in self._lists or self.topology.size(axis) == 1:
            return
        groups = self.topology.groups(axis)
        # a derived axis reuses an equal axis's groups; a used axis (ep = dp too) has its own, so
        # the bytes it carries are counted on it (`Trace.bytes_sent(axis="ep")`)
        same = None if axis in self.topology.used else next((a for a, g in self._lists.items() if g == groups), None)
        self._lists[axis] = groups
        if same is not None:
            if same in self._groups:
                self._groups[axis] = self._groups[same]
            return
        for ranks in groups:
            group = _make_group(self._global(ranks), axis, self.dev)
            if self._grid_rank in ranks:
                self._groups[axis] = group

    @classmethod
    def first(cls, size: int, axis: str = "dp", *, device=None) -> Mesh:
        """A 1-axis mesh over ranks 0..size-1 of the world (the one-strategy chapters: DDP on 2 of
        4 engines). Ranks beyond it hold no groups (`mesh.contains` is False)."""
        return cls(Topology(**{axis: size}), device=device)

    # ------------------------------------------------------------------ this rank
    @property
    def contains(self) -> bool:
        """Whether this rank is on the grid (a mesh over the first ranks leaves the others out)."""
        return self.coords is not None

    def __getitem__(self, axis: str):
        """This rank's process group along `axis` (an axis, a derived axis such as "loss", "edp",
        "dp_shard", or a combined one made through `extra`): a group of one rank when its groups
        have one rank each. A KeyError names an unknown axis, or a combined one not made."""
        known = axis if axis in self._groups else self._made_as(axis)
        if not self.contains:
            raise ValueError(f"rank {self.global_rank} is outside {self.topology}; check `mesh.contains` "
                             f"before asking for its groups")
        return self._groups.get(known, self._alone)

    def _made_as(self, axis: str) -> str | None:
        """The made axis whose groups are `axis`'s (None: one rank each); a KeyError otherwise."""
        try:
            size = self.topology.size(axis)
        except ValueError as e:
            raise KeyError(f"unknown mesh axis {axis!r}: {e}") from None
        if size == 1:
            return None
        groups = self.topology.groups(axis)
        same = next((a for a, g in self._lists.items() if g == groups), None)
        if same is None:
            raise KeyError(f"mesh axis {axis!r} was not made by {self}; pass Mesh(topology, "
                           f"extra=({axis!r},)) on every rank (making a group is collective)")
        return same

    def _make_alone(self):
        alone = None
        for r in range(dist.get_world_size()):
            group = _make_group((r,), None, self.dev)
            alone = group if r == self.global_rank else alone
        return alone

    def size(self, axis: str) -> int:
        return self.topology.size(axis)

    def local_rank(self, axis: str) -> int:
        """This rank's index along `axis` (its rank in `self[axis]`)."""
        if axis in AXES or axis == "ep":
            return getattr(self.coords, axis)
        return self.topology.local_rank(axis, self._grid_rank)

    def ranks(self, axis: str) -> tuple[int, ...]:
        """The global ranks of this rank's group along `axis`."""
        return self._global(self.topology.group_of(axis, self._grid_rank))

    # ------------------------------------------------------------------ derived groups
    def tied_group(self, first: int = 0, last: int | None = None):
        """Megatron-LM's embedding group: the ranks of pipeline stages `first` and `last` (pp
        indices; default the first and the last) at this rank's dp, cp and tp coordinates, which
        hold the two copies of a tied embedding/head weight (`Topology.tied_pairs`). Made for
        every such pair, in one order, by every rank (the mesh makes (0, pp - 1)'s when pp > 1;
        other stages' pairs are made at the first call, which every rank of the world must make);
        None when one rank holds both or this rank holds neither. Tagged "pp"."""
        mine = None
        for pair in self.topology.tied_pairs(first, last):
            group = _make_group(self._global(pair), "pp", self.dev, kind="tied")
            mine = group if self._grid_rank in pair else mine
        return mine

    def grid_group(self):
        """The group of the grid's ranks (`grid_ranks`), made by the mesh on every rank of the
        world, untagged; None when the grid is the whole world (the default group) and on a rank
        off the grid (it is no member: torch's non-member placeholder is no group to use)."""
        return self._grid if self.contains else None

    def to_device_mesh(self, device_type: str | None = None):
        """torch's `DeviceMesh` over this mesh's used axes and the same process groups (the
        built-in twins: FSDP2 on mesh["dp"], DTensor on mesh["tp"])."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        axes = [a for a in self.topology.order if self.topology.size(a) > 1] or ["dp"]
        shape = [self.topology.size(a) for a in axes]
        grid = torch.tensor(self.grid_ranks).reshape(shape)  # size-1 axes change nothing
        device_type = device_type or self.dev.torch_device.type
        groups = [self[a] for a in axes]
        return DeviceMesh.from_group(groups if len(groups) > 1 else groups[0], device_type,
                                     mesh=grid if len(axes) > 1 else None,
                                     mesh_dim_names=tuple(axes))

    def __repr__(self) -> str:
        where = f"coords {tuple(self.coords)}" if self.contains else "not on the grid"
        return f"Mesh({self.topology}, rank {self.global_rank}: {where})"


def device_mesh(group, axis: str = "dp", device_type: str | None = None):
    """torch's 1-D `DeviceMesh` over an existing process group (a twin given one group: FSDP2 on
    the dp group, DTensor on the tp group), on this rank's device type."""
    from torch.distributed.device_mesh import DeviceMesh

    group = dist.group.WORLD if group is None else group
    return DeviceMesh.from_group(group, device_type or current().torch_device.type, mesh_dim_names=(axis,))


def _make_group(ranks, axis: str | None, device=None, *, kind: str = "axis"):
    """The process group of global `ranks`, made the first time on this engine and kept on the
    device (every rank of the world must call this for the same ranks, in the same order)."""
    dev = device or current()
    ranks = tuple(sorted(ranks))
    key = ("mesh", kind, axis, ranks)
    group = dev.groups.get(key)
    if group is None:
        group = dev.groups[key] = dist.new_group(list(ranks))
        if axis is not None and group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dev.axes[id(group)] = axis
    return group
