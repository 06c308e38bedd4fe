"""The experts: E feed-forward networks, and which of them each rank of the ep group holds.

    expert_range(8, ep_size=4, ep_rank=1)    # range(2, 4): experts 2 and 3 live on ep rank 1
    Expert(C=64, hidden=256)                 # C -> hidden -> C with GELU, the GPT's MLP shape

Each expert is the tiny GPT's feed-forward network (`pipelib.model.FeedForward`'s shape, Switch
Transformer's choice), initialised from a generator seeded by (seed, layer, expert id), so
expert e has the same weights whether it lives in one process beside all the others or alone
on an ep rank. Experts are placed in contiguous runs: ep rank r of P holds experts
[r E/P, (r+1) E/P), as Megatron-Core and DeepSpeed-MoE place them, so the tokens a rank sends to
one peer are one contiguous run of its expert-sorted buffer.

torch, no process group. Chapter 16.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from pipelib.checks import check_int


def expert_range(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """Global ids of the experts ep rank `ep_rank` of `ep_size` holds; a ValueError unless
    ep_size divides num_experts."""
    check_int(num_experts, "num_experts", context="expert_range", hint="experts per MoE layer")
    check_int(ep_size, "ep_size", context="expert_range", hint="ranks the experts are spread over")
    if num_experts % ep_size:
        raise ValueError(f"experts not divisible by the ep size: num_experts={num_experts}, ep={ep_size}; "
                         f"every ep rank holds num_experts / ep experts, so pass an ep that divides "
                         f"{num_experts} or a multiple of {ep_size} experts")
    if not 0 <= ep_rank < ep_size:
        raise ValueError(f"expert_range: ep_rank={ep_rank} is outside the ep group of {ep_size} ranks")
    per = num_experts // ep_size
    return range(ep_rank * per, (ep_rank + 1) * per)


class Expert(nn.Module):
    """One expert: C -> hidden -> C with GELU (the GPT's MLP)."""

    def __init__(self, n_embd: int, hidden: int, bias: bool = True):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, hidden, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C)
        return self.c_proj(self.gelu(self.c_fc(x)))  # (N, C)


def expert_seed(seed: int, layer: int, expert: int) -> int:
    """The generator seed of expert `expert` of MoE layer `layer` (-1: the router)."""
    return (seed * 1_000_003 + layer * 10_007 + expert + 1) % (2**63 - 1)


@torch.no_grad()
def init_expert(module: nn.Module, seed: int, n_layer: int) -> None:
    """GPT-2's init from one seeded generator: N(0, 0.02) weights, c_proj scaled by
    1/sqrt(2 n_layer) (`pipelib.model.GPT.reset_parameters`), zero biases."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * std)
        else:
            p.zero_()
