"""The MoE layer: a router and E experts in place of a block's MLP, local or across an ep group.

    spec = MoESpec(num_experts=4, k=2, capacity_factor=1.25)
    moe = MoE(spec, n_embd=64, layer=0, seed=0, n_layer=2)   # all E experts, one process
    moe.shard(group)                                          # keep this ep rank's E/P experts
    y = moe(x)                                                # (B, T, C) -> (B, T, C)
    moe.last                                                  # MoEStats of the last forward

Forward: the (B, T, C) input is flattened to S = B T tokens, the router (a bias-free linear
C -> E) gives logits, `route` decides (`routing`), the kept choices are gathered in expert order
(`Routing.order`), the experts run on their rows (here, or across the ep group: `dispatch`),
and each token's output is the gate-weighted sum of its experts' outputs (dropped choices add
nothing: the block's residual carries the token on). The Switch loss and the counts of the last
forward are kept on the module (`last`) for the training loss and the bias update.

Parameter names are the same in one process and on an ep rank (``experts.<global id>.c_fc``),
so gradients compare by name. Chapter 16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pipelib.checks import check_int
from pipelib.expert_parallel.dispatch import expert_parallel_ffn, run_local
from pipelib.expert_parallel.experts import Expert, expert_range, expert_seed, init_expert
from pipelib.expert_parallel.policies import drop_policy_info
from pipelib.expert_parallel.routing import Routing, check_routing_args, route


@dataclass(frozen=True)
class MoESpec:
    """How each MoE layer routes: E experts, top-k, capacity (None: dropless), drop policy, the
    Switch loss's coefficient, DeepSeek-V3's bias rate (None: no bias), the layers it replaces
    (None: every block) and the experts' hidden width (None: 4 C)."""

    num_experts: int = 4
    k: int = 1
    capacity_factor: float | None = None
    min_capacity: int = 0
    drop_policy: str = "probability"
    aux_coef: float = 0.01
    bias_rate: float | None = None
    layers: tuple[int, ...] | None = None
    hidden: int | None = None

    def __post_init__(self):
        check_int(self.num_experts, "num_experts", context="MoESpec", hint="experts per MoE layer")
        check_routing_args(torch.zeros(1, self.num_experts), self.k, self.capacity_factor, self.min_capacity, None)
        drop_policy_info(self.drop_policy)
        if self.bias_rate is not None and not self.bias_rate > 0:
            raise ValueError(f"MoESpec: bias_rate={self.bias_rate!r}; pass DeepSeek-V3's update speed gamma > 0 "
                             f"(it used 0.001), or None for no bias")
        if not self.aux_coef >= 0:
            raise ValueError(f"MoESpec: aux_coef={self.aux_coef!r}; pass the Switch loss's weight alpha >= 0 "
                             f"(Switch Transformer used 0.01; 0 turns it off)")


@dataclass(frozen=True)
class MoEStats:
    """One MoE forward: its routing, and the rows it sent to each ep rank (none in one process)."""

    routing: Routing
    sent_rows: tuple[int, ...] = ()


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer (module docstring)."""

    def __init__(self, spec: MoESpec, n_embd: int, layer: int, seed: int = 0, n_layer: int = 1,
                 bias: bool = True):
        super().__init__()
        self.spec, self.layer, self.group, self.builtin = spec, layer, None, False
        self.router = nn.Linear(n_embd, spec.num_experts, bias=False)
        init_expert(self.router, expert_seed(seed, layer, -1), n_layer)
        hidden = spec.hidden or 4 * n_embd
        self.experts = nn.ModuleDict()
        for e in range(spec.num_experts):
            self.experts[str(e)] = Expert(n_embd, hidden, bias)
            init_expert(self.experts[str(e)], expert_seed(seed, layer, e), n_layer)
        self.register_buffer("balance_bias", torch.zeros(spec.num_experts))
        self.last: MoEStats | None = None

    def shard(self, group, *, builtin: bool = False) -> MoE:
        """Keep only this ep rank's experts (`expert_range`) and route through `group`;
        `builtin`: gloo's all_to_all_single moves the rows instead of pipelib's."""
        import torch.distributed as dist

        mine = expert_range(self.spec.num_experts, dist.get_world_size(group), dist.get_rank(group))
        for e in range(self.spec.num_experts):
            if e not in mine:
                del self.experts[str(e)]
        self.group, self.builtin = group, builtin
        return self

    @property
    def local_experts(self) -> list[nn.Module]:
        return [self.experts[key] for key in sorted(self.experts, key=int)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        B, T, C = x.shape
        h = x.reshape(B * T, C)  # (S, C)
        spec = self.spec
        r = route(self.router(h), spec.k, capacity_factor=spec.capacity_factor, min_capacity=spec.min_capacity,
                  drop_policy=spec.drop_policy, bias=self.balance_bias if spec.bias_rate else None)
        tokens, choice = r.order()
        rows = h[tokens]  # (N, C), by (expert, slot)
        if self.group is None:
            y, sent = run_local(rows, r.counts, self.local_experts), ()
        else:
            y = expert_parallel_ffn(rows, r.counts, self.local_experts, self.group, builtin=self.builtin,
                                    label=f"moe {self.layer}")
            n = torch.distributed.get_world_size(self.group)
            sent = tuple(int(v) for v in r.counts.view(n, -1).sum(1))
        gate = r.weights[tokens, choice].to(y.dtype)[:, None]  # (N, 1)
        out = torch.zeros_like(h).index_add(0, tokens, y * gate)  # (S, C)
        self.last = MoEStats(r, sent)
        return out.view(B, T, C)
