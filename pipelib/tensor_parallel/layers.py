"""Column- and row-parallel linears (Megatron-LM §3), and the parallel MLP and attention built
from them on the unaware model's own modules.

A Linear computes Y = X A^T (torch keeps A as (out, in)). Split A by output rows,
A = [A_1; ...; A_t]: rank r computes Y_r = X A_r^T, a column block of Y, from the whole X
(`ColumnParallelLinear`). Split A by input columns, A = [B_1 ... B_t]: rank r computes
X_r B_r^T from its column block X_r of the input, and Y = sum_r X_r B_r^T (`RowParallelLinear`).
Put one after the other (the MLP's c_fc then c_proj; attention's c_attn then c_proj) and the
output of the first is exactly the input the second needs: the only communication is the
all-reduce of the sum (`g`) and, backward, of the input's gradient (`f`). GeLU is elementwise,
so it runs on column blocks; attention heads are independent, so each rank runs n_head / t.

Each layer's weights are cut from the full Linear at construction; every parameter keeps how it
was cut (`tp_dim`, `tp_fused`) so `pipelib.tensor_parallel.apply.tp_full_gradients` can put the
gradients back together under the model's names. Introduced in chapter 09.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipelib.tensor_parallel.ops import TPComm, copy_to_tp, gather_sequence, reduce_from_tp, scatter_sequence
from pipelib.tensor_parallel.overlap import column_linear_overlapped


def tp_shard_rows(w: torch.Tensor, t: int, r: int, fused: int = 1) -> torch.Tensor:
    """Rank r's rows of w (dim 0). With `fused` = 3 (q, k, v stacked), rank r takes its t-th of
    each of the 3 blocks, so it holds q, k and v of the same heads."""
    parts = w.chunk(fused, dim=0)
    return torch.cat([p.chunk(t, dim=0)[r] for p in parts], dim=0).clone()


def _tp_param(data: torch.Tensor, dim: int | None, fused: int = 1) -> nn.Parameter:
    p = nn.Parameter(data)
    p.tp_dim, p.tp_fused = dim, fused  # how the full tensor was cut (None: replicated)
    return p


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_r^T + b_r: rank r's output features. Forward input: the whole X, through `f`
    (identity forward, all-reduce of dX backward), or with `sequence_parallel` the rank's
    sequence shard, all-gathered (reduce-scattered backward). Output stays split by features.
    With the group's ``overlap`` (`TPComm`), the backward collective of dX runs while the weight
    gradient is computed (`pipelib.tensor_parallel.overlap`), except when the enclosing module
    gathered the input (``gathered``: its collective is the module's, not this layer's)."""

    def __init__(self, linear: nn.Linear, comm: TPComm, *, fused: int = 1,
                 sequence_parallel: bool = False, gathered: bool = False, label: str = "column"):
        super().__init__()
        t, r = comm.size, comm.rank
        self.comm, self.sequence_parallel, self.label = comm, sequence_parallel, label
        self.gathered = gathered  # the enclosing module all-gathered the sequence already
        self.in_features, self.out_features = linear.in_features, linear.out_features // t
        self.weight = _tp_param(tp_shard_rows(linear.weight.detach(), t, r, fused), 0, fused)
        self.bias = (None if linear.bias is None
                     else _tp_param(tp_shard_rows(linear.bias.detach(), t, r, fused), 0, fused))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, in) or (B, T/t, in)
        if self.comm.overlap and not self.gathered and self.comm.size > 1:
            return column_linear_overlapped(x, self.weight, self.bias, self.comm, self.label,
                                            self.sequence_parallel)  # (B, T, out / t)
        if self.gathered:
            pass  # (B, T, in): gathered by the enclosing module (`gather_sequence_before`)
        elif self.sequence_parallel:
            x = gather_sequence(x, self.comm, self.label)  # (B, T, in)
        else:
            x = copy_to_tp(x, self.comm, self.label)  # (B, T, in)
        return F.linear(x, self.weight, self.bias)  # (B, T, out / t)

    def extra_repr(self) -> str:
        whole = self.out_features * self.comm.size
        return f"in_features={self.in_features}, out_features={self.out_features} (of {whole})"


class RowParallelLinear(nn.Module):
    """Y = sum_r X_r B_r^T + b: rank r holds input columns B_r; the partial sums are all-reduced
    (`g`; identity backward) or, with `sequence_parallel`, reduce-scattered along the sequence
    (all-gathered backward). The bias is added once, after the sum (replicated; under sequence
    parallelism its gradient is summed over the group after backward)."""

    def __init__(self, linear: nn.Linear, comm: TPComm, *, sequence_parallel: bool = False,
                 label: str = "row"):
        super().__init__()
        t, r = comm.size, comm.rank
        self.comm, self.sequence_parallel, self.label = comm, sequence_parallel, label
        self.in_features, self.out_features = linear.in_features // t, linear.out_features
        self.weight = _tp_param(linear.weight.detach().chunk(t, dim=1)[r].clone(), 1)
        self.bias = None if linear.bias is None else _tp_param(linear.bias.detach().clone(), None)
        if self.bias is not None and sequence_parallel:
            self.bias.tp_sequence = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, in / t)
        y = F.linear(x, self.weight)  # (B, T, out), this rank's partial sum
        if self.sequence_parallel:
            y = scatter_sequence(y, self.comm, self.label)  # (B, T/t, out)
        else:
            y = reduce_from_tp(y, self.comm, self.label)  # (B, T, out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        whole = self.in_features * self.comm.size
        return f"in_features={self.in_features} (of {whole}), out_features={self.out_features}"


def gather_sequence_before(module: nn.Module, comm: TPComm, label: str) -> None:
    """Under sequence parallelism, all-gather `module`'s input along the sequence before its
    forward runs (a forward pre-hook): attention reads T from its input, so it must see the
    whole sequence; its c_attn is then built with ``gathered=True``."""
    def hook(_module, args):
        return (gather_sequence(args[0], comm, label), *args[1:])

    module.register_forward_pre_hook(hook)


def parallel_mlp(mlp: nn.Module, comm: TPComm, *, sequence_parallel: bool = False, name: str = "mlp") -> nn.Module:
    """The MLP of Megatron §3 in place: c_fc column-parallel (GeLU on each rank's 4C/t columns),
    c_proj row-parallel. One all-reduce forward (g), one backward (f)."""
    mlp.c_fc = ColumnParallelLinear(mlp.c_fc, comm, sequence_parallel=sequence_parallel, label=f"{name}.c_fc")
    mlp.c_proj = RowParallelLinear(mlp.c_proj, comm, sequence_parallel=sequence_parallel, label=f"{name}.c_proj")
    return mlp


def parallel_attention(attn: nn.Module, comm: TPComm, *, sequence_parallel: bool = False,
                       name: str = "attn") -> nn.Module:
    """Attention with the heads split (Megatron §3) in place: c_attn column-parallel inside q, k
    and v (rank r: heads r n_head/t ...), n_head -> n_head / t, c_proj row-parallel. One
    all-reduce forward (g), one backward (f)."""
    t = comm.size
    if attn.n_head % t:
        raise ValueError(f"{name}: n_head={attn.n_head} is not divisible by t={t}; every rank must "
                         f"hold whole heads: choose t dividing n_head")
    if sequence_parallel:
        gather_sequence_before(attn, comm, name)
    attn.c_attn = ColumnParallelLinear(attn.c_attn, comm, fused=3, sequence_parallel=sequence_parallel,
                                       gathered=sequence_parallel, label=f"{name}.c_attn")
    attn.n_head = attn.n_head // t
    attn.c_proj = RowParallelLinear(attn.c_proj, comm, sequence_parallel=sequence_parallel, label=f"{name}.c_proj")
    return attn
