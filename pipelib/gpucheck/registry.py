"""One entry per gpu-check row: how it runs, what it is held against, its tolerance, its twin.

    info = check_info("zero3")
    info.run(ctx)              # a Measured: the largest difference from one process, times, memory
    info.tolerance             # 1e-5: the largest difference that passes

`CHECKS` is the table's order: every collective of chapter 06's registry (its entry made from
`pipelib.comm.registry`'s, so a new collective gets a row without a line here), then the
strategies. A check is a function of the `Context`; a test adds one (e.g. one that always fails)
by passing `{**CHECKS, name: CheckInfo(...)}` to `pipelib.gpucheck.run.gpu_check`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from pipelib.comm.registry import NAMES
from pipelib.gpucheck import strategies as s
from pipelib.gpucheck.collectives import check_collective
from pipelib.gpucheck.rows import Context, Measured

ONE_PROCESS = "one process"


@dataclass(frozen=True)
class CheckInfo:
    """One check: `run(ctx)` measures it; a difference above `tolerance` fails it (None: nothing
    is compared); `against` says what it is compared with, `twin` which of torch's
    implementations its step time is raced against (None: no twin); `min_ranks`: fewer ranks
    and it is skipped."""

    name: str
    group: str
    run: Callable[[Context], Measured]
    tolerance: float | None
    against: str
    twin: str | None = None
    min_ranks: int = 1


def _collective_checks() -> tuple[CheckInfo, ...]:
    """A row per collective: exact (integer-valued floats sum exactly in any order)."""
    return tuple(CheckInfo(name, "collective", functools.partial(check_collective, name), 0.0,
                           "torch.distributed's built-in", twin="built-in") for name in NAMES)


PIPELINES = tuple("1f1b zbv".split())  # of the registry's schedules: a plain one, a V with the zero-bubble split


def _strategy_checks() -> tuple[CheckInfo, ...]:
    gpt, fp32 = s.GPT_TOLERANCE, s.FP32_TOLERANCE
    return (
        CheckInfo("ddp", "strategy", s.check_ddp, gpt, ONE_PROCESS, twin="torch DDP", min_ranks=2),
        CheckInfo("zero3", "strategy", s.check_zero3, fp32, ONE_PROCESS, twin="FSDP2", min_ranks=2),
        CheckInfo("tp_sp", "strategy", s.check_tp_sp, gpt, ONE_PROCESS, twin="DTensor", min_ranks=2),
        *(CheckInfo(name=schedule, group="pipeline", run=functools.partial(s.check_pipeline, schedule),
                    tolerance=gpt, against=ONE_PROCESS, twin="torch pipelining", min_ranks=2)
          for schedule in PIPELINES),
        CheckInfo("ring_attention", "strategy", s.check_ring_attention, gpt, ONE_PROCESS, min_ranks=2),
        CheckInfo("recompute", "strategy", s.check_recompute, gpt, ONE_PROCESS, min_ranks=2),
    )


CHECKS: MappingProxyType[str, CheckInfo] = MappingProxyType(
    {c.name: c for c in _collective_checks() + _strategy_checks()})


def check_info(name: str) -> CheckInfo:
    """The entry of check `name`; a ValueError lists the names."""
    info = CHECKS.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"gpu-check: unknown check {name!r}; use some of {list(CHECKS)}")
    return info
