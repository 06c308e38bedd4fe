"""A `Strategy`: one way to lay a training step out over n devices, and its checks.

    lay = Strategy(dp=16, tp=8, pp=8, recompute="full", micro_batch=1)
    m = check_strategy(GPT3_175B, 1024, 1536, lay)     # microbatches per step, or a ValueError

A strategy's schedule is any of `pipelib.pipeline.schedules`' registry with formulas for its
bubble and its peak in flight, and its recomputation `full`, `selective` or `none`
(`pipelib.recompute.registry`; the planner has no every-k). Pure. Introduced in chapter 15.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.pipeline.schedules.registry import REGISTRY, schedule_info
from pipelib.planner.spec import ModelSpec
from pipelib.recompute.registry import POLICIES, policy_info

ORDER = ("pp", "dp", "cp", "tp")  # outermost first: Megatron-LM's and torchtitan's


@dataclass(frozen=True)
class Strategy:
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


def check_strategy(model: ModelSpec, n_devices: int, global_batch: int, lay: Strategy) -> int:
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
    if lay.recompute not in POLICIES or policy_info(lay.recompute).chooses_k:
        raise ValueError(f"recompute={lay.recompute!r}; the planner uses one of "
                         f"{[p for p in POLICIES if not policy_info(p).chooses_k]}")
    info = schedule_info(lay.schedule)  # a ValueError lists the schedules
    if info.closed_form is None or info.inflight is None or info.v_shaped:
        raise ValueError(f"schedule={lay.schedule!r}: the planner needs a schedule with formulas for its "
                         f"bubble and its memory; use one of {planned_schedules()}")
    if lay.zero not in (0, 1, 2, 3) or (lay.zero >= 2 and lay.pp > 1):
        raise ValueError(f"zero={lay.zero} with pp={lay.pp}: stages 2-3 reduce every microbatch; "
                         f"use zero 0 or 1 with a pipeline (0-3 without)")
    if (lay.virtual > 1) != info.chunked or (lay.pp > 1 and m < lay.pp):
        raise ValueError(f"virtual={lay.virtual} with schedule={lay.schedule!r}, pp={lay.pp} and m={m}: "
                         f"a looped schedule needs virtual > 1 and the others 1, and a pipeline m >= pp")
    if lay.pp > 1:
        info.peak_inflight(lay.pp, m, lay.virtual)  # a ValueError where its formula does not hold
    return m


def planned_schedules() -> list[str]:
    """The schedules the planner can size: a bubble and a peak-in-flight formula, one stage per
    rank or looped (not a V)."""
    return [n for n, i in REGISTRY.items() if i.closed_form and i.inflight and not i.v_shaped]
