"""The conjugate operators of Megatron-LM and their sequence-parallel forms, as autograd functions.

Megatron-LM (Shoeybi et al. 2019, §3) needs two operators around a column-parallel then a
row-parallel linear:

- `f` (`copy_to_tp`): identity forward, all-reduce of the gradient backward (the input was
  used by every rank; each rank's gradient is a partial sum);
- `g` (`reduce_from_tp`): all-reduce forward (each rank's output is a partial sum), identity
  backward. f and g are conjugate: each one's backward is the other's forward.

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) splits each all-reduce in two and keeps
the activations between them sharded along the sequence (dim 1 of (B, T, C)):

- `gather_sequence` (their g, in place of Megatron's f): all-gather along the sequence forward,
  reduce-scatter back;
- `scatter_sequence` (their g-bar, in place of Megatron's g): reduce-scatter along the sequence
  forward, all-gather back.

Who sends what: every rank of `group` (t ranks) takes part; an all-reduce of N bytes sends
2 (t-1)/t N per rank, a reduce-scatter or an all-gather (t-1)/t N (N the full tensor).

`TPComm` carries the group and the backend: ``"pipelib"`` runs the ring collectives of
`pipelib.comm.collectives` (chapter 06: traced, on the simulated clock; every COLLECTIVE event is
labelled with the layer and the operator, passed as the collective's ``label=``, e.g.
``"all_reduce: blocks.0.mlp.c_proj g forward"``, and tagged with the group's mesh axis);
``"torch"`` runs torch's built-ins (gloo or NCCL), untraced. With ``overlap=True`` the
column-parallel layers launch their backward collective on the communication lane of `lanes`
(`pipelib.tensor_parallel.overlap.TPLanes`) while the weight gradient is computed; `lanes` also
charges the compute between collectives to the simulated clock while it is timing. Introduced
in chapter 09.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS = ("pipelib", "torch")


@dataclass(frozen=True)
class TPComm:
    """The tensor-parallel group and how to talk in it."""

    group: object
    backend: str = "pipelib"
    overlap: bool = False   # column layers: dX's collective hidden behind dW (Korthikanti §6.2)
    lanes: object = None    # pipelib.tensor_parallel.overlap.TPLanes of this rank, or None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}; use one of {BACKENDS}")
        if self.overlap and self.lanes is None:
            raise ValueError("TPComm(overlap=True) hides dX's collective on the rank's compute and "
                             "communication lanes: pass lanes=pipelib.tensor_parallel.overlap.TPLanes(device)")

    @property
    def uses_torch(self) -> bool:
        """torch's built-in collectives (untraced), not pipelib's ring."""
        return self.backend == "torch"

    def lap(self) -> None:
        """Charge the compute since the last collective to the clock (while `lanes` is timing)."""
        if self.lanes is not None:
            self.lanes.lap()

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)


def all_reduce_tp(x: torch.Tensor, comm: TPComm, label: str, op: str = "sum") -> torch.Tensor:
    """Sum (or max) of x over the group, a new tensor; `label` names the layer and operator."""
    comm.lap()
    y = x.contiguous().clone()
    if comm.size == 1:
        return y
    if comm.backend == "torch":
        dist.all_reduce(y, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=comm.group)
        return y
    from pipelib.comm.collectives import all_reduce

    return all_reduce(y, op, group=comm.group, check=False, label=label)


def _tp_seq_first(x):  # (B, T, ...) -> (T, B, ...) contiguous: the collectives cut dim 0
    return x.transpose(0, 1).contiguous()


def all_gather_seq(x: torch.Tensor, comm: TPComm, label: str) -> torch.Tensor:
    """(B, T/t, C) shards -> (B, T, C), rank order along the sequence."""
    comm.lap()
    if comm.size == 1:
        return x.clone()
    s = _tp_seq_first(x)
    if comm.backend == "torch":
        out = torch.empty((s.shape[0] * comm.size, *s.shape[1:]), dtype=s.dtype, device=s.device)
        dist.all_gather_into_tensor(out, s, group=comm.group)
    else:
        from pipelib.comm.collectives import all_gather

        out = all_gather(s, group=comm.group, check=False, label=label)
    return out.transpose(0, 1)


def reduce_scatter_seq(x: torch.Tensor, comm: TPComm, label: str) -> torch.Tensor:
    """(B, T, C) partial sums -> this rank's (B, T/t, C) shard of their sum."""
    comm.lap()
    if comm.size == 1:
        return x.clone()
    s = _tp_seq_first(x)
    if comm.backend == "torch":
        out = torch.empty((s.shape[0] // comm.size, *s.shape[1:]), dtype=s.dtype, device=s.device)
        dist.reduce_scatter_tensor(out, s, group=comm.group)
    else:
        from pipelib.comm.collectives import reduce_scatter

        out = reduce_scatter(s, group=comm.group, check=False, label=label)
    return out.transpose(0, 1)


def seq_shard(x: torch.Tensor, comm: TPComm, dim: int = 1) -> torch.Tensor:
    """This rank's part of x along `dim` (T/t positions), no communication."""
    return x.chunk(comm.size, dim=dim)[comm.rank]


class _TPCopy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, label):
        ctx.comm, ctx.label = comm, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_tp(grad, ctx.comm, f"{ctx.label} f backward"), None, None


class _TPReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, label):
        return all_reduce_tp(x, comm, f"{label} g forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _TPGatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, label):
        ctx.comm, ctx.label = comm, label
        return all_gather_seq(x, comm, f"{label} all-gather forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_seq(grad, ctx.comm, f"{ctx.label} reduce-scatter backward"), None, None


class _TPScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, label):
        ctx.comm, ctx.label = comm, label
        return reduce_scatter_seq(x, comm, f"{label} reduce-scatter forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad, ctx.comm, f"{ctx.label} all-gather backward"), None, None


def copy_to_tp(x: torch.Tensor, comm: TPComm, label: str = "f") -> torch.Tensor:
    """Megatron's f: identity forward; backward, all-reduce of the gradient (2 (t-1)/t N bytes)."""
    return _TPCopy.apply(x, comm, label)


def reduce_from_tp(x: torch.Tensor, comm: TPComm, label: str = "g") -> torch.Tensor:
    """Megatron's g: all-reduce forward (2 (t-1)/t N bytes per rank); identity backward."""
    return _TPReduce.apply(x, comm, label)


def gather_sequence(x: torch.Tensor, comm: TPComm, label: str = "sp") -> torch.Tensor:
    """Sequence parallel g (Korthikanti et al.): all-gather (B, T/t, C) -> (B, T, C); backward, reduce-scatter."""
    return _TPGatherSeq.apply(x, comm, label)


def scatter_sequence(x: torch.Tensor, comm: TPComm, label: str = "sp") -> torch.Tensor:
    """Sequence parallel g-bar (Korthikanti et al.): reduce-scatter (B, T, C) -> (B, T/t, C); backward, all-gather."""
    return _TPScatterSeq.apply(x, comm, label)
