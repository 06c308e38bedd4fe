"""The book's own runs, predicted: pipelib's GPT in fp32 on simulated devices (chapter 15).

A `Strategy` with precision "fp32" is what `pipelib.trainer.run` trains (`to_plan`): fp32
weights, gradients and Adam's two moments (16 bytes a parameter, plus a 4-byte step counter per
tensor), pipelib's written-out attention, activations counted op by op as chapters 03, 09 and
14 count them (`memory.gpt_activation_bytes`, `recompute.registry.predict_policy`,
`tensor_parallel.formulas.tp_layer_activation_bytes`), FLOPs as torch's counter counts the
matmuls (`memory.gpt_forward_flops`, backward twice the forward), Adam's step as the memory
traffic of `zero_formulas.adam_bytes_moved`, and every collective as the ring's alpha-beta time
(2 (N-1) messages per all-reduce, t-1 per tensor-parallel all-reduce half). Nothing is
overlapped: the trainer's "ddp" reduces after the backward. Pure.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from pipelib.data_parallel.zero_formulas import adam_bytes_moved, zero_state_bytes
from pipelib.memory import INDEX_BYTES, gpt_activation_bytes, gpt_forward_flops, gpt_layer_activation_bytes
from pipelib.planner.strategy import Strategy
from pipelib.planner.spec import Machine, ModelSpec
from pipelib.recompute.registry import policy_info

F32 = 4
TRAINER_KINDS = ("ddp", "zero1", "zero2", "zero3")  # the trainer's data-parallel kind for ZeRO stages 0-3


def gpt_config(model: ModelSpec, n_layer: int | None = None):
    """The duck-typed `GPTConfig` the book's formulas read (pipelib's GPT: tied, learned positions)."""
    return SimpleNamespace(n_embd=model.hidden, n_head=model.n_head, vocab_size=model.vocab,
                           block_size=model.seq_len, n_layer=model.n_layer if n_layer is None else n_layer,
                           dropout=0.0, flash=False)


def to_plan(lay: Strategy, m: int):
    """The `pipelib.plan.Plan` the trainer runs for this layout (m microbatches a step)."""
    from pipelib.plan import PipelineOptions, Plan, TensorOptions

    return Plan(dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp, recompute=lay.recompute, order=lay.order,
                data=TRAINER_KINDS[lay.zero],
                pipeline=PipelineOptions(lay.schedule, microbatches=m if lay.pp > 1 else 2,
                                         virtual=lay.virtual if lay.virtual > 1 else None),
                tensor=TensorOptions(sequence_parallel=lay.sequence_parallel and lay.tp > 1))


def num_tensors(model: ModelSpec, lay: Strategy) -> int:
    """Parameter tensors on the largest stage: 12 a block, the embeddings, ln_f's two."""
    layers = model.n_layer // lay.pp
    return 12 * layers + (2 if lay.pp == 1 else 0) + 2 + 2


def book_memory(model: ModelSpec, lay: Strategy, m: int) -> dict:
    """Bytes the fullest rank holds at its peak, itemised (a pipeline: every rank's, the largest)."""
    from pipelib.planner.memory import stage_params
    from pipelib.recompute.registry import predict_policy
    from pipelib.tensor_parallel.formulas import tp_layer_activation_bytes

    if not policy_info(lay.recompute).keeps_all and (lay.pp > 1 or lay.tp > 1):
        raise ValueError(f"book accounting: recompute={lay.recompute!r} with tp={lay.tp}, pp={lay.pp}; its "
                         f"activations are counted (and checked against a run) with dp alone: use tp = pp = 1, "
                         f"or the megatron accounting")
    if lay.pp > 1:
        return max(pipeline_rank_memory(model, lay, m), key=lambda d: sum(d.values()))
    psi = stage_params(model, lay)
    states = zero_state_bytes(psi, lay.dp, lay.zero, False)
    opt = states.optimizer + 4 * num_tensors(model, lay)
    b, s, h, a, t = lay.micro_batch, model.seq_len, model.hidden, model.n_head, lay.tp
    layers = model.n_layer
    cfg = gpt_config(model, layers)
    if lay.tp == 1:
        acts = predict_policy(cfg, b, s, lay.recompute).peak_bytes
    else:  # tensor parallel: blocks as chapter 09 counts them, the vocabulary-parallel head
        blocks = layers * tp_layer_activation_bytes(b, s, h, a, t, F32, sequence_parallel=lay.sequence_parallel)
        outside = gpt_activation_bytes(cfg, b, s, F32) - layers * gpt_layer_activation_bytes(cfg, b, s, F32)
        logits = F32 * b * s * model.vocab
        acts = blocks + outside - logits + logits // t
    # ZeRO-3 gathers a unit's whole parameters before its module runs and frees them after
    # (no prefetch in the trainer): at the peak, one block's are whole beside the shards
    gathered = F32 * (model.layer_split_params() // t + model.layer_replicated_params()) if lay.zero == 3 else 0
    return {"parameters": states.params, "gradients": states.grads, "optimizer": opt,
            "activations": acts, "buffers": gathered}


def stage_microbatch_bytes(model: ModelSpec, lay: Strategy, stage: int, num_stages: int) -> int:
    """Bytes one microbatch leaves saved on pipeline stage `stage` of `num_stages`: its blocks
    (chapter 03's count, chapter 09's under tp), the token and position indices on the first
    stage, ln_f and the loss (its log-softmax over the vocabulary, V/t under tp) on the last."""
    from pipelib.tensor_parallel.formulas import tp_layer_activation_bytes

    b, s, h, a, t = lay.micro_batch, model.seq_len, model.hidden, model.n_head, lay.tp
    layers = model.n_layer // num_stages
    cfg = gpt_config(model, layers)
    layer = (gpt_layer_activation_bytes(cfg, b, s, F32) if t == 1 else
             tp_layer_activation_bytes(b, s, h, a, t, F32, sequence_parallel=lay.sequence_parallel))
    out = layers * layer
    indices = INDEX_BYTES * (b * s + s)
    if stage == 0:
        out += indices
    if stage == num_stages - 1:  # what a 0-layer GPT saves, less its embedding's indices
        logits = F32 * b * s * model.vocab
        out += gpt_activation_bytes(gpt_config(model, 0), b, s, F32) - indices - logits + logits // t
    return out


def pipeline_rank_params(model: ModelSpec, lay: Strategy, m: int) -> list[int]:
    """Parameters each pipeline rank holds (one tp shard): its stages' blocks, the embedding and
    the learned positions on the first stage, ln_f and the tied head's copy on the last. ZeRO
    over dp sends (N-1)/N of them twice a step at stage 1 (`zero_comm_bytes`): chapter 15's
    dp bytes of its 2 x 2 x 2 run."""
    from pipelib.pipeline.schedules.registry import make_schedule

    sched = make_schedule(lay.schedule, lay.pp, m, lay.virtual if lay.virtual > 1 else None)
    n, t, h, v = sched.num_stages, lay.tp, model.hidden, model.vocab
    block = model.layer_split_params() // t + model.layer_replicated_params()
    out = []
    for r in range(sched.num_ranks):
        psi = 0
        for k in sched.stages_of(r):
            psi += model.n_layer // n * block + (v * h // t + model.seq_len * h if k == 0 else 0)
            psi += v * h // t + 2 * h if k == n - 1 else 0
        out.append(psi)
    return out


def pipeline_rank_memory(model: ModelSpec, lay: Strategy, m: int) -> list[dict]:
    """Every pipeline rank's bytes at its peak, itemised: its stages' parameters (the embedding on
    the first, ln_f and the tied head's copy on the last), Adam's state, and the activations
    its schedule keeps, replayed from the schedule's own actions (a forward saves its stage's
    microbatch, the backward that ends it frees it): GPipe's last rank holds m microbatches
    of the loss's log-softmax, 1F1B's one."""
    from pipelib.pipeline.schedules.ir import Op
    from pipelib.pipeline.schedules.registry import make_schedule

    sched = make_schedule(lay.schedule, lay.pp, m, lay.virtual if lay.virtual > 1 else None)
    n = sched.num_stages
    per_mb = [stage_microbatch_bytes(model, lay, k, n) for k in range(n)]
    params = pipeline_rank_params(model, lay, m)
    out = []
    for r in range(sched.num_ranks):
        psi, tensors = params[r], sum(12 * (model.n_layer // n) + (2 if k == 0 else 0) + (3 if k == n - 1 else 0)
                                      for k in sched.stages_of(r))
        held = peak = 0
        for act in sched.actions[r]:
            held += per_mb[act.stage] if act.op == Op.F else -per_mb[act.stage] if act.op in (Op.B, Op.W) else 0
            peak = max(peak, held)
        states = zero_state_bytes(psi, lay.dp, lay.zero, False)
        out.append({"parameters": states.params, "gradients": states.grads,
                    "optimizer": states.optimizer + 4 * tensors, "activations": peak, "buffers": 0})
    return out


def book_step_time(model: ModelSpec, machine: Machine, lay: Strategy, m: int) -> dict:
    from pipelib.planner.memory import stage_params
    from pipelib.planner.timing import link_of, ring_seconds
    from pipelib.tensor_parallel.formulas import tp_step_counts

    dev, b, s, t = machine.device, lay.micro_batch, model.seq_len, lay.tp
    layers = model.n_layer // lay.pp
    cfg = gpt_config(model, layers)
    head = 2 * b * s * model.hidden * model.vocab
    blocks = gpt_forward_flops(cfg, b, s) - head
    policy = policy_info(lay.recompute)
    core = 4 * b * s * s * model.hidden * layers  # the attention core's two T x T products, every layer
    # full: the blocks' forward again; selective: the core's products again (Korthikanti et al. 2022)
    extra = blocks if policy.fixed_k == 1 else 0 if policy.keeps_all else core
    stage = (3 * blocks + extra) / t / machine.flops  # one microbatch's F + B on a stage of blocks
    last = stage + 3 * head / t / machine.flops        # the last stage also runs the head
    # a pipeline: the first microbatch through every stage, then the others at the slowest's pace
    compute = (lay.pp - 1) * stage + last + (m - 1) * last if lay.pp > 1 else last
    psi = stage_params(model, lay)
    optimizer = adam_bytes_moved(psi // (lay.dp if lay.zero else 1)) / dev.mem_bandwidth
    tp = 0.0
    if t > 1:
        # a pipeline runs a stage's collectives once per microbatch, and they lengthen every
        # stage time on its critical path: the m microbatches and the p - 1 of fill and drain
        rows, times = (b, m + lay.pp - 1) if lay.pp > 1 else (b * m, 1)
        c = tp_step_counts(layers, rows, s, model.hidden, t, F32, vocab=True)
        link = link_of("tp", lay, machine)
        tp = times * ((c.forward_calls + c.backward_calls) * 2 * (t - 1) * link.alpha
                      + (c.forward_bytes + c.backward_bytes) / link.beta)
    pp = 0.0
    if lay.pp > 1:
        link = link_of("pp", lay, machine)
        pp = 2 * (lay.pp - 1) * link.time(F32 * b * s * model.hidden)
    dp = 0.0
    if lay.dp > 1:
        n, link = lay.dp, link_of("dp", lay, machine)
        units = 1 if lay.zero == 0 else layers + 2
        per_elem = {0: 2, 1: 2, 2: 2, 3: 3}[lay.zero] * F32
        dp = ring_seconds(per_elem * psi * (n - 1) / n, n, link, 2 * (n - 1) * units * (1.5 if lay.zero == 3 else 1))
    return {"compute": compute, "optimizer": optimizer, "tp": tp, "pp": pp, "dp": dp}


def profile_for(model: ModelSpec, machine: Machine, lay: Strategy, global_batch: int, *, compute: float,
                dp: float, name: str = "sized GPU"):
    """A `DeviceProfile` on which `lay`'s step of the book's run lasts `compute` seconds of
    compute and `dp` seconds of data-parallel all-reduce (no overlap, one bucket), with
    `machine.device`'s link latency and memory, and a memory bandwidth that makes Adam's step
    negligible: seed 003's "10 ms of compute against 8 ms of communication", on simulated devices."""
    from dataclasses import replace

    from pipelib.costmodel import Link
    from pipelib.planner.memory import stage_params
    from pipelib.planner.strategy import check_strategy

    m = check_strategy(model, lay.n_devices, global_batch, lay)
    if lay.dp < 2 or lay.tp * lay.pp * lay.cp != 1 or lay.zero:
        raise ValueError(f"profile_for sizes a DDP step: use dp > 1 alone with zero=0, not {lay}")
    dev, n = machine.device, lay.dp
    now = book_step_time(model, machine, lay, m)["compute"]
    latency = 2 * (n - 1) * dev.link.alpha
    if dp <= latency:
        raise ValueError(f"profile_for: dp={dp} s is within the ring's latency {latency} s; ask for more")
    sent = 2 * F32 * stage_params(model, lay) * (n - 1) / n
    link = Link(f"{name} link", dev.link.alpha, sent / (dp - latency))
    return replace(dev, name=name, flops=dev.flops * now / compute, mem_bandwidth=1e18, link=link,
                   source=f"sized for {compute * 1e3:g} ms of compute and {dp * 1e3:g} ms of all-reduce")


def scale_model_profile(real, real_batch: int, stand_in, batch: int, device, link, mfu: float):
    """A simulated GPU on which the GPT `stand_in` (a `GPTConfig`, `batch` sequences a rank) steps
    exactly like the GPT `real` (`real_batch` sequences a rank) on `device` at `mfu` of its peak
    over `link`, every time multiplied by k = psi(stand_in) / psi(real): FLOP/s sized so the
    compute lasts k times the real one, the link's bandwidth kept and its latency times k, so a
    bucket of k times the real bytes (`bucket_bytes * k`) lasts k times as long. Ratios, and so
    DDP's scaling efficiency, are the real model's, measured on a model a laptop runs (seed 003's
    "70-85% at 4 GPUs over PCIe", chapter 15). Returns (profile, k)."""
    from dataclasses import replace

    from pipelib.costmodel import Link, get_profile
    from pipelib.memory import gpt_param_shapes, gpt_train_flops

    def psi(cfg):
        return sum(math.prod(s) for s in gpt_param_shapes(cfg).values())

    dev = get_profile(device)
    if not 0 < mfu <= 1:
        raise ValueError(f"scale_model_profile: mfu={mfu!r}; pass the share of peak FLOP/s reached, in (0, 1]")
    k = psi(stand_in) / psi(real)
    real_compute = gpt_train_flops(real, real_batch, real.block_size) / (dev.flops * mfu)
    flops = gpt_train_flops(stand_in, batch, stand_in.block_size) / (k * real_compute)
    scaled = Link(f"{link.name} x{k:.2g}", link.alpha * k, link.beta)
    return replace(dev, name=f"scaled {dev.name}", flops=flops, link=scaled,
                   source=f"a {psi(real) / 1e6:.0f}M GPT on {dev.name} at {mfu:.0%} of peak over {link.name}, "
                          f"every time x{k:.3g}"), k
