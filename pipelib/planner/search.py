"""`evaluate` one layout, `search` every layout: the strategy planner's answers.

    best = search(GPT3_175B, machine, 1024, 1536)[:5]           # feasible, fastest first
    print(explain(best[0]))

A `Candidate` holds the strategy, bytes per rank itemised, exposed seconds per step itemised,
by one of two accountings (`ACCOUNTINGS`): "megatron", a production run in bf16 mixed
precision (`planner.memory`, `planner.timing`), or "book", the book's own fp32 runs on
simulated devices (`planner.book`, checked against the cluster); MFU (the model's FLOPs per
second over the devices' dense peak, `ModelSpec.model_flops_per_token`), tokens per second,
and whether it fits, with why not in words. Pure: thousands of strategies a second. Introduced in chapter 15.
"""
from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from pipelib.pipeline.schedules.registry import schedule_info
from pipelib.planner.book import book_memory, book_step_time
from pipelib.planner.memory import memory
from pipelib.planner.spec import Machine, ModelSpec
from pipelib.planner.strategy import ORDER, Strategy, check_strategy, planned_schedules
from pipelib.planner.timing import step_time
from pipelib.recompute.registry import POLICIES, policy_info


@dataclass(frozen=True)
class Accounting:
    """How a strategy's bytes and seconds are counted: (model, strategy, m) -> {item: bytes} and
    (model, machine, strategy, m) -> {item: seconds}."""

    name: str
    memory: Callable
    step_time: Callable
    about: str


ACCOUNTINGS = MappingProxyType({a.name: a for a in (
    Accounting("megatron", memory, step_time, "a production run: bf16 mixed precision, Adam's 12 bytes, "
               "Korthikanti et al.'s 16-bit activations, overlapped data-parallel reduction"),
    Accounting("book", book_memory, book_step_time, "the book's fp32 runs of pipelib's GPT on simulated "
               "devices, nothing overlapped (checked against trainer.run)"),
)})

EXPLAIN_WIDTH = 80  # characters a line: chapter 15's text column
RECOMPUTE_PLANNED = tuple(p for p in POLICIES if not policy_info(p).chooses_k)  # none, full, selective


@dataclass(frozen=True)
class Candidate:
    """A layout evaluated: bytes per rank and exposed seconds per step, itemised."""

    layout: Strategy
    memory: dict = field(default_factory=dict)
    time: dict = field(default_factory=dict)
    step_time: float = 0.0
    mfu: float = 0.0
    tokens_per_s: float = 0.0
    feasible: bool = True
    why: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(sum(self.memory.values()))


def mfu(model: ModelSpec, machine: Machine, tokens_per_s: float, n_devices: int) -> float:
    """Model FLOPs utilisation: the model's FLOPs per second (6 N + 12 L s h per token, no
    recomputation) over the devices' dense peak (`machine.device.flops`, not the efficiency)."""
    return model.model_flops_per_token() * tokens_per_s / (n_devices * machine.device.flops)


def evaluate(model: ModelSpec, machine: Machine, n_devices: int, global_batch: int, layout: Strategy, *,
             accounting: str = "megatron") -> Candidate:
    """One strategy's memory, step time, MFU and throughput under an `ACCOUNTINGS` entry;
    ValueError if it cannot run at all (`check_strategy`), `feasible=False` with the overflow
    itemised if it does not fit."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"evaluate: accounting={accounting!r}; use one of {list(ACCOUNTINGS)}")
    m = check_strategy(model, n_devices, global_batch, layout)
    acc = ACCOUNTINGS[accounting]
    mem, time = acc.memory(model, layout, m), acc.step_time(model, machine, layout, m)
    total = sum(time.values())
    tokens = global_batch * model.seq_len / total
    need, have = sum(mem.values()), machine.device.memory
    why = "" if need <= have else (f"needs {need / 2**30:.1f} GiB per device, has {have / 2**30:.1f}: "
                                   + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in mem.items() if v))
    return Candidate(layout, mem, time, total, mfu(model, machine, tokens, n_devices), tokens, not why, why)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def strategies(model: ModelSpec, machine: Machine, n_devices: int, global_batch: int, *,
            micro_batches=(1, 2, 4, 8), cp=(1,), order=ORDER):
    """Every layout `check_strategy` accepts: tp within a node, pp dividing the layers, each ZeRO
    stage, recomputation policy and schedule, microbatch size."""
    for tp in _divisors(machine.gpus_per_node):
        for c in cp:
            for pp in _divisors(model.n_layer):
                if n_devices % (tp * pp * c):
                    continue
                dp = n_devices // (tp * pp * c)
                schedules = ([(n, 2 if schedule_info(n).chunked else 1) for n in planned_schedules()]
                             if pp > 1 else [(Strategy.schedule, 1)])
                zeros = (0, 1) if pp > 1 else (0, 1, 2, 3)
                for (sched, v), zero, rc, b in itertools.product(schedules, zeros, RECOMPUTE_PLANNED, micro_batches):
                    lay = Strategy(dp=dp, tp=tp, pp=pp, cp=c, zero=zero, recompute=rc, micro_batch=b,
                                 schedule=sched, virtual=v, order=order)
                    try:
                        check_strategy(model, n_devices, global_batch, lay)
                    except ValueError:
                        continue
                    yield lay


def search(model: ModelSpec, machine: Machine, n_devices: int, global_batch: int, **kw) -> list[Candidate]:
    """Every feasible layout, fastest first (ties: less memory first)."""
    found = (evaluate(model, machine, n_devices, global_batch, lay)
             for lay in strategies(model, machine, n_devices, global_batch, **kw))
    return sorted((c for c in found if c.feasible), key=lambda c: (c.step_time, c.memory_bytes))


def explain(c: Candidate, width: int = EXPLAIN_WIDTH) -> str:
    """A candidate in a few lines of at most `width` characters (the book's text column): the
    layout first, then its memory, its time, its throughput, and why it does not fit."""
    lay = c.layout
    head = (f"dp={lay.dp} tp={lay.tp} pp={lay.pp} cp={lay.cp}, ZeRO-{lay.zero}, recompute {lay.recompute}, "
            f"b={lay.micro_batch}, {lay.schedule}" + (f" v={lay.virtual}" if lay.virtual > 1 else ""))
    mem = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in c.memory.items() if v)
    time = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in c.time.items() if v)
    lines = [f"GiB a device: {mem} (total {c.memory_bytes / 2**30:.1f})",
             f"step ms: {time} (total {c.step_time * 1e3:.0f})",
             f"MFU {c.mfu:.1%}, {c.tokens_per_s:,.0f} tokens/s"] + ([] if c.feasible else [f"does not fit: {c.why}"])
    out = [textwrap.fill(head, width, subsequent_indent="  ")]
    out += [textwrap.fill(line, width, initial_indent="  ", subsequent_indent="    ") for line in lines]
    return "\n".join(out)
