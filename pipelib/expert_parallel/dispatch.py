"""Dispatch and combine across the ep group: counts first, then two uneven all-to-alls.

    out = expert_parallel_ffn(rows, counts, experts, first, group)   # rows sorted by expert

Who sends what to whom (P ranks in the ep group, E experts, E/P on each; `counts` (E,) the rows
this rank routed to each expert, `rows` sorted by (expert, slot), `Routing.order`):

1. counts: an even all-to-all of the E integers, cut in P runs of E/P: rank r learns how many
   rows each peer sends to each of its experts (8 (P - 1) E/P bytes per rank, int64);
2. dispatch: an uneven all-to-all of the rows, rank r sending rank p the run of its buffer for
   p's experts: sum of counts[p E/P : (p+1) E/P] rows of C values (`pipelib.comm.uneven`);
3. the rows received (by source rank, then expert) are regrouped by expert, each local expert
   runs on its rows, and the results are put back in arrival order;
4. combine: the reverse uneven all-to-all brings every row back to the rank that sent it, in the
   order it was sent, for the gate-weighted sum.

Backward runs the same two all-to-alls with the splits swapped (combine's gradient is a
dispatch, and the other way round): `AllToAll` is the autograd function. Both go through the
collective registry (`collective_info("all_to_all_uneven")`), so its twin, gloo's
`all_to_all_single`, can be swapped in (`builtin=True`). The splits are exchanged just before and
consistent by construction, so the dispatch runs unchecked (``check=False``).

A strategy core: plain torch.distributed, the group an argument. Chapter 16.
"""
from __future__ import annotations

import torch

from pipelib.comm.registry import collective_info


class AllToAll(torch.autograd.Function):
    """An uneven all-to-all whose backward is the reverse all-to-all of the gradients."""

    @staticmethod
    def forward(ctx, x, in_splits, out_splits, group, label, builtin):
        ctx.args = (in_splits, out_splits, group, label, builtin)
        return uneven(x.detach(), in_splits, out_splits, group, label, builtin)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits, group, label, builtin = ctx.args
        return uneven(grad.contiguous(), out_splits, in_splits, group, f"{label} backward", builtin), \
            None, None, None, None, None


def uneven(x, in_splits, out_splits, group, label: str, builtin: bool = False):
    """The registry's uneven all-to-all (pipelib's, or gloo's twin when `builtin`)."""
    info = collective_info("all_to_all_uneven")
    if builtin:
        return info.twin(x, group, input_splits=in_splits, output_splits=out_splits)
    return info.run(x, group, input_splits=in_splits, output_splits=out_splits, check=False, label=label)


def exchange_counts(counts: torch.Tensor, group, label: str = "moe counts") -> torch.Tensor:
    """(P, E/P): received[p, e] = rows ep rank p sends to this rank's local expert e."""
    n = torch.distributed.get_world_size(group)
    got = collective_info("all_to_all").run(counts.to(torch.int64).contiguous(), group, label=label)
    return got.view(n, -1)


def regroup_index(received: torch.Tensor) -> torch.Tensor:
    """Row indices that turn arrival order (source rank, then expert) into expert order
    (expert, then source rank): received (P, E_local) counts."""
    P, El = received.shape
    start = torch.cumsum(received.flatten(), 0) - received.flatten()  # (P*El,) offsets in arrival order
    start = start.view(P, El)
    parts = [torch.arange(int(start[p, e]), int(start[p, e] + received[p, e]), device=received.device)
             for e in range(El) for p in range(P)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=received.device)


def run_local(rows: torch.Tensor, counts, experts) -> torch.Tensor:
    """Each expert of `experts` (a list, in order) on its run of `rows` (counts per expert)."""
    parts = torch.split(rows, [int(c) for c in counts], dim=0)
    outs = [expert(part) for expert, part in zip(experts, parts)]
    return torch.cat(outs, dim=0) if outs else rows


def expert_parallel_ffn(rows: torch.Tensor, counts: torch.Tensor, experts, group, *, builtin: bool = False,
                        label: str = "moe") -> torch.Tensor:
    """The experts' outputs for `rows` (N, C), sorted by global expert, `counts` (E,) per expert;
    `experts` this rank's E/P experts, in order (module docstring: who sends what to whom)."""
    n = torch.distributed.get_world_size(group)
    received = exchange_counts(counts, group, f"{label} counts")  # (P, E/P)
    in_splits = counts.view(n, -1).sum(1).tolist()
    out_splits = received.sum(1).tolist()
    arrived = AllToAll.apply(rows, in_splits, out_splits, group, f"{label} dispatch", builtin)
    index = regroup_index(received)
    y = run_local(arrived[index], received.sum(0), experts)
    back = torch.empty_like(index)
    back[index] = torch.arange(index.numel(), device=index.device)
    return AllToAll.apply(y[back], out_splits, in_splits, group, f"{label} combine", builtin)
