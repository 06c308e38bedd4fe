"""The tiny GPT cut into pipeline stages, and its tied embedding/head weight summed.

    stages = gpt_stages(model, 4)                      # 4 nn.Sequential of shared modules
    first, last = tied_ranks(schedule)                 # the two ranks holding the tied weight
    sum_tied_grads(model.embed.wte.weight, schedule, group, embedding_group(schedule))

The cores `pipelib.parallelize` and the chapter runners (`pipelib.pipeline.gpt`) share: the cut
between Transformer blocks (balanced by count as Megatron-LM does, or by parameters or FLOPs:
`gpt_unit_costs`), and the tied weight's two copies, on the rank of stage 0 and the rank of the
last stage, whose gradients are summed after each step (Megatron-LM's "embedding group"; the
module docstring of `pipelib.pipeline.gpt` tells the whole story). Introduced in chapter 12.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from pipelib.comm import collectives
from pipelib.comm import p2p as comms
from pipelib.model import GPT
from pipelib.pipeline.schedules import as_schedule
from pipelib.pipeline.stage import layer_cost, partition
from pipelib.runtime.mesh import Mesh

__all__ = ["gpt_stages", "gpt_unit_costs", "gpt_stage_costs", "tied_ranks", "embedding_group", "sum_tied_grads"]

_TIE_TAG = 7000  # the tied-gradient exchange; apart from execute's tags (2 * stage + kind)


BALANCE_BY = ("params", "flops")


def gpt_unit_costs(model: GPT, by: str = "flops", seq_len: int | None = None) -> list[float]:
    """Cost of [embed, *blocks, head]: parameters (a stage's copy of the tied weight counts on
    both ends), or forward FLOPs of one sequence of `seq_len` tokens (FlopCounterMode)."""
    if by not in BALANCE_BY:
        raise ValueError(f"by={by!r}; use one of {BALANCE_BY}")
    units = [model.embed, *model.blocks, model.head]
    if by == "params":
        return [float(sum(q.numel() for q in u.parameters())) for u in units]
    from torch.utils.flop_counter import FlopCounterMode

    idx = torch.zeros(1, seq_len or model.config.block_size, dtype=torch.long,
                      device=model.embed.wte.weight.device)  # (1, T)
    out, x = [], idx
    with torch.no_grad():
        for u in units:
            with FlopCounterMode(display=False) as fc:
                x = u(x)  # (1, T, C), then (1, T, V)
            out.append(float(fc.get_total_flops()))
    return out


def _block_costs(model: GPT, balance, seq_len=None):
    """(partition's balance, one cost per block): embed folded into block 0, head into the last."""
    if balance not in BALANCE_BY:
        return balance, [layer_cost(b) for b in model.blocks]
    c = gpt_unit_costs(model, balance, seq_len)
    blocks = c[1:-1]
    blocks[0] += c[0]
    blocks[-1] += c[-1]
    return "cost", blocks


def gpt_stage_costs(model: GPT, num_stages: int, balance="layers", by: str = "flops",
                    seq_len: int | None = None) -> list[float]:
    """Per stage of `gpt_stages(model, num_stages, balance)`: its parameters or forward FLOPs."""
    c = gpt_unit_costs(model, by, seq_len)
    bounds = partition(len(model.blocks), num_stages, *_block_costs(model, balance, seq_len))
    return [sum(c[1 + i] for i in r) + (c[0] if k == 0 else 0) + (c[-1] if k == num_stages - 1 else 0)
            for k, r in enumerate(bounds)]


def gpt_stages(model: GPT, num_stages: int, balance="layers") -> list[nn.Sequential]:
    """Cut `model` into `num_stages` `nn.Sequential`s of shared (not copied) modules.

    Stage 0: [embed, its blocks]; last stage: [its blocks, head]; between: blocks only. With a
    single stage: [embed, every block, head]. `balance` splits the blocks as
    `pipelib.pipeline.stage.partition` does ("layers", "cost" or a list of block counts), or
    "params" / "flops" to balance whole stages, embedding and head included (`gpt_unit_costs`).
    """
    blocks = list(model.blocks)
    bounds = partition(len(blocks), num_stages, *_block_costs(model, balance))
    stages = []
    for k, r in enumerate(bounds):
        mods = [model.embed] if k == 0 else []
        mods += blocks[r.start:r.stop]
        mods += [model.head] if k == num_stages - 1 else []
        stages.append(nn.Sequential(*mods))
    return stages


def tied_ranks(schedule) -> tuple[int, int]:
    """(rank of stage 0, rank of the last stage), in the schedule's group: the two copies."""
    s = as_schedule(schedule)
    return s.stage_to_rank[0], s.stage_to_rank[s.num_stages - 1]


def embedding_group(schedule):
    """Megatron-LM's embedding group: the ranks of stage 0 and of the last stage, for a pipeline
    on the first ranks of the world (`Mesh.first(p, "pp").tied_group`; over a whole `Mesh`,
    `mesh.tied_group(first, last)` gives the pair at this rank's coordinates). Made by the mesh,
    once per engine, so call it on EVERY rank of the world, in the same order as any other group.
    Returns None when one rank holds both stages.
    """
    first, last = tied_ranks(schedule)
    return Mesh.first(as_schedule(schedule).num_ranks, "pp").tied_group(first, last)


def sum_tied_grads(weight: nn.Parameter, schedule, group=None, emb_group=None) -> None:
    """Sum `weight.grad` over the rank of stage 0 and the rank of the last stage, in place.

    With `emb_group` (from `embedding_group`), a ring all-reduce on it (`pipelib.comm.collectives`;
    on 2 ranks each sends N = V*C*itemsize bytes); without, each of the two ranks sends its
    (V, C) gradient to the other on `group` and adds what it receives (g_first + g_last on
    both: the same float sum, bit for bit). Other ranks, and a rank holding both, do nothing.
    """
    s = as_schedule(schedule)
    first, last = tied_ranks(s)
    rank = dist.get_rank(group)
    if first == last or rank not in (first, last):
        return
    if weight.grad is None:
        raise RuntimeError(f"rank {rank}: the tied embedding/head weight has no gradient; run the "
                           f"step's backward before sum_tied_grads")
    grad = weight.grad  # (V, C)
    if emb_group is not None:
        collectives.all_reduce(grad, "sum", group=emb_group)
        return
    peer = last if rank == first else first
    other = torch.empty_like(grad)  # (V, C)
    comms.sendrecv(grad, peer, other, peer, group, tag=_TIE_TAG)
    grad.add_(other)
