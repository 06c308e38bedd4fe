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
from pipelib.planner.layout import Layout
from pipelib.planner.spec import ModelSpec
from pipelib.tensor_parallel.formulas import tp_activation_bytes

BF16 = 2


def stage_params(model: ModelSpec, lay: Layout) -> int:
    """Parameters held by the largest pipeline stage's tp rank: its layers' share, plus the
    embedding on the first stage and the head (a second copy when tied) on the last."""
    layers = model.n_layer // lay.pp
    blocks = layers * (model.layer_split_params() // lay.tp + model.layer_replicated_params())
    embed = model.vocab * model.hidden // lay.tp + model.embedding_params() - model.vocab * model.hidden
    head = model.vocab * model.hidden // lay.tp + 2 * model.hidden
    return blocks + (embed + head if lay.pp == 1 else max(embed, head))


def in_flight(lay: Layout, m: int) -> float:
    """Microbatches whose activations the first stage holds at its peak (Narayanan et al. 2021):
    GPipe all m; 1F1B min(p, m); interleaved p (1 + (p-1)/(p v)) of a chunk's layers."""
    if lay.schedule == "gpipe":
        return m
    if lay.schedule == "1f1b":
        return min(lay.pp, m)
    return lay.pp * (1 + (lay.pp - 1) / (lay.pp * lay.virtual))


def layer_activation_bytes(model: ModelSpec, lay: Layout) -> float:
    """Bytes one layer keeps for one microbatch on one rank (16-bit, Korthikanti et al.): the
    attention scores' 5 a s^2 b terms go with fused attention or selective recomputation; full
    recomputation keeps only the layer's input (sharded under sequence parallelism)."""
    b, s, h, a, t = lay.micro_batch, model.seq_len // lay.cp, model.hidden, model.n_head, lay.tp
    if lay.recompute == "full":
        return 2 * s * b * h / (t if lay.sequence_parallel else 1)
    whole = tp_activation_bytes(b, s, h, a, t, sequence_parallel=lay.sequence_parallel)
    scores = 5 * a * s * s * b / t
    return whole - scores if lay.flash or lay.recompute == "selective" else whole


def memory(model: ModelSpec, lay: Layout, m: int) -> dict:
    states = zero_state_bytes(stage_params(model, lay), lay.dp * lay.cp, lay.zero, True,
                              fp32_grads=lay.fp32_grads)
    layers = model.n_layer // lay.pp
    acts = layers * layer_activation_bytes(model, lay) * in_flight(lay, m)
    if lay.recompute == "full":  # the layer being recomputed, whole, during its backward
        acts += layer_activation_bytes(model, replace(lay, recompute="selective"))
    logits = 4 * lay.micro_batch * model.seq_len // lay.cp * model.vocab / lay.tp  # fp32, last stage
    buffers = 0.0
    if lay.zero == 3:  # two layers gathered whole at a time (the current one and the prefetched)
        buffers = 2 * BF16 * (model.layer_split_params() // lay.tp + model.layer_replicated_params())
    return {"parameters": states.params, "gradients": states.grads, "optimizer": states.optimizer,
            "activations": acts + (logits if lay.pp == 1 else 0), "buffers": buffers}
