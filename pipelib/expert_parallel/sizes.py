"""Parameters, memory and FLOPs per rank of the MoE GPT beside a dense one (pure: no torch).

    s = moe_sizes(cfg, spec, ep=4)
    s.total, s.per_rank, s.active        # parameters: all, held by one ep rank, used per token
    s.forward_flops_per_token            # the dense GPT's plus (k - 1) MLPs and the router

The point of a mixture of experts (Shazeer et al. 2017; Fedus et al. 2021): E experts multiply
the MLP parameters by E, but each token runs only k of them, so the FLOPs per token are those of
a dense model whose MLP is k times wider (plus the router's C E per token). Expert parallelism
then divides the experts' parameters (and their gradients and optimizer state) by ep, while the
rest stays replicated. Counts follow `pipelib.memory` (`num_params`, `gpt_forward_flops`: 2 FLOPs
per multiply-add, the tied head counted once); an expert is the GPT's MLP, C -> hidden -> C,
with biases when the model has them. Bytes per parameter for fp32 Adam: 4 weight + 4 gradient +
8 optimizer state = 16 (`pipelib.memory.model_state_bytes`). Chapter 16.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.memory import gpt_forward_flops, num_params


@dataclass(frozen=True)
class MoESizes:
    """Parameter counts and forward FLOPs per token of one MoE GPT on an ep group."""

    total: int                   # every parameter of the model
    per_rank: int                # held by one ep rank: the replicated part plus E/ep experts per MoE layer
    active: int                  # used by one token: the replicated part plus k experts per MoE layer
    forward_flops_per_token: int

    def state_bytes(self, bytes_per_param: int = 16) -> int:
        """Weights, gradients and optimizer state on one rank (16: fp32 Adam)."""
        return self.per_rank * bytes_per_param


def expert_params(n_embd: int, hidden: int, bias: bool = True) -> int:
    """One expert, C -> hidden -> C: 2 C hidden weights, hidden + C biases."""
    return 2 * n_embd * hidden + (hidden + n_embd if bias else 0)


def moe_sizes(cfg, spec, ep: int = 1, seq: int | None = None) -> MoESizes:
    """`MoESizes` of the GPT `cfg` with `spec`'s MoE layers on an ep group of `ep` ranks."""
    C = cfg.n_embd
    hidden = spec.hidden or 4 * C
    layers = cfg.n_layer if spec.layers is None else len(spec.layers)
    one = expert_params(C, hidden, cfg.bias)
    dense_mlp = expert_params(C, 4 * C, cfg.bias)
    rest = num_params(cfg) - layers * dense_mlp + layers * C * spec.num_experts  # + the routers
    T = seq or cfg.block_size
    dense = gpt_forward_flops(cfg, 1, T) // T
    flops = dense + layers * (spec.k * 2 * 2 * C * hidden - 2 * 2 * C * 4 * C + 2 * C * spec.num_experts)
    return MoESizes(rest + layers * spec.num_experts * one, rest + layers * spec.num_experts // ep * one,
                    rest + layers * spec.k * one, flops)
