"""Training the MoE GPT with experts over ep and the rest over dp, and its one-process reference.

    results = cluster.run(train_expert_parallel, recipe, spec, dp=4, ep=2)   # a StepResult per rank
    ref = moe_reference(recipe, spec, dp=4)                                   # one process
    check_against_reference(results, ref, shared=True)

On a mesh of dp ranks with ep dividing dp (`Topology(dp=..., ep=...)`: an ep group is a run of
ep consecutive dp ranks), each rank trains on its dp share of the recipe's batch. Its loss is
its rows' cross-entropy plus the Switch losses; backward carries each token's gradient back to
its rank through the reversed all-to-alls, so a local expert's gradient already sums over its
ep group. Then:

- replicated parameters (embeddings, attention, norms, routers): summed over the dp group;
- expert parameters: summed over the expert-data-parallel group, the dp ranks that hold the same
  experts (ep-local rank e of every ep group: dp / ep ranks; none when ep = dp);
- both divided by dp, so the update is the gradient of the mean of the dp ranks' losses.

The reference runs the same dp shards one after the other in one process with all E experts,
each shard's loss divided by dp: routing (and so capacity) is per shard in both. DeepSeek-V3's
bias moves by the load summed over the shards in both. Every step's gradients are returned
(`stats["grads"]`), with the rows each rank sent to each ep peer per layer (`stats["sent"]`)
and the global load per expert (`stats["load"]`).

A strategy core on plain torch.distributed; the mesh's groups come from `pipelib.runtime.mesh`.
Chapter 16.
"""
from __future__ import annotations

import torch

from pipelib.comm.registry import collective_info
from pipelib.expert_parallel.gpt import (
    apply_expert_parallel,
    is_expert_param,
    moe_gpt,
    moe_layers,
    moe_loss,
    sync_grads,
    update_balance_bias,
)
from pipelib.results import StepResult


def expert_data_group(topology, device=None):
    """This rank's expert-data-parallel group (the dp ranks holding the same experts: the mesh's
    "edp"), made in one order on every rank of the world; None when each expert lives on one
    rank (ep = dp) or this rank is off the grid."""
    from pipelib.runtime.mesh import Mesh

    mesh = Mesh(topology, device=device)  # made once per engine: a second mesh makes nothing
    return _edp(mesh)


def _edp(mesh):
    """`mesh["edp"]`, None where there is nothing to sum (ep = dp) or no group (off the grid)."""
    topology = mesh.topology
    return None if topology.ep == topology.dp or not mesh.contains else mesh["edp"]


def _grads(model) -> dict:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def train_expert_parallel(recipe, spec, dp: int, ep: int, *, builtin: bool = False) -> StepResult | None:
    """`recipe.steps` optimizer steps of the MoE GPT on a dp x ep mesh (module docstring); None
    on ranks beyond dp. `builtin`: gloo's all_to_all_single moves the tokens."""
    from pipelib.runtime.mesh import Mesh
    from pipelib.runtime.place import to_rank_device
    from pipelib.topology import Topology

    topology = Topology(dp=dp, ep=ep)
    mesh = Mesh(topology)
    if not mesh.contains:
        return None
    edp = _edp(mesh)
    model = to_rank_device(moe_gpt(recipe, spec))
    apply_expert_parallel(model, mesh["ep"], builtin=builtin)
    opt = recipe.make_optimizer(model.parameters())
    named = list(model.named_parameters())
    replicated = [p for k, p in named if not is_expert_param(k)]
    experts = [p for k, p in named if is_expert_param(k)]
    losses, grads, sent, load = [], [], [], []
    for step in range(recipe.steps):
        opt.zero_grad(set_to_none=False)
        x, y = to_rank_device(recipe.batch(step, mesh.local_rank("dp"), dp))
        loss = moe_loss(model, x, y)
        loss.backward()
        sync_grads(replicated, mesh["dp"], dp, "dp grads")
        sync_grads(experts, edp, dp, "expert dp grads")
        total = loss.detach().clone().reshape(1)
        collective_info("all_reduce").run(total, mesh["dp"], label="loss")
        losses.append(float(total) / dp)
        grads.append(_grads(model))
        sent.append([m.last.sent_rows for m in moe_layers(model)])
        opt.step()
        load.append([c.tolist() for c in update_balance_bias(model, mesh["dp"])])
    first = mesh.global_rank == 0
    params = {k: p.detach().clone() for k, p in named}
    return StepResult(loss=torch.tensor(losses[-1]) if first else None, grads=grads[-1],
                      losses=tuple(losses) if first else (), params=params,
                      stats={"grads": grads, "sent": sent, "load": load})


def moe_reference(recipe, spec, dp: int = 1) -> StepResult:
    """One process, all experts, the dp shards one after the other (module docstring)."""
    model = moe_gpt(recipe, spec)
    opt = recipe.make_optimizer(model.parameters())
    losses, grads, load = [], [], []
    for step in range(recipe.steps):
        opt.zero_grad(set_to_none=False)
        total, demand = 0.0, None
        for d in range(dp):
            x, y = recipe.batch(step, d, dp)
            loss = moe_loss(model, x, y) / dp
            loss.backward()
            total += float(loss.detach())
            if d < dp - 1:
                shard = [m.last.routing.demand.to(torch.int64) for m in moe_layers(model)]
                demand = shard if demand is None else [a + b for a, b in zip(demand, shard)]
        losses.append(total)
        grads.append(_grads(model))
        opt.step()
        load.append([c.tolist() for c in update_balance_bias(model, extra=demand)])
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return StepResult(loss=torch.tensor(losses[-1]), grads=grads[-1], losses=tuple(losses), params=params,
                      stats={"grads": grads, "load": load})
