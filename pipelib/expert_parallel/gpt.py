"""Mixture of experts in the tiny GPT, applied from outside: the model itself is unaware.

    model = moe_gpt(recipe, MoESpec(num_experts=4, k=2))   # blocks' MLPs replaced by MoE layers
    ep = apply_expert_parallel(model, mesh["ep"], mesh["edp"], mesh["dp"])  # E/P experts a rank
    loss = moe_loss(model, x, y)                            # cross-entropy + alpha x Switch losses
    ep.after_backward(model); opt.step(); ep.after_step()  # expert grads over edp; the bias step

`Recipe(..., experts=MoESpec(...)).build()` is `moe_gpt`: it builds the recipe's dense GPT and
swaps `blocks[i].mlp` for an `MoE` in the layers `MoESpec.layers` names (every block by
default), as Mixtral replaces every MLP and GShard every other one. Everything but the experts
stays replicated over the data-parallel ranks; the experts are split over the ep axis (DESIGN.md
section 7: experts are applied after recomputation and before data parallelism).

A strategy core: plain torch.distributed, groups as arguments. Chapter 16.
"""
from __future__ import annotations

import functools

import torch

from pipelib.applied import Applied
from pipelib.expert_parallel.balance import bias_update
from pipelib.expert_parallel.layer import MoE, MoESpec
from pipelib.model import GPT, GPTConfig


def moe_gpt(recipe, spec: MoESpec) -> torch.nn.Module:
    """The recipe's GPT with MoE layers in place of the MLPs `spec.layers` names (all: None)."""
    if not isinstance(recipe.model, GPTConfig):
        raise ValueError(f"moe_gpt: experts replace a GPT's MLPs; the recipe's model is a "
                         f"{type(recipe.model).__name__}: use a GPTConfig")
    model = GPT(recipe.model, seed=recipe.seed).to(recipe.dtype)
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


def apply_expert_parallel(model, group, expert_data_group=None, data_group=None, *,
                          builtin: bool = False) -> Applied:
    """Keep each MoE layer's experts of this rank of the ep `group` and route across it (in
    place; a group of one rank keeps them all). Returns what it leaves on the rank: each held
    expert parameter's placement (axis "ep", its global expert id), the expert gradients' sum
    over `expert_data_group` (the ranks holding the same experts) divided by the dp size after
    backward (a local expert's gradient already sums its ep group's tokens, through the
    reversed all-to-all), and DeepSeek-V3's bias step on the load summed over `data_group`
    after the optimizer step (where a layer has a bias rate)."""
    import torch.distributed as dist

    ep = dist.get_world_size(group) if group is not None else 1
    if ep > 1:
        for moe in moe_layers(model):
            moe.shard(group, builtin=builtin)
    experts = {n: {"axis": "ep", "expert": int(n.split(".experts.")[1].split(".")[0])}
               for n, _ in model.named_parameters() if ep > 1 and is_expert_param(n)}
    dp = dist.get_world_size(data_group) if data_group is not None else 1
    biased = any(m.spec.bias_rate for m in moe_layers(model))
    return Applied(axis="ep", placements=experts,
                   after_backward=functools.partial(_sync_experts, group=expert_data_group, dp=dp) if experts else None,
                   after_step=functools.partial(update_balance_bias, model, data_group) if biased else None)


def _sync_experts(module, group, dp: int) -> None:
    """`sync_grads` of `module`'s expert parameters over `group` (none when it is one rank)."""
    single = group is None or torch.distributed.get_world_size(group) == 1
    sync_grads([p for n, p in module.named_parameters() if is_expert_param(n)], None if single else group, dp,
               "expert dp grads")


def sync_grads(params, group, dp: int, label: str) -> None:
    """Sum the gradients of `params` over `group` (one flat all-reduce) and divide by dp."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    if group is not None:
        from pipelib.comm.registry import collective_info

        collective_info("all_reduce").run(flat, group, label=label)
    flat /= dp
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


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
