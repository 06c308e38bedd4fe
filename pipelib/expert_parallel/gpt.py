"""Mixture of experts in the tiny GPT, applied from outside: the model itself is unaware.

    model = moe_gpt(recipe, MoESpec(num_experts=4, k=2))   # blocks' MLPs replaced by MoE layers
    apply_expert_parallel(model, mesh["ep"])               # each ep rank keeps its E/P experts
    loss = moe_loss(model, x, y)                            # cross-entropy + alpha x Switch losses
    update_balance_bias(model, group=mesh["dp"])           # DeepSeek-V3's bias, global counts

`moe_gpt` builds the recipe's dense GPT (`Recipe.build`) and swaps `blocks[i].mlp` for an `MoE`
in the layers `MoESpec.layers` names (every block by default), as Mixtral replaces every MLP and
GShard every other one. Everything but the experts stays replicated over the data-parallel
ranks; the experts are split over the ep axis (DESIGN.md section 7: experts are applied after
recomputation and before data parallelism).

A strategy core: plain torch.distributed, groups as arguments. Chapter 16.
"""
from __future__ import annotations

import torch

from pipelib.expert_parallel.balance import bias_update
from pipelib.expert_parallel.layer import MoE, MoESpec


def moe_gpt(recipe, spec: MoESpec) -> torch.nn.Module:
    """The recipe's GPT with MoE layers in place of the MLPs `spec.layers` names (all: None)."""
    model = recipe.build()
    cfg = model.config
    layers = range(cfg.n_layer) if spec.layers is None else spec.layers
    for i in layers:
        if not 0 <= i < cfg.n_layer:
            raise ValueError(f"moe_gpt: layer {i} is not a block of the {cfg.n_layer}-layer GPT; "
                             f"pass layers in 0..{cfg.n_layer - 1}")
        model.blocks[i].mlp = MoE(spec, cfg.n_embd, i, recipe.seed, cfg.n_layer, cfg.bias).to(recipe.dtype)
    return model


def moe_layers(model) -> list[MoE]:
    """The model's MoE layers, in block order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def is_expert_param(name: str) -> bool:
    """Whether parameter `name` belongs to an expert (split over ep) rather than being replicated."""
    return ".experts." in f".{name}"


def apply_expert_parallel(model, group, *, builtin: bool = False):
    """Keep each MoE layer's experts of this rank of `group` and route across it (in place)."""
    for moe in moe_layers(model):
        moe.shard(group, builtin=builtin)
    return model


def moe_loss(model, x, y) -> torch.Tensor:
    """Cross-entropy plus aux_coef times the sum of the MoE layers' Switch losses."""
    _, ce = model(x, y)
    layers = moe_layers(model)
    aux = sum(m.last.routing.aux_loss for m in layers)
    return ce + (layers[0].spec.aux_coef * aux if layers else 0.0)


@torch.no_grad()
def update_balance_bias(model, group=None, *, extra=None) -> list[torch.Tensor]:
    """DeepSeek-V3's bias step on every MoE layer from the last forward's choices per expert,
    summed over `group` (the dp ranks: every rank moves its copy alike), plus `extra` (a list of
    counts per layer already gathered, the single process's other shards). Returns the counts."""
    loads = []
    for i, moe in enumerate(moe_layers(model)):
        demand = moe.last.routing.demand.to(torch.int64).clone()
        if extra is not None:
            demand += extra[i]
        if group is not None:
            from pipelib.comm.registry import collective_info

            collective_info("all_reduce").run(demand, group, label=f"moe {moe.layer} load")
        if moe.spec.bias_rate:
            moe.balance_bias.copy_(bias_update(moe.balance_bias, demand, moe.spec.bias_rate))
        loads.append(demand)
    return loads
