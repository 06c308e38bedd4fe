"""How many bytes tensor and sequence parallelism move: closed forms, pure arithmetic.

Megatron-LM (Shoeybi et al. 2019, §3) puts two conjugate operators around every attention and
every MLP: `g` all-reduces the (b, s, h) activations in the forward pass, `f` all-reduces their
gradient in the backward pass. So a Transformer layer costs **2 all-reduces forward and 2
backward**, each of b*s*h elements. A ring all-reduce sends 2 (t-1)/t of the tensor per rank
(chapter 06), so one all-reduce costs, per rank,

    bytes = 2 * b * s * h * (t - 1) / t * itemsize      (itemsize: 4 for fp32, 2 for bf16)

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) replaces every all-reduce with a
reduce-scatter plus an all-gather, (t-1)/t each: the same bytes, and the layer norms and
dropouts between them work on s/t of the sequence.

Seed 003's milestone (12 layers, d = 512, batch 8, seq 512): 24 all-reduces per forward of
8*512*512 = 2 Mi elements, 4 MiB in 16-bit; a ring over t = 2 sends 2 (t-1)/t = 1 x the tensor
per rank, 4 MiB a call and 96 MiB a forward. `tp_milestone` puts it on PCIe 4.0 x16 (32 GB/s a
direction): 96 MiB / beta, plus a latency of 2 (t-1) alpha per call, as a share of the seed's
50 ms forward (chapter 09 prints it); the seed's "about 6%" counts MB and no latency.

What overlap hides (`tp_overlap_hidden`, Korthikanti et al. §6.2): a column-parallel layer's
backward collective of dX runs while its weight gradient is computed, so it hides
min(dW time, collective time) per column layer.

Pure: no torch (DESIGN.md section 2). Introduced in chapter 09.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.checks import check_int, check_ints


def check_tp_sizes(context: str, b, s, h, t, itemsize=4, *, a=None, sequence_parallel: bool = False) -> None:
    """Every size an integer >= 1, and the splits the tensor-parallel step itself refuses: heads
    `a` not divisible by t (each rank holds whole heads, `plan.validate_plan`), a sequence not
    divisible by t under sequence parallelism."""
    check_ints(context, b=b, s=s, h=h, t=t, itemsize=itemsize)
    if a is not None:
        check_int(a, "a", context=context, hint="attention heads")
        if a % t:
            raise ValueError(f"{context}: a={a} heads are not divisible by t={t}; each rank holds whole "
                             f"heads, a / t of them: choose t among "
                             f"{[d for d in range(1, a + 1) if a % d == 0]} or change the heads")
    if sequence_parallel and s % t:
        raise ValueError(f"{context}: sequence parallelism: s={s} is not divisible by t={t}; each rank "
                         f"holds s / t positions: pick a length multiple of {t}")


def tp_all_reduce_bytes(numel: int, t: int, itemsize: int = 4) -> int:
    """Bytes one rank sends in a ring all-reduce of `numel` elements over t ranks, when t divides
    numel: 2 (t-1)/t numel itemsize (`pipelib.comm.alphabeta.expected_bytes` in general)."""
    check_int(t, "t", context="tp_all_reduce_bytes", hint="the tensor-parallel degree")
    check_int(numel, "numel", minimum=0, context="tp_all_reduce_bytes", hint="elements reduced")
    check_int(itemsize, "itemsize", context="tp_all_reduce_bytes", hint="bytes per element")
    if numel % t:
        raise ValueError(f"tp_all_reduce_bytes: numel={numel} is not divisible by t={t}; the closed "
                         f"form 2 (t-1)/t numel needs equal chunks (use alphabeta.expected_bytes)")
    return 2 * (t - 1) * (numel // t) * itemsize


def tp_layer_bytes(b: int, s: int, h: int, t: int, itemsize: int = 4) -> int:
    """Bytes per rank of ONE tensor-parallel all-reduce of a layer's (b, s, h) activations:
    2 b s h (t-1)/t itemsize. Sequence parallelism sends the same as reduce-scatter + all-gather."""
    check_tp_sizes("tp_layer_bytes", b, s, h, t, itemsize)
    return tp_all_reduce_bytes(b * s * h, t, itemsize)


@dataclass(frozen=True)
class TPCounts:
    """Collectives and bytes per rank of one training step of the TP GPT (`tp_step_counts`)."""

    forward_calls: int
    backward_calls: int
    forward_bytes: int
    backward_bytes: int

    @property
    def calls(self) -> int:
        return self.forward_calls + self.backward_calls

    @property
    def bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


def tp_step_counts(n_layer: int, b: int, s: int, h: int, t: int, itemsize: int = 4, *,
                   vocab: bool = True, sequence_parallel: bool = False,
                   sp_grad_numel: int = 0) -> TPCounts:
    """Collectives (calls) and bytes per rank of one forward + backward of pipelib's TP GPT.

    Blocks: 2 forward + 2 backward per layer, (b, s, h) each: an all-reduce, or with sequence
    parallelism an all-gather and a reduce-scatter (twice the calls, the same bytes).
    With the vocabulary-parallel embedding and head (`vocab=True`): the embedding's partial
    sums are reduced forward (all-reduce; SP: reduce-scatter, all-gather backward); the head's
    input gradient is reduced backward (all-reduce; SP: all-gather forward, reduce-scatter
    backward); the cross-entropy all-reduces a max (b s elements) and a (sum of exponentials,
    target logit) pair (2 b s elements), forward only: logits never travel.
    With sequence parallelism, the replicated parameters that saw only a sequence shard (layer
    norms, row-parallel biases, positions: `sp_grad_numel` elements) get their gradients summed
    by one coalesced all-reduce after the backward pass.
    """
    check_tp_sizes("tp_step_counts", b, s, h, t, itemsize, sequence_parallel=sequence_parallel)
    check_int(n_layer, "n_layer", context="tp_step_counts", hint="transformer blocks")
    check_int(sp_grad_numel, "sp_grad_numel", minimum=0, context="tp_step_counts")
    act = tp_layer_bytes(b, s, h, t, itemsize)
    per = 2 if sequence_parallel else 1  # calls per all-reduce's worth of bytes
    fc = bc = 2 * n_layer * per
    fb = bb = 2 * n_layer * act
    if vocab:
        fc += per + 2
        fb += act + tp_all_reduce_bytes(b * s, t, itemsize) + tp_all_reduce_bytes(2 * b * s, t, itemsize)
        bc += per
        bb += act
    if sequence_parallel and sp_grad_numel:
        bc += 1
        bb += tp_all_reduce_bytes(sp_grad_numel, t, itemsize)
    return TPCounts(fc, bc, fb, bb)


@dataclass(frozen=True)
class TPMilestone:
    """Seed 003's TP milestone, computed: the forward's all-reduces and their time on a link."""

    calls: int
    tensor_bytes: int       # b s h itemsize: one activation tensor
    bytes_per_call: int     # per rank, ring all-reduce: 2 (t-1)/t tensor_bytes
    forward_bytes: int      # per rank, the whole forward
    link_seconds: float     # forward's all-reduces on the link, alpha-beta
    share: float            # link_seconds / forward_seconds


def tp_milestone(n_layer: int = 12, h: int = 512, b: int = 8, s: int = 512, t: int = 2, itemsize: int = 2,
              *, alpha: float = 5e-6, beta: float = 32e9, forward_seconds: float = 0.050) -> TPMilestone:
    """Seed 003: '12 layers, d=512, batch 8, seq 512 gives 24 communications of ~4 MB, ~96 MB per
    forward, about 6% of a 50 ms forward over PCIe'. It holds for 16-bit activations (itemsize 2)
    on t = 2 over PCIe 4.0 x16 (32 GB/s per direction, the default `beta`; `alpha` 5 us); pass
    `pipelib.costmodel.LINKS["pcie5"]`'s alpha and beta for PCIe 5. A ring all-reduce of n bytes
    takes 2 (t-1) alpha + 2 (t-1)/t n / beta."""
    calls = 2 * n_layer
    tensor = b * s * h * itemsize
    per_call = tp_layer_bytes(b, s, h, t, itemsize)
    seconds = calls * (2 * (t - 1) * alpha + per_call / beta)
    return TPMilestone(calls, tensor, per_call, calls * per_call, seconds, seconds / forward_seconds)


def tp_activation_bytes(b: int, s: int, h: int, a: int, t: int = 1, *,
                               sequence_parallel: bool = False) -> float:
    """Korthikanti et al. 2022, eqs. 2-4, 16-bit activations: s b h (34 + 5 a s / h) with no
    parallelism; tensor parallelism shards all but 10 s b h (layer-norm inputs, dropout masks
    and the inputs of the f operators): s b h (10 + 24/t + 5 a s / (h t)); sequence
    parallelism shards those too: s b h (34 + 5 a s / h) / t."""
    check_tp_sizes("tp_activation_bytes", b, s, h, t, a=a, sequence_parallel=sequence_parallel)
    if t == 1:
        return s * b * h * (34 + 5 * a * s / h)
    if sequence_parallel:
        return s * b * h * (34 + 5 * a * s / h) / t
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def tp_layer_activation_bytes(b: int, s: int, h: int, a: int, t: int = 1, itemsize: int = 4, *,
                              sequence_parallel: bool = False) -> int:
    """Bytes autograd saves in ONE block of pipelib's TP GPT on one rank (no dropout, written-out
    attention), op by op as `pipelib.memory.gpt_layer_activation_bytes` counts the unsharded one:

      split t ways: q, k, v copies 3 bsh, softmax a b s^2, c_proj input bsh, c_fc output and
      GeLU output 8 bsh;                                                   (12 bsh + a b s^2) / t
      replicated under TP: ln_1 and ln_2 inputs and outputs                 4 bsh
      under TP + SP: the norms' inputs are shards (2 bsh / t); their outputs are not kept, but
      the column-parallel layers keep the all-gathered input               2 bsh (+ 2 bsh / t)
      LayerNorm mean and 1/std, fp32                                        16 b s (/ t under SP)

    Megatron also drops those 2 bsh gathered inputs (it keeps the shard and all-gathers again in
    the backward pass), reaching Korthikanti et al.'s (34 sbh + 5 a s^2 b) / t."""
    check_tp_sizes("tp_layer_activation_bytes", b, s, h, t, itemsize, a=a, sequence_parallel=sequence_parallel)
    bsh, split = b * s * h, 12 * b * s * h + a * b * s * s
    if t == 1 or not sequence_parallel:
        return itemsize * (4 * bsh + split // t) + 16 * b * s
    return itemsize * (2 * bsh + (2 * bsh + split) // t) + 16 * b * s // t


def tp_overlap_hidden(n_layer: int, b: int, s: int, h: int, t: int, *, flops: float, alpha: float,
                      beta: float, itemsize: int = 4, sequence_parallel: bool = False) -> float:
    """Seconds per step that `pipelib.tensor_parallel.overlap` hides on one rank: per layer, each
    column-parallel linear whose input collective is its own (MLP c_fc 4h/t outputs; attention's
    c_attn 3h/t, except under sequence parallelism, where attention gathers its input itself)
    hides min(time of dW = 2 b s h out FLOPs at `flops`, its backward collective of the
    (b, s, h) dX: an all-reduce, or under sequence parallelism a reduce-scatter). Assumes the
    communication lane is free when dX is ready (it is: each layer waits before returning)."""
    from pipelib.comm.alphabeta import predicted_time

    check_int(t, "t", context="tp_overlap_hidden", hint="the tensor-parallel degree")
    check_tp_sizes("tp_overlap_hidden", b, s, h, t, itemsize, sequence_parallel=sequence_parallel)
    check_int(n_layer, "n_layer", context="tp_overlap_hidden", hint="transformer blocks")
    if t == 1:
        return 0.0
    name = "reduce_scatter" if sequence_parallel else "all_reduce"
    comm = predicted_time(name, b * s * h * itemsize, t, alpha, beta)
    outs = [4 * h // t] + ([] if sequence_parallel else [3 * h // t])
    return n_layer * sum(min(2 * b * s * h * out / flops, comm) for out in outs)
