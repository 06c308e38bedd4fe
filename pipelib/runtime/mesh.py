"""The process groups of a `Topology`, made once per engine: `mesh["tp"]` is this rank's tp group.

    mesh = Mesh(Topology(dp=2, tp=2))       # on every rank, in the same order (Cluster.run)
    mesh["tp"], mesh["dp"]                   # this rank's groups along each axis
    mesh.coords, mesh.size("tp")             # Coords(pp=0, dp=1, cp=0, tp=1), 2
    Mesh.first(2)                            # a 1-axis mesh over ranks 0 and 1 of a larger world

The only place in pipelib that calls `torch.distributed.new_group` (a test checks): it is
collective (every rank of the world must call it for every group, in the same order, even for
groups it is not in) and slow (a rendezvous), so a group is made once per engine and kept in
`Device.groups` under (axis, ranks); a second `Mesh` of the same topology costs nothing.
Every group is also registered with its axis (`Device.axes`), so the events it carries are
tagged with it (`Event.axis`) and a trace can count the bytes of each axis.

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


class Mesh:
    """This rank's view of a topology: its coordinates and its group along every axis."""

    def __init__(self, topology: Topology, *, device=None):
        if not isinstance(topology, Topology):
            raise TypeError(f"Mesh: pass a pipelib.topology.Topology, not {type(topology).__name__}")
        self.topology, self.dev = topology, device or current()
        world = dist.get_world_size()
        topology.check_world(world, "the process group's world")
        self.global_rank = dist.get_rank()
        self._groups: dict[str, object] = {}
        for axis in topology.used:  # one order on every rank
            for ranks in topology.groups(axis):
                group = make_group(ranks, axis, self.dev)
                if self.global_rank in ranks:
                    self._groups[axis] = group
        # an axis of size 1 is this rank alone: every rank makes every rank's group of one
        # here, eagerly (new_group is collective: made lazily by some ranks only, it would hang)
        alone = self._alone()
        for axis in (*AXES, "ep"):
            self._groups.setdefault(axis, alone)
        if topology.pp > 1:  # the tied embedding's pairs, by every rank too (later calls find them made)
            self.tied_group()
        self.coords: Coords | None = (topology.coords(self.global_rank)
                                      if self.global_rank < topology.world_size else None)

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
        """This rank's process group along `axis`: a group of one rank when the axis has size 1."""
        if axis not in (*AXES, "ep"):
            raise KeyError(f"unknown mesh axis {axis!r}; use one of {(*AXES, 'ep')}")
        if not self.contains:
            raise ValueError(f"rank {self.global_rank} is outside {self.topology}; check `mesh.contains` "
                             f"before asking for its groups")
        return self._groups[axis]

    def _alone(self):
        alone = None
        for r in range(dist.get_world_size()):
            group = make_group((r,), None, self.dev)
            alone = group if r == self.global_rank else alone
        return alone

    def size(self, axis: str) -> int:
        return self.topology.size(axis)

    def local_rank(self, axis: str) -> int:
        """This rank's index along `axis` (its rank in `self[axis]`)."""
        return getattr(self.coords, axis)

    def ranks(self, axis: str) -> tuple[int, ...]:
        """The global ranks of this rank's group along `axis`."""
        return self.topology.group_of(axis, self.global_rank)

    # ------------------------------------------------------------------ derived groups
    def tied_group(self, first: int = 0, last: int | None = None):
        """Megatron-LM's embedding group: the ranks of pipeline stages `first` and `last` (pp
        indices; default the first and the last) at this rank's dp, cp and tp coordinates, which
        hold the two copies of a tied embedding/head weight. Made for every such pair, in one
        order, by every rank; None when one rank holds both or this rank holds neither."""
        pp = self.topology.pp
        last = pp - 1 if last is None else last
        if first == last:
            return None
        mine = None
        for ranks in self.topology.groups("pp"):
            pair = tuple(sorted((ranks[first], ranks[last])))
            group = make_group(pair, "pp", self.dev, kind="tied")
            mine = group if self.global_rank in pair else mine
        return mine

    def to_device_mesh(self, device_type: str | None = None):
        """torch's `DeviceMesh` over this mesh's used axes and the same process groups (the
        built-in twins: FSDP2 on mesh["dp"], DTensor on mesh["tp"])."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        axes = [a for a in self.topology.order if self.topology.size(a) > 1] or ["dp"]
        shape = [self.topology.size(a) for a in axes]
        grid = torch.arange(self.topology.world_size).reshape(shape)  # size-1 axes change nothing
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


def make_group(ranks, axis: str | None, device=None, *, kind: str = "axis"):
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
