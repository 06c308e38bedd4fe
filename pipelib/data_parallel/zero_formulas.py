"""ZeRO's memory and communication per rank, as formulas: pure arithmetic, no torch.

Rajbhandari et al. 2020 (ZeRO), section 5: with psi parameters, N data-parallel ranks and
mixed-precision Adam (16-bit parameters and gradients, K = 12 bytes of fp32 master weights and
two moments per parameter), one rank holds

    stage 0 (plain data parallelism)  2 psi + 2 psi + K psi        = 16 psi
    stage 1 (optimizer state sharded) 2 psi + 2 psi + K psi / N    =  4 psi + 12 psi / N
    stage 2 (gradients too)           2 psi + (2 + K) psi / N      =  2 psi + 14 psi / N
    stage 3 (parameters too)          (2 + 2 + K) psi / N          = 16 psi / N

In fp32 (no master copy: the optimizer updates the parameters themselves) the parameter and
gradient bytes are 4 and K = 8 (two moments); the total is 16 psi again, split 4 + 4 + 8.

The paper's 16 assumes fp16 gradients. Common bf16 practice keeps the gradients in fp32
(Megatron's `main_grad`, FSDP2's `MixedPrecisionPolicy(reduce_dtype=torch.float32)`): 2 + 4 + 12
= 18 bytes per parameter, and 6 + 12/N with the optimizer state sharded (Megatron Core's
distributed optimizer: "6 + 12/d"); `fp32_grads=True` counts that.

pipelib's ZeRO (`pipelib.data_parallel.zero`) keeps each layer's parameters as one flat buffer
padded to a multiple of N, so N equal shards exist: every formula holds *exactly* with psi
replaced by the padded count `padded_numel` (at most N - 1 extra elements per layer), plus
torch's Adam `step` counter, one fp32 scalar per tensor it updates (one per layer: 4 bytes each).

Communication per rank per optimizer step (bytes sent, ring collectives, p and g bytes per
parameter and gradient element, k micro-batches of gradient accumulation):

    stage 0 (DDP with no_sync)  2 (N-1)/N psi g           all-reduce once, at the step
    stage 1                     (N-1)/N psi (g + p)       reduce-scatter at the step + all-gather
    stage 2                     (N-1)/N psi (k g + p)     a reduce-scatter after every backward
    stage 3                     (N-1)/N psi k (2 p + g)   gathers and reduce-scatter per micro-batch
    stage 3, no reshard         (N-1)/N psi k (p + g)     reshard_after_forward=False

With k = 1 and p = g: 2, 2, 2 and 3 (N-1)/N psi p, stage 3's 1.5x (ZeRO section 7.2). With k > 1
stages 2 and 3 send more, because they keep no full gradient to accumulate into: DeepSpeed's
maintainers say so ("for zero stage 2 (and 3), gradient reduction is required after every
backward because of gradient partitioning", deepspeedai/DeepSpeed#2252). FSDP2 can keep the
unsharded gradients across micro-batches instead (`set_requires_gradient_sync(False)`), paying
stage 1's memory for them.

The optimizer step reads and writes every element it updates: Adam reads the parameter, its
gradient and two moments and writes the parameter and the moments, 28 bytes per fp32 element
(`adam_bytes_moved`, plus the 16-bit copy it writes in mixed precision): memory-bound, and N
times less per rank from stage 1 on, since each rank updates psi / N elements.

`zero3_times` is ZeRO-3's step against stage 0 on a simulated device (alpha-beta link, roofline
compute) for an MLP of Linear layers, one unit per layer: the time ZeRO-3 adds, what prefetching
and `reshard_after_forward=False` take off again. Chapter 08 checks it against the virtual clock.

Introduced in chapter 08.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipelib.checks import check_int, check_number
from pipelib.memory import ModelStateBytes

STAGES = (0, 1, 2, 3)
ADAM_STEP_BYTES = 4  # torch's Adam keeps `step` as one fp32 scalar tensor per parameter tensor


def check_stage(stage, context: str = "ZeRO") -> int:
    """Return `stage` if it is 0, 1, 2 or 3, else raise a ValueError saying what each means."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"{context}: stage={stage!r} is not a ZeRO stage; use 0 (plain data parallel), "
                         f"1 (shard optimizer state), 2 (and gradients) or 3 (and parameters)")
    return int(stage)


def element_bytes(mixed_precision: bool, fp32_grads: bool = False) -> tuple[int, int, int]:
    """(parameter bytes, gradient bytes, K optimizer bytes) per parameter: the paper's 2 + 2 + 12
    in mixed precision, 2 + 4 + 12 with fp32 gradients (bf16 practice), 4 + 4 + 8 in fp32."""
    if not mixed_precision:
        return 4, 4, 8
    return (2, 4, 12) if fp32_grads else (2, 2, 12)


def adam_bytes_moved(numel: int, mixed_precision: bool = False) -> int:
    """Memory traffic of one Adam step over `numel` elements: 28 bytes each (reads p, g, m, v,
    writes p, m, v in fp32), plus 2 in mixed precision (the 16-bit copy of the master weight)."""
    check_int(numel, "numel", minimum=0, context="adam_bytes_moved", hint="elements the optimizer updates")
    return (30 if mixed_precision else 28) * numel


def padded_numel(unit_sizes, world_size: int) -> int:
    """Elements once every unit (layer) is padded to a multiple of `world_size`."""
    check_int(world_size, "world_size", context="padded_numel", hint="ranks the units are sharded over")
    for u in unit_sizes:
        check_int(u, "a unit size", minimum=0, context="padded_numel", hint="elements of one unit (layer)")
    return sum(-(-u // world_size) * world_size for u in unit_sizes)


def check_model_size(context: str, psi, world_size) -> None:
    """`psi` an integer >= 0 (elements), `world_size` an integer >= 1 (ranks)."""
    check_int(psi, "psi", minimum=0, context=context, hint="the model's parameter elements")
    check_int(world_size, "world_size", context=context, hint="ranks of the data-parallel group")


def zero_state_bytes(psi: int, world_size: int, stage: int, mixed_precision: bool = True,
                     num_tensors: int = 0, fp32_grads: bool = False) -> ModelStateBytes:
    """Bytes of parameters, gradients and optimizer state on one rank (section 5 of the paper).

    `psi` should divide by `world_size` (pass `padded_numel` for pipelib's padded layout);
    `num_tensors` adds Adam's fp32 step counters (4 bytes per tensor the optimizer updates);
    `fp32_grads` keeps the gradients in fp32 under mixed precision (18 bytes at stage 0)."""
    check_stage(stage, "zero_state_bytes")
    check_model_size("zero_state_bytes", psi, world_size)
    check_int(num_tensors, "num_tensors", minimum=0, context="zero_state_bytes", hint="tensors Adam updates")
    p, g, k = element_bytes(mixed_precision, fp32_grads)
    shard = psi / world_size if psi % world_size else psi // world_size
    params = p * (shard if stage == 3 else psi)
    grads = g * (shard if stage >= 2 else psi)
    opt = k * (shard if stage >= 1 else psi) + ADAM_STEP_BYTES * num_tensors
    return ModelStateBytes(params, grads, opt)


def zero_comm_bytes(psi: int, world_size: int, stage: int, mixed_precision: bool = True, *,
                    accumulate: int = 1, fp32_grads: bool = False, reshard_after_forward: bool = True) -> float:
    """Bytes one rank sends per optimizer step with ring collectives (the module docstring's
    table): 2 (N-1)/N psi b for stages 0-2 and 3 for stage 3 with one micro-batch; with
    `accumulate` = k micro-batches, stages 2 and 3 reduce (and stage 3 gathers) k times."""
    check_stage(stage, "zero_comm_bytes")
    check_model_size("zero_comm_bytes", psi, world_size)
    check_int(accumulate, "accumulate", context="zero_comm_bytes", hint="micro-batches per optimizer step")
    p, g, _ = element_bytes(mixed_precision, fp32_grads)
    k = accumulate
    per_elem = {0: 2 * g, 1: g + p, 2: k * g + p,
                3: k * ((2 if reshard_after_forward else 1) * p + g)}[stage]
    sent = per_elem * (world_size - 1) * psi
    return sent // world_size if sent % world_size == 0 else sent / world_size


def hsdp_comm_bytes(psi: int, shard: int, replicas: int, stage: int = 3, mixed_precision: bool = True) -> float:
    """Bytes one rank sends per step under HSDP: `zero_comm_bytes` within its shard group of
    `shard` ranks (`psi` padded for it), plus the ring all-reduce of its gradient shard
    (psi / shard elements) over the `replicas` groups: 2 (R-1)/R psi / shard g."""
    check_model_size("hsdp_comm_bytes", psi, shard)
    check_int(replicas, "replicas", context="hsdp_comm_bytes", hint="shard groups that all-reduce")
    _, g, _ = element_bytes(mixed_precision)
    inner = zero_comm_bytes(psi, shard, stage, mixed_precision)
    reduced = psi if stage == 0 else psi // shard  # stage 0 all-reduces everything, then across replicas
    outer = 2 * (replicas - 1) * reduced * g
    outer = outer // replicas if outer % replicas == 0 else outer / replicas
    return inner + outer


def milestone_table(psi: int, world_size: int, mixed_precision: bool = True, unit: float = 1e9) -> dict:
    """{stage: total bytes per rank / unit} for stages 0-3: seed 003's "1.6 / 0.9 / 0.8 GB"."""
    check_model_size("milestone_table", psi, world_size)
    check_number(unit, "unit", positive=True, context="milestone_table", hint="bytes per printed unit")
    return {s: zero_state_bytes(psi, world_size, s, mixed_precision).total / unit for s in STAGES}


@dataclass(frozen=True)
class ZeRO3Times:
    """Seconds of one ZeRO-3 step's parts on a simulated device (`zero3_times`): per layer, its
    ring all-gather (`gathers`) and its forward (`forwards`); Adam over every element (stage 0)
    and over this rank's 1/N (stage 3)."""

    gathers: tuple[float, ...]
    forwards: tuple[float, ...]
    adam_full: float
    adam_shard: float

    @property
    def extra(self) -> float:
        """ZeRO-3's step minus stage 0's, one micro-batch: stage 0 all-reduces each layer (a
        reduce-scatter and an all-gather), ZeRO-3 reduce-scatters it and gathers it twice, in
        forward and in backward: one more all-gather per layer, less Adam's saving."""
        return sum(self.gathers) - (self.adam_full - self.adam_shard)

    @property
    def no_reshard_saves(self) -> float:
        """What `reshard_after_forward=False` takes off ZeRO-3's step: backward gathers nothing."""
        return sum(self.gathers)

    @property
    def prefetch_saves(self) -> float | None:
        """What `prefetch=True` takes off ZeRO-3's step when every prefetched gather is hidden:
        all gathers but the first of each pass. Layer i+1's gather runs during layer i's forward
        and layer i-1's during layer i's backward (dX and dW: twice its forward; the first
        layer's input needs no gradient, but nothing is gathered behind its backward). None
        where a gather outlasts the compute it hides behind: partly hidden, the lane's queue
        decides, and only the clock can tell."""
        g, f = self.gathers, self.forwards
        ahead = all(f[i] >= g[i + 1] for i in range(len(g) - 1))
        behind = all(2 * f[i] >= g[i - 1] for i in range(1, len(g)))
        return sum(g[1:]) + sum(g[:-1]) if ahead and behind else None


def zero3_times(dims: Sequence[int], rows: int, world_size: int, profile, mixed_precision: bool = False,
                bias: bool = True) -> ZeRO3Times:
    """ZeRO-3 against stage 0 for an MLP whose layer i maps dims[i] -> dims[i + 1] (`MLPConfig.dims`),
    `rows` rows per rank, on `profile` (a `pipelib.costmodel.DeviceProfile`: alpha + bytes / beta
    per message, roofline compute), the way `zero_train` times it: one unit per layer padded to a
    multiple of N, each gather (N-1) ring steps of one shard; a forward 2 x rows x in x out FLOPs
    (matmuls only: bias, ReLU and the loss count no FLOPs); Adam `adam_bytes_moved` of the padded
    elements a rank updates. Introduced in chapter 08."""
    n = check_int(world_size, "world_size", context="zero3_times", hint="ranks of the data-parallel group")
    check_int(rows, "rows", context="zero3_times", hint="rows per rank")
    if len(dims) < 2:
        raise ValueError(f"zero3_times: dims={list(dims)} has no layer; give [in, hidden..., out]")
    shapes = list(zip(dims[:-1], dims[1:]))
    p, _, _ = element_bytes(mixed_precision)
    units = [i * o + (o if bias else 0) for i, o in shapes]
    padded = [-(-u // n) * n for u in units]
    gathers = tuple((n - 1) * profile.link.time(p * u // n) for u in padded)
    forwards = tuple(profile.compute_time(flops=2 * rows * i * o) for i, o in shapes)
    adam = [profile.compute_time(nbytes=adam_bytes_moved(sum(padded) // k, mixed_precision)) for k in (1, n)]
    return ZeRO3Times(gathers, forwards, adam[0], adam[1])
