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

pipelib's ZeRO (`pipelib.data_parallel.zero`) keeps each layer's parameters as one flat buffer
padded to a multiple of N, so N equal shards exist: every formula holds *exactly* with psi
replaced by the padded count `padded_numel` (at most N - 1 extra elements per layer), plus
torch's Adam `step` counter, one fp32 scalar per tensor it updates (one per layer: 4 bytes each).

Communication per rank per step (bytes sent, ring collectives, b bytes per element): stages 0-2
send 2 (N-1)/N psi b (all-reduce, or reduce-scatter of gradients + all-gather of parameters);
stage 3 sends 3 (N-1)/N psi b (parameters gathered in forward and again in backward, gradients
reduce-scattered): 1.5x.

Introduced in chapter 08.
"""
from __future__ import annotations

from pipelib.memory import ModelStateBytes

STAGES = (0, 1, 2, 3)
ADAM_STEP_BYTES = 4  # torch's Adam keeps `step` as one fp32 scalar tensor per parameter tensor


def check_stage(stage, context: str = "ZeRO") -> int:
    """Return `stage` if it is 0, 1, 2 or 3, else raise a ValueError saying what each means."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"{context}: stage={stage!r} is not a ZeRO stage; use 0 (plain data parallel), "
                         f"1 (shard optimizer state), 2 (and gradients) or 3 (and parameters)")
    return int(stage)


def element_bytes(mixed_precision: bool) -> tuple[int, int, int]:
    """(parameter bytes, gradient bytes, K optimizer bytes) per parameter."""
    return (2, 2, 12) if mixed_precision else (4, 4, 8)


def padded_numel(unit_sizes, world_size: int) -> int:
    """Elements once every unit (layer) is padded to a multiple of `world_size`."""
    return sum(-(-int(u) // world_size) * world_size for u in unit_sizes)


def zero_state_bytes(psi: int, world_size: int, stage: int, mixed_precision: bool = True,
                     num_tensors: int = 0) -> ModelStateBytes:
    """Bytes of parameters, gradients and optimizer state on one rank (section 5 of the paper).

    `psi` should divide by `world_size` (pass `padded_numel` for pipelib's padded layout);
    `num_tensors` adds Adam's fp32 step counters (4 bytes per tensor the optimizer updates)."""
    check_stage(stage, "zero_state_bytes")
    if world_size < 1:
        raise ValueError(f"zero_state_bytes: world_size={world_size}; use at least 1")
    p, g, k = element_bytes(mixed_precision)
    shard = psi / world_size if psi % world_size else psi // world_size
    params = p * (shard if stage == 3 else psi)
    grads = g * (shard if stage >= 2 else psi)
    opt = k * (shard if stage >= 1 else psi) + ADAM_STEP_BYTES * num_tensors
    return ModelStateBytes(params, grads, opt)


def zero_comm_bytes(psi: int, world_size: int, stage: int, mixed_precision: bool = True) -> float:
    """Bytes one rank sends per step with ring collectives: 2 (N-1)/N psi b, or 3 for stage 3."""
    check_stage(stage, "zero_comm_bytes")
    b = element_bytes(mixed_precision)[0]
    factor = 3 if stage == 3 else 2
    sent = factor * (world_size - 1) * psi * b
    return sent // world_size if sent % world_size == 0 else sent / world_size


def milestone_table(psi: int, world_size: int, mixed_precision: bool = True, unit: float = 1e9) -> dict:
    """{stage: total bytes per rank / unit} for stages 0-3: seed 003's "1.6 / 0.9 / 0.8 GB"."""
    return {s: zero_state_bytes(psi, world_size, s, mixed_precision).total / unit for s in STAGES}
