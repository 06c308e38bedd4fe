"""`parallelize(model, mesh, plan)`: every strategy applied from outside, in one fixed order.

    plan = Plan(dp=2, tp=2)                                     # prints, round-trips through JSON
    par = parallelize(recipe.build(), Mesh(plan.topology()), plan)
    loss = par.forward_backward(x, y); par.unshard("grad")      # this rank's share of a step; whole gradients

The model is unaware of parallelism (nanoGPT's GPT). As torchtitan's `parallelize_llama`, this
is the one place that sees the whole mesh; each strategy gets only its own group:

1. pipeline: cut the model into stages between blocks (`pipeline.gpt_stages.gpt_stages`), keep this rank's;
2. tensor (and sequence) parallelism on `mesh["tp"]` (`apply_tensor_parallel`);
3. context parallelism on `mesh["cp"]` (`context_parallel.apply`: ring attention, global
   positions, each rank's columns; gradients averaged over cp before dp reduces them);
4. activation recomputation (`apply_recompute`, no group);
5. experts, where the model has MoE layers (a recipe with `experts`): each ep rank keeps its
   E/ep experts (`expert_parallel.gpt.apply_expert_parallel` on `mesh["ep"]`), their gradients
   summed over the ranks holding the same experts (`mesh["edp"]`), DeepSeek-V3's balance bias
   moved by the load over dp after the optimizer step;
6. data parallelism over `mesh["dp"]` (the experts left to step 5): one `DATA_PARALLEL` entry
   (DDP's buckets, or ZeRO 1-3 with its optimizer over this rank's shards;
   `pipelib.data_parallel.kinds`) wraps each module this rank holds. Without a pipeline it
   reduces after the backward; inside a pipeline it reduces each stage's gradients once per
   step, when the executor says that stage's last backward is done (`execute(..., stage_done=)`,
   torch's REDUCE_GRAD). HSDP (`DataOptions(replicate=r)`): a ZeRO kind shards over
   `mesh["dp_shard"]` and all-reduces across `mesh["dp_replicate"]`.

Every parameter this rank holds gets a `Placement`, which `unshard` uses to put any layout back
under the monolith's names. Introduced in chapter 15; one-strategy chapters are 1-axis plans.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from pipelib.applied import Applied
from pipelib.context_parallel.apply import apply_context_parallel
from pipelib.data_parallel.kinds import apply_data_parallel
from pipelib.expert_parallel.gpt import apply_expert_parallel, moe_layers
from pipelib.pipeline.apply import apply_pipeline
from pipelib.pipeline.gpt_stages import tied_ranks
from pipelib.placement import Placement
from pipelib.plan import Plan
from pipelib.recompute.policies import apply_recompute
from pipelib.runtime.device import current
from pipelib.tensor_parallel.apply import apply_tensor_parallel
from pipelib.tensor_parallel.plan import gpt_tp_plan


class Parallel:
    """This rank's part of a parallelized model, and how to run and gather one step: a loop over
    the records the strategies returned (`pipelib.applied.Applied`), in `parallelize`'s order.
    It knows no strategy by name."""

    def __init__(self, model, mesh, plan, applied: list[Applied]):
        self.model, self.mesh, self.plan, self.applied = model, mesh, plan, applied
        cut = [a.modules for a in applied if a.modules is not None]
        self.modules: list[nn.Module] = cut[-1] if cut else [model]
        self.placements = _placements(model, applied)  # {monolith name: Placement}

    def parameters(self) -> list[nn.Parameter]:
        seen, out = set(), []
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    @property
    def reports_loss(self) -> bool:
        """Whether this rank computes the step's loss (a pipeline's last stage does)."""
        return all(a.reports_loss for a in self.applied)

    def make_optimizer(self, optimizer: Callable):
        """What steps this rank's parameters: the optimizer a strategy owns (ZeRO's, over its
        shards), else `optimizer(params)` over them."""
        owned = [a.optimizer for a in self.applied if a.optimizer is not None]
        return owned[0] if owned else optimizer(self.parameters())

    def forward_backward(self, x, y):
        """One step's forward and backward on this rank's rows, gradients reduced over every
        axis; the loss of this rank's rows where it is computed (the last stage), else None."""
        from pipelib.model import cross_entropy
        from pipelib.recipe import loss_of
        from pipelib.runtime.device import current

        dev = current()
        for a in self.applied:
            if a.shard_batch is not None:  # context parallelism: this rank's columns of its rows
                x, y = a.shard_batch(x, y)
        run = [a.run_step for a in self.applied if a.run_step is not None]
        if run:  # the pipeline runs forward and backward itself
            loss_fn = cross_entropy
            for a in self.applied:
                loss_fn = a.wrap_loss(loss_fn) if a.wrap_loss is not None else loss_fn
            loss = run[0](x, y, loss_fn, self._after_backward)
        else:
            forward = next((a.forward_loss for a in self.applied if a.forward_loss is not None), loss_of)
            with dev.compute("F"), dev.memory.saved_activations():  # what autograd keeps, counted
                loss = forward(self.model, x, y)
            backward = next((a.backward for a in self.applied if a.backward is not None), None)
            if backward is not None:
                backward(loss)
            else:
                with dev.compute("B"):
                    loss.backward()
            self._after_backward(self.model)
            loss = loss.detach()
        if not any(a.optimizer is not None for a in self.applied):  # ZeRO counts its own shards
            dev.memory.update_gradients(nn.ModuleList(self.modules))
        return loss

    def _after_backward(self, module) -> None:
        """`module`'s gradients are complete on this rank: each strategy's sums, in order."""
        for a in self.applied:
            if a.after_backward is not None:
                a.after_backward(module)

    def unshard(self, what: str = "grad") -> dict[str, torch.Tensor]:
        """{monolith name: tensor} of what this rank holds, whole (`pipelib.placement.unshard`:
        split parameters gathered over their axis by `placements`; ZeRO's shards over dp first)."""
        from pipelib.placement import unshard

        held = {id(p) for p in self.parameters()}
        local = {}  # what a strategy keeps off the parameters (ZeRO's shards), gathered
        for a in self.applied:
            if a.whole is not None:
                local.update(a.whole(what))
        for name, p in self.model.named_parameters():
            if id(p) in held and name not in local:
                local[name] = p.detach() if what == "data" else (p.grad if p.grad is not None else torch.zeros_like(p))
        axes = {pl.axis for pl in self.placements.values() if pl.axis is not None}
        return unshard(local, self.placements, {axis: self.mesh[axis] for axis in axes})

    def after_step(self) -> None:
        """What the strategies do after the optimizer step (the experts' balance bias)."""
        for a in self.applied:
            if a.after_step is not None:
                a.after_step()

    def close(self) -> None:
        for a in self.applied:
            if a.close is not None:
                a.close()


def parallelize(model: nn.Module, mesh, plan: Plan, *, optimizer: Callable | None = None) -> Parallel:
    """Apply `plan`'s strategies to `model` on this rank, in the fixed order of the module
    docstring, each on its own group of `mesh`; return this rank's `Parallel`. `optimizer`
    (params -> torch optimizer) is what a data-parallel kind that shards it builds (ZeRO)."""
    applied: list[Applied] = []
    if plan.pp > 1:  # 1. pipeline stages
        schedule = plan.pipeline.schedule_for(plan.pp)
        applied.append(apply_pipeline(model, mesh["pp"], schedule, mesh.tied_group(*tied_ranks(schedule)),
                                      layers=plan.pipeline.layers))
    if plan.tp > 1:  # 2. tensor (and sequence) parallelism
        applied.append(apply_tensor_parallel(model, mesh["tp"], gpt_tp_plan(
            vocab=plan.tensor.vocab_parallel, sequence_parallel=plan.tensor.sequence_parallel)))
    if plan.cp > 1:  # 3. context parallelism: ring attention, global positions
        applied.append(apply_context_parallel(model, mesh["cp"], plan.context.layout))
    modules = applied[0].modules if plan.pp > 1 else [model]
    if plan.recompute != "none":  # 4. recomputation (nothing left on the rank but the model's change)
        for m in modules:
            apply_recompute(m, plan.recompute)
    if moe_layers(model):  # 5. experts: spread over ep, their gradients over edp, the balance bias
        applied.append(apply_expert_parallel(model, mesh["ep"], mesh["edp"], mesh["dp"]))
    dev = current()
    dev.memory.track_module(*modules)  # what this rank holds (ZeRO then counts its shards instead)
    if plan.dp > 1:  # 6. data parallelism, last: it wraps what the others made
        names = {id(p): n for n, p in model.named_parameters()}
        optimizer = optimizer or torch.optim.Adam
        if plan.data.replicate > 1:  # HSDP: shard within dp_shard, all-reduce across dp_replicate
            applied.append(apply_data_parallel(modules, mesh["dp_shard"], plan.data, optimizer, names,
                                               replicate_group=mesh["dp_replicate"]))
        else:
            experts = {n for a in applied for n, f in a.placements.items() if f.get("axis") == "ep"}
            applied.append(apply_data_parallel(modules, mesh["dp"], plan.data, optimizer, names, ignore=experts))
        dev.memory.parameters_moved(*modules)  # ZeRO's flat buffers: a saved weight is no activation
    return Parallel(model, mesh, plan, applied)


def _placements(model, applied) -> dict[str, Placement]:
    """{name: Placement} of every parameter: the fields each strategy set, merged."""
    fields: dict[str, dict] = {name: {} for name, _ in model.named_parameters()}
    for a in applied:
        for name, f in a.placements.items():
            fields[name].update(f)
    return {name: Placement(**f) for name, f in fields.items()}
