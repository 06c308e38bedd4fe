"""`parallelize(model, mesh, plan)`: every strategy applied from outside, in one fixed order.

    plan = Plan(dp=2, tp=2)                                     # prints, round-trips through JSON
    par = parallelize(recipe.build(), Mesh(plan.topology()), plan)
    loss = par.forward_backward(x, y); par.unshard("grad")      # this rank's share of a step; whole gradients

The model is unaware of parallelism (nanoGPT's GPT). As torchtitan's `parallelize_llama`, this
is the one place that sees the whole mesh; each strategy gets only its own group:

1. pipeline: cut the model into stages between blocks (`pipeline.gpt.gpt_stages`), keep this rank's;
2. tensor (and sequence) parallelism on `mesh["tp"]` (`apply_tensor_parallel`);
3. context parallelism on `mesh["cp"]` (`context_parallel.apply`: ring attention, global
   positions, each rank's columns; gradients averaged over cp before dp reduces them);
4. activation recomputation (`apply_recompute`, no group);
5. data parallelism over `mesh["dp"]`: one `DATA_PARALLEL` entry (DDP's buckets, or ZeRO 1-3
   with its optimizer over this rank's shards; `pipelib.data_parallel.kinds`) wraps each
   module this rank holds. Without a pipeline it reduces after the backward; inside a pipeline
   it reduces each stage's gradients once per step, when the executor says that stage's last
   backward is done (`execute(..., stage_done=)`, torch's REDUCE_GRAD).

Every parameter this rank holds gets a `Placement`, which `unshard` uses to put any layout back
under the monolith's names. Introduced in chapter 15; one-strategy chapters are 1-axis plans.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from pipelib.data_parallel.kinds import DATA_PARALLEL, Owned
from pipelib.recompute.registry import policy_info
from pipelib.topology import DEFAULT_ORDER, Topology


@dataclass(frozen=True)
class Plan:
    """The degrees of every axis and how each strategy is set: small, frozen, printable, JSON."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    data_parallel: str = "ddp"         # a key of DATA_PARALLEL
    bucket_bytes: int = 25 << 20
    sequence_parallel: bool = False
    vocab_parallel: bool = True
    schedule: str = "1f1b"             # a name in pipelib.pipeline.schedules' registry
    microbatches: int = 2
    recompute: str = "none"            # a policy of pipelib.recompute.policies
    order: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self):
        object.__setattr__(self, "order", tuple(self.order))
        self.topology()  # degrees and order checked, errors name the values
        if self.data_parallel not in DATA_PARALLEL:
            raise ValueError(f"Plan: data_parallel={self.data_parallel!r}; use one of {list(DATA_PARALLEL)}")
        if self.cp > 1 and (self.pp > 1 or self.sequence_parallel or not policy_info(self.recompute).keeps_all
                            or not DATA_PARALLEL[self.data_parallel].microbatched):
            raise ValueError(f"Plan: cp={self.cp} composes with dp and tp, not yet with pp={self.pp}, "
                             f"sequence_parallel={self.sequence_parallel}, recompute={self.recompute!r} or "
                             f"data_parallel={self.data_parallel!r} (it must reduce after the backward: 'ddp' "
                             f"or 'zero1'); use those with cp=1")
        if self.pp > 1 and not DATA_PARALLEL[self.data_parallel].microbatched:
            raise ValueError(f"Plan: data_parallel={self.data_parallel!r} with pp={self.pp}: it reduces each "
                             f"gradient as backward produces it, once per microbatch; use 'ddp' or 'zero1' "
                             f"with a pipeline (as Megatron-LM's distributed optimizer and DeepSpeed do)")

    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, order=self.order)

    def check(self, recipe, world_size: int | None = None) -> None:
        """Every check that needs no engine: the plan against the recipe and the cluster."""
        from pipelib.model import GPTConfig
        from pipelib.pipeline.step import resolve_schedule

        if world_size is not None:
            self.topology().check_world(world_size)
        rows = recipe.batch_size // self.dp
        if recipe.batch_size % self.dp or rows % (self.microbatches if self.pp > 1 else 1):
            raise ValueError(f"Plan: batch_size={recipe.batch_size} does not split into dp={self.dp} ranks"
                             + (f" x {self.microbatches} microbatches" if self.pp > 1 else "")
                             + f"; use a multiple of {self.dp * (self.microbatches if self.pp > 1 else 1)}")
        if self.dp > 1 and DATA_PARALLEL[self.data_parallel].shards_optimizer and recipe.dtype != torch.float32:
            raise ValueError(f"Plan: data_parallel={self.data_parallel!r} keeps fp32 flat buffers, but the recipe's "
                             f"dtype is {recipe.dtype}; use Recipe(dtype=torch.float32) or data_parallel='ddp'")
        if (self.tp > 1 or self.pp > 1 or self.cp > 1) and not isinstance(recipe.model, GPTConfig):
            raise ValueError("Plan: tp, pp and cp split the GPT's blocks or its sequence; use a GPTConfig recipe")
        seq_len = recipe.seq_len or getattr(recipe.model, "block_size", 0)
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ValueError(f"Plan: cp={self.cp} cuts each sequence into {2 * self.cp} zigzag chunks, but "
                             f"the recipe's sequences are {seq_len} tokens; use a multiple of {2 * self.cp}")
        stages = resolve_schedule(self.schedule, self.pp, self.microbatches).num_stages if self.pp > 1 else 1
        if self.pp > 1 and recipe.model.n_layer < stages:  # an interleaved schedule cuts 2 stages per rank
            raise ValueError(f"Plan: pp={self.pp} with {self.schedule!r} cuts {stages} stages but the GPT has "
                             f"n_layer={recipe.model.n_layer} blocks; every stage needs one: use n_layer >= {stages}")

    def __str__(self) -> str:
        degrees = " x ".join(f"{a}={getattr(self, a)}" for a in ("dp", "tp", "pp", "cp") if getattr(self, a) > 1)
        extra = [self.data_parallel] if self.dp > 1 else []
        extra += [f"{self.schedule}, m={self.microbatches}"] if self.pp > 1 else []
        extra += ["sequence parallel"] if self.sequence_parallel and self.tp > 1 else []
        extra += [f"recompute {self.recompute}"] if self.recompute != "none" else []
        return f"Plan({degrees or '1 rank'}{': ' + '; '.join(extra) if extra else ''})"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["order"] = list(self.order)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        known = {f.name for f in dataclasses.fields(cls)}
        if set(d) - known:
            raise ValueError(f"Plan.from_dict: unknown keys {sorted(set(d) - known)}; use some of {sorted(known)}")
        return cls(**d)


class Parallel:
    """This rank's part of a parallelized model, and how to run and gather one step."""

    def __init__(self, model, mesh, plan, modules, stages=None, schedule=None):
        self.model, self.mesh, self.plan = model, mesh, plan
        self.modules, self.stages, self.schedule = modules, stages, schedule
        self.reducers: list = []
        self.placements: dict = {}  # {monolith name: pipelib.placement.Placement}

    def parameters(self) -> list[nn.Parameter]:
        seen, out = set(), []
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def make_optimizer(self, optimizer: Callable):
        """What steps this rank's parameters: `optimizer(params)` over them, or the data-parallel
        kind's own optimizers over their shards (ZeRO)."""
        owners = [r for r in self.reducers if hasattr(r, "optimizer_step")]
        return Owned(owners) if owners else optimizer(self.parameters())

    def forward_backward(self, x, y):
        """One step's forward and backward on this rank's rows, gradients reduced over every
        axis; the loss of this rank's rows where it is computed (the last stage), else None."""
        from pipelib.runtime.device import current

        dev = current()
        if self.plan.cp > 1:  # this rank's columns of its rows
            from pipelib.context_parallel.apply import shard_tokens

            x, y = shard_tokens(x, y, self.mesh["cp"])
        if self.stages is not None:
            loss = self._pipeline_step(x, y)
            self._count_gradients(dev)
            return loss
        with dev.compute("F"), dev.memory.saved_activations():  # what autograd keeps, counted
            loss = self._loss(x, y)
        if self.reducers:
            self.reducers[0].backward(loss)
        else:
            with dev.compute("B"):
                loss.backward()
        if self.plan.tp > 1:
            from pipelib.tensor_parallel.apply import sync_sequence_grads

            sync_sequence_grads(self.model)
        if self.plan.cp > 1:  # the mean over the sequence's shards, before dp reduces it
            from pipelib.context_parallel.apply import sync_context_grads

            sync_context_grads(self.parameters(), self.mesh["cp"])
        for r in self.reducers:
            r.finish_gradients()
        self._count_gradients(dev)
        return loss.detach()

    def _count_gradients(self, dev) -> None:
        """The device's memory holds this rank's gradients (ZeRO counts its own shards)."""
        if not any(hasattr(r, "optimizer_step") for r in self.reducers):
            dev.memory.update_gradients(nn.ModuleList(self.modules))

    def _loss(self, x, y):
        if self.plan.tp > 1:
            from pipelib.tensor_parallel.step import tp_forward

            return tp_forward(self.model, x, y)[1]
        from pipelib.recipe import loss_of

        return loss_of(self.model, x, y)

    def _pipeline_step(self, x, y):
        from pipelib.model import cross_entropy
        from pipelib.pipeline.executor import execute
        from pipelib.pipeline.gpt import sum_tied_grads, tied_ranks

        by_stage = dict(zip((st.index for st in self.stages), self.reducers))
        modules = {st.index: st.module for st in self.stages}
        sequence_parallel = getattr(self.model, "tp_sequence_parallel", False)

        def done(k):  # stage k's last backward is in: its gradients are whole on this rank's shard
            if sequence_parallel:  # sum its sequence-parallel parameters' gradients over tp, once
                _sync_sequence_grads(modules[k], self.model.tp_comm)
            if k in by_stage:
                by_stage[k].finish_gradients()  # then data parallelism reduces them (ZeRO: waits)

        loss = execute(self.schedule, self.stages, x, y, self._loss_of_logits(cross_entropy), self.mesh["pp"],
                       stage_done=done if sequence_parallel or by_stage else None)
        first, last = tied_ranks(self.schedule)
        sum_tied_grads(self.model.embed.wte.weight, self.schedule, self.mesh["pp"],
                       self.mesh.tied_group(first, last))
        return None if loss is None else loss.detach()

    def _loss_of_logits(self, loss_fn):
        """The last stage's loss of its logits: under a vocabulary-parallel head (tp > 1) each tp
        rank holds V/t of them, and the cross-entropy is Megatron's, over the tp group."""
        from pipelib.tensor_parallel.vocab import VocabParallelHead, vocab_parallel_cross_entropy

        head = self.model.head.lm_head
        if not isinstance(head, VocabParallelHead):
            return loss_fn
        return lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, self.model.tp_comm, head.start)

    def unshard(self, what: str = "grad") -> dict[str, torch.Tensor]:
        """{monolith name: tensor} of what this rank holds, whole (`pipelib.placement.unshard`:
        split parameters gathered over their axis by `placements`; ZeRO's shards over dp first)."""
        from pipelib.placement import unshard

        held = {id(p) for p in self.parameters()}
        names = {id(p): n for n, p in self.model.named_parameters()}
        local = {}  # ZeRO's: its shards gathered over dp, under the monolith's names
        for r, module in zip(self.reducers, self.modules):
            if hasattr(r, "full"):
                mine = {n: names[id(p)] for n, p in module.named_parameters()}
                local.update({mine[n]: t for n, t in r.full(what).items()})
        for name, p in self.model.named_parameters():
            if id(p) in held and name not in local:
                local[name] = p.detach() if what == "data" else (p.grad if p.grad is not None else torch.zeros_like(p))
        return unshard(local, self.placements, {"tp": self.mesh["tp"]})

    def close(self) -> None:
        for r in self.reducers:
            r.close()


def parallelize(model: nn.Module, mesh, plan: Plan, *, optimizer: Callable | None = None) -> Parallel:
    """Apply `plan`'s strategies to `model` on this rank, in the fixed order of the module
    docstring, each on its own group of `mesh`; return this rank's `Parallel`. `optimizer`
    (params -> torch optimizer) is what a data-parallel kind that shards it builds (ZeRO)."""
    modules, stages, schedule = [model], None, None
    if plan.pp > 1:  # 1. pipeline stages
        from pipelib.pipeline.gpt import gpt_stages
        from pipelib.pipeline.stage import Stage
        from pipelib.pipeline.step import resolve_schedule

        schedule = resolve_schedule(plan.schedule, plan.pp, plan.microbatches)
        cut = gpt_stages(model, schedule.num_stages)
        stages = [Stage(cut[k], k, schedule.num_stages) for k in schedule.stages_of(mesh.local_rank("pp"))]
        modules = [st.module for st in stages]
    if plan.tp > 1:  # 2. tensor (and sequence) parallelism
        from pipelib.tensor_parallel.apply import apply_tensor_parallel
        from pipelib.tensor_parallel.plan import gpt_tp_plan

        apply_tensor_parallel(model, mesh["tp"], gpt_tp_plan(vocab=plan.vocab_parallel,
                                                             sequence_parallel=plan.sequence_parallel))
    if plan.cp > 1:  # 3. context parallelism: ring attention, global positions
        from pipelib.context_parallel.apply import apply_context_parallel

        apply_context_parallel(model, mesh["cp"])
    if plan.recompute != "none":  # 4. recomputation
        from pipelib.recompute.policies import apply_recompute

        for m in modules:
            apply_recompute(m, plan.recompute)
    par = Parallel(model, mesh, plan, modules, stages, schedule)
    par.placements = _placements(model, plan, stages)
    from pipelib.runtime.device import current

    current().memory.track_module(*modules)  # what this rank holds (ZeRO then counts its shards instead)
    if plan.dp > 1:  # 5. data parallelism, last: it wraps what the others made
        kind = DATA_PARALLEL[plan.data_parallel]
        par.reducers = [kind.wrap(m, mesh["dp"], plan, optimizer or torch.optim.Adam) for m in modules]
        current().memory.parameters_moved(*modules)  # ZeRO's flat buffers: a saved weight is no activation
    return par


def _sync_sequence_grads(module: nn.Module, comm) -> None:
    """`sync_sequence_grads` on one pipeline stage's modules (the stage's share of the model)."""
    from pipelib.tensor_parallel.apply import sync_sequence_grads

    module.tp_comm, module.tp_sequence_parallel = comm, True
    sync_sequence_grads(module)


def _placements(model, plan, stages) -> dict:
    from pipelib.placement import placements

    stage_of = {id(p): st.index for st in reversed(stages or ()) for p in st.module.parameters()}
    return placements(model, stage_of=stage_of, tp=plan.tp > 1)
