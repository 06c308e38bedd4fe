"""The Hugging Face Llama pipelined, ZeRO-sharded and tensor parallel by pipelib, on one rank.

Each function runs on every rank of `group` (None: the default group), builds the same model
from the same seed (`pipelib.hf.llama.build_llama`) and returns this rank's `StepResult`, to be
compared with `llama_reference` by `pipelib.results.check_against_reference`:

- `hf_pipeline_step`: `llama_layers` cut into `schedule.num_stages` stages between decoder
  layers (`pipelib.pipeline.stage.split_into_stages`), each rank's stages run by pipelib's one
  executor (`execute`) under any schedule (GPipe, 1F1B, interleaved, zero bubble...). Who sends
  what: stage s sends the hidden state (B/m, T, C) of each microbatch to stage s+1 and gets
  its gradient back, the same shape; the embedding and the head live on the first and last
  stages, untied, so nothing else crosses.
- `hf_zero_train`: `ZeRO(model, group, stage, optimizer=SGD)` on the whole model, one unit per
  decoder layer plus the embedding, the final norm and the head (FSDP's per-block wrapping);
  each rank runs its B/n rows. Stage 3 gathers a unit's parameters in its module's forward
  pre-hook: the decoder layers are called as modules by `LlamaModel.forward`, so the hooks fire
  inside Hugging Face's own code.
- `hf_tp_step`: `apply_tensor_parallel(model, group, LLAMA_TP_PLAN)`: pipelib's column- and
  row-parallel layers replace q, k, v, o and the MLP's three projections (2 all-reduces forward
  and 2 backward per layer). No head count changes: `LlamaAttention` reads it from q's width.
  The embedding and the head stay replicated: the book's vocabulary-parallel head reuses a
  *tied* embedding's shard, while this Llama's head is untied, and V = 65 does not divide by t;
  norms are replicated, as in Megatron without sequence parallelism.

Introduced in chapter 19.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.hf.llama import (LLAMA_TP_PLAN, build_llama, hf_names, llama_batch, llama_layers, lm_loss)
from pipelib.results import StepResult


def hf_pipeline_step(config, schedule, batch: int, seq_len: int, *, group=None, seed: int = 0,
                     balance="layers") -> StepResult | None:
    """One step of the Llama through pipelib's executor: this rank's stages of `schedule` (a
    `Schedule`, e.g. `schedule_info("1f1b").make(p, m)`). Returns the loss (last stage's rank)
    and this rank's stages' gradients under Hugging Face's names; None on a rank the schedule
    leaves out."""
    from pipelib.pipeline.executor import execute
    from pipelib.pipeline.stage import Stage, split_into_stages

    rank = dist.get_rank(group)
    if rank >= schedule.num_ranks:
        return None
    model = build_llama(config, seed)
    names = hf_names(model)
    modules = split_into_stages(llama_layers(model), schedule.num_stages, balance)
    mine = [Stage(modules[k], k, schedule.num_stages) for k in schedule.stages_of(rank)]
    x, y = llama_batch(config, batch, seq_len, 0, seed)
    loss = execute(schedule, mine, x, y, lm_loss, group)
    grads = {names[id(p)]: p.grad.detach().clone() for st in mine for p in st.module.parameters()}
    return StepResult(None if loss is None else loss.detach(), grads,
                      stats={"stages": list(schedule.stages_of(rank)),
                             "layers": [len(st.layers) for st in mine]})


def zero_units(model) -> list[str]:
    """The modules ZeRO gathers and reduces one at a time: embedding, each decoder layer, norm, head."""
    inner = [f"model.layers.{i}" for i in range(len(model.model.layers))]
    return ["model.embed_tokens", *inner, "model.norm", "lm_head"]


def hf_zero_train(config, stage: int, batch: int, seq_len: int, *, group=None, seed: int = 0,
                  steps: int = 2, lr: float = 0.1) -> StepResult:
    """`steps` steps of SGD with momentum 0.9 (as `llama_reference`) of the Llama under
    pipelib's ZeRO `stage`, this rank's rows of each batch. Returns the first step's loss
    (averaged over the ranks) and averaged gradients, the parameters after the last step
    (gathered whole on every rank), each step's loss and this rank's optimizer-state elements
    (momentum: a ZeRO-1+ rank holds 1/n of them)."""
    from pipelib.data_parallel.zero import ZeRO

    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if batch % n:
        raise ValueError(f"hf_zero_train: batch={batch} does not split over {n} ranks; use a multiple of {n}")
    model = build_llama(config, seed)
    zero = ZeRO(model, group, stage, optimizer=torch.optim.SGD, lr=lr, momentum=0.9,
                units=zero_units(model))
    rows = slice(rank * batch // n, (rank + 1) * batch // n)
    grads, losses = None, []
    for step in range(steps):
        x, y = llama_batch(config, batch, seq_len, step, seed)
        loss = lm_loss(zero(x[rows]).logits, y[rows])
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        losses.append(mean.item() / n)
        if grads is None:
            grads, first = zero.full_gradients(), mean / n
        zero.step()
        zero.zero_grad()
    state = sum(v.numel() for st in zero.optimizer.state.values() for v in st.values()
                if torch.is_tensor(v) and v.dim())
    return StepResult(first if rank == 0 else None, grads, stats={"optimizer_state_numel": state},
                      losses=tuple(losses) if rank == 0 else (), params=zero.full_parameters())


def hf_tp_step(config, batch: int, seq_len: int, *, group=None, seed: int = 0, plan=None) -> StepResult:
    """One step of the Llama split by pipelib's tensor parallelism (`plan`, default
    `LLAMA_TP_PLAN`) over the ranks of `group`; every rank runs the whole batch. Returns the
    loss (rank 0), the gradients put back together under Hugging Face's names
    (`tp_full_gradients`), and this rank's parameter elements (`local_numel`) against the
    whole model's (`numel`)."""
    from pipelib.tensor_parallel.apply import apply_tensor_parallel, tp_full_gradients

    model = build_llama(config, seed)
    numel = sum(p.numel() for p in model.parameters())
    apply_tensor_parallel(model, group, dict(LLAMA_TP_PLAN if plan is None else plan))
    x, y = llama_batch(config, batch, seq_len, 0, seed)
    loss = lm_loss(model(x).logits, y)
    loss.backward()
    grads = tp_full_gradients(model, group)
    local = sum(p.numel() for p in model.parameters())
    return StepResult(loss.detach() if dist.get_rank(group) == 0 else None, grads,
                      stats={"numel": numel, "local_numel": local})
