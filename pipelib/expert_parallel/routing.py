"""Routing: from router logits to which token goes to which expert and slot, and with what weight.

    r = route(logits, k=2, capacity_factor=1.25, drop_policy="position")
    r.experts, r.slots, r.weights     # (S, k): expert, slot in its buffer (-1: dropped), gate
    r.counts, r.dropped, r.aux_loss   # (E,) tokens kept per expert, choices dropped, Switch loss

Top-k softmax routing: probabilities p = softmax(logits) over the E experts, each token picks its
k most probable (k = 1: Switch Transformer, Fedus et al. 2021; k = 2: GShard, Lepikhin et al.
2020, and Mixtral). The gate (the weight its expert's output gets) is p itself for k = 1 (so the
router learns) and the k probabilities renormalised to sum 1 for k > 1 (Mixtral's softmax over
the top-k logits is the same thing). An optional per-expert `bias` changes only which experts
are picked, never the gates: DeepSeek-V3's auxiliary-loss-free balancing (`balance`).

Capacity: with a capacity factor f, each expert has C = max(min_capacity, ceil(f S k / E))
slots (S tokens routed together, k choices each: S k / E is a perfectly even share). An expert
chosen by more tokens keeps C of them, picked by the drop policy (`policies`), and the others'
choices are dropped: their gate is 0 and they send nothing. Without a capacity factor routing is
dropless (MegaBlocks, Gale et al. 2022; torchtitan): every choice is kept, and experts get
uneven counts, which is why the dispatch needs an uneven all-to-all. Slots inside an expert
follow token position whatever the policy, so a buffer lists its tokens in sequence order.

The Switch load-balancing loss (Fedus et al. 2021, eq. 4, for k choices as in Megatron-Core):
E sum_i f_i P_i, f_i the share of the S k choices that picked expert i (before any drop), P_i the
mean probability of expert i; 1 when perfectly even, E when every token picks one expert.

Pure torch, no process group: the same function routes in one process and on every rank.
Chapter 16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipelib.checks import check_int
from pipelib.expert_parallel.balance import load_balancing_loss
from pipelib.expert_parallel.policies import drop_policy_info


@dataclass(frozen=True)
class Routing:
    """Where each of S tokens goes among E experts (module docstring); a step's routing result."""

    experts: torch.Tensor   # (S, k) int64: the expert of each choice, most probable first
    slots: torch.Tensor     # (S, k) int64: slot in that expert's buffer, -1 when dropped
    weights: torch.Tensor   # (S, k) float: combine weight, 0 when dropped (differentiable)
    counts: torch.Tensor    # (E,) int64: choices kept per expert
    demand: torch.Tensor    # (E,) int64: choices made per expert, before any drop
    probs: torch.Tensor     # (S, E): the router's softmax
    capacity: int | None    # slots per expert; None: dropless
    dropped: int            # choices dropped (S k - counts.sum())
    aux_loss: torch.Tensor  # (): the Switch load-balancing loss (differentiable)

    @property
    def num_experts(self) -> int:
        return self.probs.shape[1]

    @property
    def kept(self) -> torch.Tensor:  # (S, k) bool
        return self.slots >= 0

    def dispatch_mask(self) -> torch.Tensor:
        """(S, E, C) bool, GShard's dispatch tensor: token s sits in slot c of expert e. C is the
        capacity, or the largest count when dropless."""
        S, k = self.experts.shape
        C = self.capacity if self.capacity is not None else int(self.counts.max()) if S else 0
        mask = torch.zeros(S, self.num_experts, C, dtype=torch.bool, device=self.probs.device)
        s, j = self.kept.nonzero(as_tuple=True)
        mask[s, self.experts[s, j], self.slots[s, j]] = True
        return mask

    def combine_weights(self) -> torch.Tensor:
        """(S, E, C): the dispatch mask times each kept choice's gate (GShard's combine tensor)."""
        return self.dispatch_mask() * self.gates_by_expert()[:, :, None]

    def gates_by_expert(self) -> torch.Tensor:
        """(S, E): each token's combine weight per expert (0 where not picked or dropped)."""
        out = torch.zeros_like(self.probs)
        return out.scatter_add(1, self.experts, self.weights)

    def order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept choices sorted by (expert, slot): the rows of the experts' buffers laid end to
        end. Returns (token index, choice index), each (counts.sum(),) int64."""
        s, j = self.kept.nonzero(as_tuple=True)
        key = self.experts[s, j] * max(self.experts.shape[0], 1) + self.slots[s, j]
        perm = torch.argsort(key)
        return s[perm], j[perm]


def capacity_of(num_tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int = 0) -> int:
    """Slots per expert: max(min_capacity, ceil(f S k / E)) (rounded to 1e-9 first, so that
    1.1 x 10 is 11, not 12)."""
    return max(min_capacity, math.ceil(round(capacity_factor * num_tokens * k / num_experts, 9)))


def check_routing_args(logits, k, capacity_factor, min_capacity, bias) -> tuple[int, int]:
    """(S, E) of valid arguments; a ValueError naming the bad value and what to pass."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"route: router logits of shape {got}; pass a float tensor (tokens, experts), "
                         f"the (B, T, E) logits flattened to (B*T, E)")
    S, E = logits.shape
    check_int(k, "k", context=f"route over {E} experts", hint="experts each token picks: 1 (Switch) or 2 (GShard)")
    if k > E:
        raise ValueError(f"route: top-k k={k} is more than the number of experts E={E}; pass k <= {E}")
    if capacity_factor is not None and not (isinstance(capacity_factor, (int, float))
                                            and not isinstance(capacity_factor, bool) and capacity_factor > 0):
        raise ValueError(f"route: capacity_factor={capacity_factor!r}; pass a number > 0 (1.0: an even "
                         f"share of S k / E slots per expert), or None for dropless routing")
    check_int(min_capacity, "min_capacity", minimum=0, context="route", hint="a floor on slots per expert")
    if bias is not None and tuple(bias.shape) != (E,):
        raise ValueError(f"route: bias of shape {tuple(bias.shape)}; pass one value per expert, shape ({E},)")
    return S, E


def route(logits: torch.Tensor, k: int = 1, *, capacity_factor: float | None = None, min_capacity: int = 0,
          drop_policy: str = "probability", bias: torch.Tensor | None = None) -> Routing:
    """Route S tokens among E experts from `logits` (S, E) (module docstring). `bias` (E,) shifts
    the selection only (DeepSeek-V3); `capacity_factor=None` is dropless."""
    S, E = check_routing_args(logits, k, capacity_factor, min_capacity, bias)
    policy = drop_policy_info(drop_policy)
    probs = torch.softmax(logits.float(), dim=-1)  # (S, E)
    select = probs.detach() if bias is None else probs.detach() + bias.float()
    experts = torch.topk(select, k, dim=-1).indices  # (S, k), most preferred first
    gates = probs.gather(1, experts)  # (S, k)
    if k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    chosen = torch.zeros(S, E, dtype=torch.bool, device=logits.device).scatter_(1, experts, True)  # (S, E)
    demand = chosen.sum(0)  # (E,)
    capacity = None if capacity_factor is None else capacity_of(S, E, k, capacity_factor, min_capacity)
    keep = chosen
    if capacity is not None:
        score = policy.priority(probs.detach()).masked_fill(~chosen, -math.inf)
        order = torch.sort(score, dim=0, descending=True, stable=True).indices  # (S, E)
        rows = torch.arange(S, device=logits.device)[:, None].expand(S, E).contiguous()
        rank = torch.empty_like(order).scatter_(0, order, rows)
        keep = chosen & (rank < capacity)
    slot_of = keep.long().cumsum(0) - 1  # (S, E): slot by position among the kept
    kept = keep.gather(1, experts)  # (S, k)
    slots = torch.where(kept, slot_of.gather(1, experts), -1)
    counts = keep.sum(0)
    return Routing(experts, slots, gates * kept, counts, demand, probs, capacity,
                   int(S * k - counts.sum()), load_balancing_loss(probs, demand, k))
