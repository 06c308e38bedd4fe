"""One entry per drop policy: which tokens an expert keeps when more choose it than it has slots.

    drop_policy_info("probability").priority(probs)   # (S, E): higher is kept first
    drop_policy_info("position").priority(probs)      # (S, E): earlier tokens kept first

When a capacity is set (`pipelib.expert_parallel.routing.route`), an expert chosen by more
tokens than its capacity C keeps C of them and the rest are dropped (their MoE output is zero;
the residual connection carries them on). Production code offers two rules: keep the tokens
with the highest router probability for that expert (Megatron-Core's ``"probs"``, DeepSpeed's
random-token-selection off), or keep the earliest positions (GShard and Switch Transformer:
tokens fill the buffer in sequence order, so the latest ones overflow; Megatron-Core's
``"position"``). Ties keep the earlier position. This module is the only place a policy's name
is compared or mapped: a new policy is one priority function and one entry.

torch is used by the priority functions only (they take and return tensors). Chapter 16.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType


def _by_probability(probs):
    """The router's probability of each (token, expert): the surest tokens stay."""
    return probs


def _by_position(probs):
    """Minus the token's position: the first tokens stay, the latest are dropped."""
    import torch

    pos = torch.arange(probs.shape[0], dtype=probs.dtype, device=probs.device)
    return (-pos)[:, None].expand_as(probs)


@dataclass(frozen=True)
class DropPolicy:
    """A drop policy: `priority(probs (S, E)) -> (S, E)`, higher kept first (ties: earlier)."""

    name: str
    priority: Callable
    rule: str  # the rule in words, for errors and the chapter's tables


POLICIES: MappingProxyType[str, DropPolicy] = MappingProxyType({p.name: p for p in (
    DropPolicy("probability", _by_probability, "keep the tokens with the highest router probability"),
    DropPolicy("position", _by_position, "keep the earliest tokens, drop the latest positions"),
)})


def drop_policy_info(name: str) -> DropPolicy:
    """The drop policy called `name`; a ValueError lists the names."""
    info = POLICIES.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"unknown drop policy {name!r}; use one of {tuple(POLICIES)}")
    return info
