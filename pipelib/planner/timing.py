"""Seconds of one training step under a layout, itemised by what is exposed (not hidden).

Compute runs at `machine.efficiency` of peak: the hardware FLOPs of the step (the model's, plus
a forward again under full recomputation, plus the attention core again under selective) split
over every device; the pipeline's bubble is `pipeline.simulate.bubble_closed_form` of it. Each
axis's collectives are rings on the link its group spans: inside a node when the group's ranks
(from the axis order, tp innermost) fit in one node, else between nodes. What is exposed:
- tp: every all-reduce (or reduce-scatter + all-gather, the same bytes) of the layers' (b, s, h)
  activations, 4 per layer and microbatch (6 under full recomputation); not overlapped;
- cp: the ring's K/V blocks, beyond the attention they hide behind;
- pp: an activation and a gradient per stage boundary in fill and drain (steady state hides them);
- dp: ZeRO's (or DDP's) bytes per step (`zero_comm_bytes`), beyond the last microbatch's backward.
Pure. Introduced in chapter 15.
"""
from __future__ import annotations

from pipelib.comm.alphabeta import predicted_time
from pipelib.data_parallel.zero_formulas import zero_comm_bytes
from pipelib.pipeline.simulate import bubble_closed_form
from pipelib.planner.strategy import Strategy
from pipelib.planner.memory import BF16, stage_params
from pipelib.planner.spec import Machine, ModelSpec
from pipelib.recompute.registry import policy_info


def link_of(axis: str, lay: Strategy, machine: Machine):
    """The link a group of `axis` spans: its ranks are `stride` apart, `stride` the product of
    the sizes of the axes inside it in `lay.order`; inside a node if they all fit in one."""
    inner = lay.order[lay.order.index(axis) + 1:]
    stride = 1
    for a in inner:
        stride *= getattr(lay, a)
    return machine.device.link if stride * getattr(lay, axis) <= machine.gpus_per_node else machine.inter_node


def ring_seconds(nbytes_per_rank: float, n: int, link, steps: int | None = None) -> float:
    """A ring in which each rank sends `nbytes_per_rank` in `steps` messages (ZeRO's mixes of
    reduce-scatters and all-gathers, given as bytes sent; one collective of a known tensor is
    `comm.alphabeta.predicted_time`)."""
    if n == 1:
        return 0.0
    steps = 2 * (n - 1) if steps is None else steps
    return steps * link.alpha + nbytes_per_rank / link.beta


def hardware_flops_per_token(model: ModelSpec, lay: Strategy) -> float:
    """The model's FLOPs per token plus what recomputation adds: a second forward (2N + 4 L s h)
    under full, the attention core's forward (4 L s h) under selective."""
    policy = policy_info(lay.recompute)
    attention = 4 * model.n_layer * model.seq_len * model.hidden
    if policy.keeps_all:
        return model.model_flops_per_token()
    if policy.fixed_k == 1:  # full: the whole forward again
        return model.model_flops_per_token() + (model.model_flops_per_token() - 3 * attention) / 3 + attention
    return model.model_flops_per_token() + attention  # selective: the attention core again


def step_time(model: ModelSpec, machine: Machine, lay: Strategy, m: int) -> dict:
    """{compute, bubble, tp, cp, pp, dp}: seconds of one optimizer step, exposed."""
    tokens_mb = lay.micro_batch * model.seq_len  # one microbatch of one replica
    per_device = hardware_flops_per_token(model, lay) * tokens_mb / (lay.tp * lay.pp * lay.cp)
    t_mb = per_device / machine.flops  # one microbatch's forward and backward on one stage
    bubble = bubble_closed_form(lay.schedule, lay.pp, m, lay.virtual, relative=True) if lay.pp > 1 else 0.0
    layers = model.n_layer // lay.pp
    act = BF16 * tokens_mb // lay.cp * model.hidden  # one (b, s/cp, h) activation
    tp = 0.0
    if lay.tp > 1:
        calls = (6 if policy_info(lay.recompute).fixed_k == 1 else 4) * layers * m  # full reruns g's
        link = link_of("tp", lay, machine)
        tp = calls * predicted_time("all_reduce", act, lay.tp, link.alpha, link.beta)  # the ring's
    cp = 0.0
    if lay.cp > 1:
        kv = 2 * BF16 * tokens_mb // lay.cp * model.hidden * model.kv_heads // model.n_head // lay.tp
        link = link_of("cp", lay, machine)
        ring = 3 * (lay.cp - 1) * (link.alpha + kv / link.beta)  # forward K, V; backward K, V, dK, dV
        attention = 12 * tokens_mb * model.seq_len // lay.cp * model.hidden / lay.tp / machine.flops
        cp = layers * m * max(0.0, ring - attention)
    pp = 0.0
    if lay.pp > 1:
        link = link_of("pp", lay, machine)
        msg = act / (lay.tp if lay.sequence_parallel else 1)
        pp = 2 * (lay.pp - 1) * (link.alpha + msg / link.beta)
    dp = 0.0
    if lay.dp * lay.cp > 1:
        n = lay.dp * lay.cp
        sent = zero_comm_bytes(stage_params(model, lay), n, lay.zero, True, accumulate=m,
                               fp32_grads=lay.fp32_grads)
        link = link_of("dp", lay, machine) if lay.cp == 1 else machine.inter_node
        dp = max(0.0, ring_seconds(sent, n, link) - t_mb * 2 / 3)
    return {"compute": m * t_mb, "bubble": bubble * m * t_mb, "tp": tp, "cp": cp, "pp": pp, "dp": dp}
