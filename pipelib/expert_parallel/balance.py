"""Keeping experts evenly loaded: the Switch auxiliary loss and DeepSeek-V3's bias, side by side.

    load_balancing_loss(probs, demand, k)     # E sum_i f_i P_i: 1 when even, up to E
    bias = bias_update(bias, counts, rate)    # DeepSeek-V3: overloaded experts made less likely
    load_imbalance(counts)                         # max / mean tokens per expert: 1.0 is perfect

A router left alone collapses: the experts picked early get better, so they get picked more
(Shazeer et al. 2017). Two remedies:

- the auxiliary loss (Switch Transformer, Fedus et al. 2021, eq. 4): add alpha E sum_i f_i P_i to
  the training loss, f_i the share of choices that went to expert i, P_i the router's mean
  probability for it. f is counted (no gradient); P carries the gradient that evens the load, at
  the price of a term that pulls against the language-model loss;
- auxiliary-loss-free balancing (DeepSeek-V3, Liu et al. 2024, section 2.1.2): a bias b_i per
  expert is added to the scores for the top-k selection only (never to the gates) and after each
  step moved by the update rate gamma: down for an expert that got more than the mean load, up for
  one that got less. No gradient touches it; on a cluster the counts are the global ones (summed
  over the data-parallel ranks), so every rank moves its copy of b the same way.

torch only, no process group. Chapter 16.
"""
from __future__ import annotations

import torch


def load_balancing_loss(probs: torch.Tensor, demand: torch.Tensor, k: int) -> torch.Tensor:
    """The Switch loss E sum_i f_i P_i, f_i = demand_i / (S k), P_i = mean of probs[:, i]
    (differentiable through `probs`). S = 0 gives 0."""
    S, E = probs.shape
    if S == 0:
        return probs.sum() * 0
    return E * (demand.to(probs.dtype) / (S * k) * probs.mean(0)).sum()


def bias_update(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's update: b_i + rate * sign(mean load - load_i), a new tensor (counts (E,))."""
    if not rate > 0:
        raise ValueError(f"bias_update: rate={rate!r}; pass the bias update speed gamma > 0 "
                         f"(DeepSeek-V3 used 0.001)")
    if tuple(bias.shape) != tuple(counts.shape):
        raise ValueError(f"bias_update: bias of shape {tuple(bias.shape)} and counts of shape "
                         f"{tuple(counts.shape)}; pass one count per expert")
    load = counts.to(bias.dtype)
    return bias + rate * torch.sign(load.mean() - load)


def load_imbalance(counts) -> float:
    """max / mean of the tokens per expert (1.0: perfectly even; E: one expert takes all)."""
    c = torch.as_tensor(counts, dtype=torch.float64)
    mean = float(c.mean()) if c.numel() else 0.0
    return float(c.max()) / mean if mean > 0 else 1.0


def dropped_at(demand, capacity: int) -> int:
    """Choices dropped when experts chosen `demand` (E,) times have `capacity` slots each: the
    sum of max(0, demand_e - C), whatever the drop policy (it decides which, not how many)."""
    return int(sum(max(0, int(d) - capacity) for d in demand))
