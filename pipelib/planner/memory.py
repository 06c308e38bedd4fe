"""Bytes per rank of a layout: model states, activations, buffers (the book's formulas).

ZeRO's model states (`data_parallel.zero_formulas.zero_state_bytes`: bf16 weights and
gradients, fp32 gradients if asked, Adam's 12 bytes, sharded over dp x cp), Korthikanti et al.'s
activations under tensor and sequence parallelism (`tensor_parallel.formulas.tp_activation_bytes`,
16-bit), times the microbatches the schedule keeps in flight on the first stage. Pure.
Introduced in chapter 15.
"""
from __future__ import annotations

from dataclasses import replace

from pipelib.data_parallel.zero_formulas import zero_state_bytes
from pipelib.pipeline.schedules.registry import schedule_info
from pipelib.planner.strategy import Strategy
from pipelib.planner.spec import ModelSpec
from pipelib.recompute.registry import REGISTRY as POLICY_REGISTRY
from pipelib.recompute.registry import policy_info
from pipelib.tensor_parallel.formulas import tp_activation_bytes

BF16 = 2
KEEP_ALL = next(n for n, p in POLICY_REGISTRY.items() if p.keeps_all)  # the policy that reruns nothing


def stage_params(model: ModelSpec, lay: Strategy) -> int:
    """Parameters held by the largest pipeline stage's tp rank: its layers' share, plus the
    embedding on the first stage and the head on the last (a tied head is the embedding's
    weight: a second copy only when the two are on different stages)."""
    layers = model.n_layer // lay.pp
    blocks = layers * (model.layer_split_params() // lay.tp + model.layer_replicated_params())
    embed = model.vocab * model.hidden // lay.tp + model.embedding_params() - model.vocab * model.hidden
    head = (model.vocab * model.hidden // lay.tp if not model.tied or lay.pp > 1 else 0) + 2 * model.hidden
    return blocks + (embed + head if lay.pp == 1 else max(embed, head))


def in_flight(lay: Strategy, m: int) -> float:
    """Microbatches of a whole stage's layers whose activations the first stage holds at its
    peak: the schedule's formula (`ScheduleInfo.peak_inflight`, in chunks) over v; 1F1B's
    min(p, m), interleaving's p + (p-1)/v (Narayanan et al. 2021)."""
    if lay.pp == 1:
        return 1
    return schedule_info(lay.schedule).peak_inflight(lay.pp, m, lay.virtual) / lay.virtual


def layer_activation_bytes(model: ModelSpec, lay: Strategy) -> float:
    """Bytes one layer keeps for one microbatch on one rank (16-bit, Korthikanti et al.): the
    attention scores' 5 a s^2 b terms go with fused attention or selective recomputation; full
    recomputation keeps only the layer's input (sharded under sequence parallelism)."""
    b, s, h, a, t = lay.micro_batch, model.seq_len // lay.cp, model.hidden, model.n_head, lay.tp
    policy = policy_info(lay.recompute)
    if policy.fixed_k == 1:  # full: a layer keeps its input
        return 2 * s * b * h / (t if lay.sequence_parallel else 1)
    whole = tp_activation_bytes(b, s, h, a, t, sequence_parallel=lay.sequence_parallel)
    scores = 5 * a * s * s * b / t
    return whole - scores if lay.flash or not policy.keeps_all else whole  # selective: reruns the core


def memory(model: ModelSpec, lay: Strategy, m: int) -> dict:
    states = zero_state_bytes(stage_params(model, lay), lay.dp * lay.cp, lay.zero, True,
                              fp32_grads=lay.fp32_grads)
    layers = model.n_layer // lay.pp
    acts = layers * layer_activation_bytes(model, lay) * in_flight(lay, m)
    if policy_info(lay.recompute).fixed_k == 1:  # the layer being rerun, whole, in its backward
        acts += layer_activation_bytes(model, replace(lay, recompute=KEEP_ALL))
    logits = 4 * lay.micro_batch * model.seq_len // lay.cp * model.vocab / lay.tp  # fp32, last stage
    buffers = 0.0
    if lay.zero == 3:  # two layers gathered whole at a time (the current one and the prefetched)
        buffers = 2 * BF16 * (model.layer_split_params() // lay.tp + model.layer_replicated_params())
    return {"parameters": states.params, "gradients": states.grads, "optimizer": states.optimizer,
            "activations": acts + (logits if lay.pp == 1 else 0), "buffers": buffers}
