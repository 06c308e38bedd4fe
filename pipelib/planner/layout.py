"""A `Layout`: one way to lay a training step out over n devices, and its checks.

    lay = Layout(dp=16, tp=8, pp=8, recompute="full", micro_batch=1)
    m = check_layout(GPT3_175B, 1024, 1536, lay)     # microbatches per step, or a ValueError

Pure. Introduced in chapter 15.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.planner.spec import ModelSpec

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
ORDER = ("pp", "dp", "cp", "tp")  # outermost first: Megatron-LM's and torchtitan's


@dataclass(frozen=True)
class Layout:
    """One way to lay a training step out: degrees, ZeRO stage over dp, recomputation, the
    microbatch size, the pipeline schedule and its virtual stages per rank, sequence parallelism,
    fused (flash) attention, fp32 gradients, the axis order (outermost first)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 1
    recompute: str = "none"
    micro_batch: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    sequence_parallel: bool = True
    flash: bool = True
    fp32_grads: bool = False
    order: tuple[str, ...] = ORDER

    @property
    def n_devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


def check_layout(model: ModelSpec, n_devices: int, global_batch: int, lay: Layout) -> int:
    """Every reason `lay` cannot run `model` on `n_devices` with `global_batch` sequences, as a
    ValueError naming the values; returns the microbatches per step m."""
    if lay.n_devices != n_devices:
        raise ValueError(f"dp={lay.dp} x tp={lay.tp} x pp={lay.pp} x cp={lay.cp} = {lay.n_devices} "
                         f"devices, not {n_devices}; make the product {n_devices}")
    if model.n_head % lay.tp or model.kv_heads % lay.tp and lay.tp % model.kv_heads:
        raise ValueError(f"tp={lay.tp} does not divide {model.name}'s n_head={model.n_head} "
                         f"(K/V heads {model.kv_heads}); use a divisor of both")
    if model.vocab % lay.tp:
        raise ValueError(f"tp={lay.tp} does not divide the vocabulary {model.vocab}; pad it to a multiple")
    if model.n_layer % (lay.pp * lay.virtual):
        raise ValueError(f"pp={lay.pp} x virtual={lay.virtual} stages do not divide {model.name}'s "
                         f"n_layer={model.n_layer}; use a divisor")
    if model.seq_len % (2 * lay.cp if lay.cp > 1 else 1):
        raise ValueError(f"cp={lay.cp}: seq_len={model.seq_len} does not split into {2 * lay.cp} zigzag chunks")
    if global_batch % (lay.dp * lay.micro_batch):
        raise ValueError(f"global batch {global_batch} does not split into dp={lay.dp} x micro_batch="
                         f"{lay.micro_batch}; use a multiple of {lay.dp * lay.micro_batch}")
    m = global_batch // (lay.dp * lay.micro_batch)
    if lay.recompute not in RECOMPUTE or lay.schedule not in SCHEDULES:
        raise ValueError(f"recompute={lay.recompute!r}, schedule={lay.schedule!r}; use one of {RECOMPUTE} "
                         f"and one of {SCHEDULES}")
    if lay.zero not in (0, 1, 2, 3) or (lay.zero >= 2 and lay.pp > 1):
        raise ValueError(f"zero={lay.zero} with pp={lay.pp}: stages 2-3 reduce every microbatch; "
                         f"use zero 0 or 1 with a pipeline (0-3 without)")
    if (lay.virtual > 1) != (lay.schedule == "interleaved_1f1b") or (lay.virtual > 1 and m < lay.pp):
        raise ValueError(f"virtual={lay.virtual} with schedule={lay.schedule!r} and m={m}: interleaving "
                         f"needs virtual > 1, and m >= pp={lay.pp}")
    return m
