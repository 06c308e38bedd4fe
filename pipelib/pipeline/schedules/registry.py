"""One entry per schedule: its generator and everything else that depends on which one it is.

    schedule_info("one_f_one_b").torch_class        # 'Schedule1F1B' (an alias of "1f1b")
    make_schedule("interleaved_1f1b", 4, 8, num_chunks=2)

A `ScheduleInfo` says whether the generator takes num_chunks (v), whether the schedule splits
the backward into I and W, whether its stages sit in a V, torch.distributed.pipelining's class
for it, and its bubble's closed form. This module is the only place where a schedule's name is
compared or mapped (a test greps the rest of pipelib): a new schedule is one generator, one
line below, and its tests.

Closed forms are per rank over one step, for uniform stages and free messages, with costs of
one op of one stage (of one chunk, for chunked and V schedules): `bubble` returns the idle share
of the step, idle / (idle + busy), which `simulate(...).bubble` measures, or with
relative=True idle / busy, relative to the ideal compute time. Derived in chapters 11 to 13.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipelib.checks import check_int
from pipelib.pipeline.schedules.generators import (
    gpipe,
    interleaved_1f1b,
    llama3_interleaved,
    looped_bfs,
    naive,
    one_f_one_b,
)
from pipelib.pipeline.schedules.ir import Schedule, as_schedule
from pipelib.pipeline.schedules.zero_bubble import (
    dualpipe_v,
    interleaved_zero_bubble,
    zbv,
    zero_bubble_h1,
    zero_bubble_h2,
)

# A closed form: (p, m, v, costs) -> (idle, busy) seconds per rank; costs has F, B, I, W
# (a `pipelib.pipeline.simulate.Costs`). It raises a ValueError where it does not hold.
ClosedForm = Callable[[int, int, int, object], tuple[float, float]]


def _steady(name: str, p: int, m: int, need: int) -> None:
    if m < need:
        raise ValueError(f"bubble_closed_form({name!r}): m={m} < {need} with p={p}: the pipeline "
                         f"never reaches its steady state and no closed form holds; use simulate()")


def stop_and_wait(p, m, v, c):
    """naive: one rank works at a time. idle (p-1) m t, busy m t (t = F + B): share (p-1)/p."""
    t = c.F + c.B
    return (p - 1) * m * t, m * t


def fill_and_drain(p, m, v, c):
    """GPipe, 1F1B (Huang et al. 2019; Narayanan et al. 2021): idle (p-1) t, busy m t: share
    (p-1)/(m+p-1), relative (p-1)/m, whatever B/F is, as fill and drain both scale."""
    t = c.F + c.B
    return (p - 1) * t, m * t


def looped_fill_and_drain(p, m, v, c):
    """Interleaved 1F1B (Narayanan et al., SC'21), costs per chunk: idle (p-1) t, busy v m t:
    share (p-1)/(v m + p-1), relative (p-1)/(v m). Needs m >= p."""
    _steady("interleaved_1f1b", p, m, p)
    t = c.F + c.B
    return (p - 1) * t, v * m * t


def breadth_first(p, m, v, c):
    """Looped BFS (Lamy-Poirier 2023), costs per chunk: the fill and drain of one chunk, as
    interleaved 1F1B's: idle (p-1) t, busy v m t, share (p-1)/(v m + p-1), but with GPipe's
    memory (all m microbatches at the turn). Needs m >= p."""
    _steady("looped_bfs", p, m, p)
    t = c.F + c.B
    return (p - 1) * t, v * m * t


def rounds_of_n(p, m, v, c):
    """Llama 3's interleaved, any N microbatches per round, costs per chunk: with free messages
    interleaving's idle (p-1) t, busy v m t (N changes memory, and how much message latency is
    hidden: `simulate`). Needs m >= p."""
    _steady("llama3_interleaved", p, m, p)
    t = c.F + c.B
    return (p - 1) * t, v * m * t


def deferred_w(p, m, v, c):
    """ZB-H1 (Qi et al. 2023): idle (p-1) max(F, F+I-W), busy m (F+I+W): with F = I = W, share
    (p-1)/(3m + p-1), relative (p-1)/(3m), a third of 1F1B's. Needs m >= p."""
    _steady("zb_h1", p, m, p)
    return (p - 1) * max(c.F, c.F + c.I - c.W), m * (c.F + c.I + c.W)


def parallelogram(p, m, v, c):
    """ZB-H2 (Qi et al. 2023), F = I = W: rank r starts r F late and, busy to its last action,
    ends (p-1-r) F early: idle (p-1) F, busy m (F+I+W), share (p-1)/(3m + p-1) of one step,
    as ZB-H1's. Counted in each rank's own span (Qi et al., with post-validation) it is 0 for
    m >= 2p-1: `SimResult.own_span_idle`. Needs m >= p."""
    _steady("zb_h2", p, m, p)
    if not c.F == c.I == c.W:
        raise ValueError(f"bubble_closed_form('zb_h2') holds for F = I = W only, got F={c.F}, "
                         f"I={c.I}, W={c.W}; use simulate() for other costs")
    return (p - 1) * c.F, m * (c.F + c.I + c.W)


def v_filled(p, m, v, c):
    """ZB-V (Qi et al. 2023), costs per chunk with F = I = W: idle (p-1) F (filling the V once),
    busy 2m (F+I+W): relative (p-1)/(6m) of one step's span. Qi et al. give 0: they count idle
    time in each rank's own span, which has none for m >= 2p-1 (`SimResult.own_span_idle`); the
    corners overlap the next iteration with post-validation. Needs m >= 2p."""
    _steady("zbv", p, m, 2 * p)
    if not c.F == c.I == c.W:
        raise ValueError(f"bubble_closed_form('zbv') holds for F = I = W only, got F={c.F}, "
                         f"I={c.I}, W={c.W}; use simulate() for other costs")
    return (p - 1) * c.F, 2 * m * (c.F + c.I + c.W)


def looped_inflight(p, m, v):
    """Interleaved 1F1B's rank 0 (Megatron-LM's warm-up): 2(p-1) + (v-1) p forwards of a chunk,
    plus the one the first backward follows, (v+1) p - 1 chunks, or all v m when fewer. Rounds
    of other sizes (m > p, not a multiple of p) hold more: None, so `simulate` must say."""
    return min((v + 1) * p - 1, v * m) if m <= p or m % p == 0 else None


@dataclass(frozen=True)
class ScheduleInfo:
    """What pipelib knows about one schedule, besides its order (which its generator makes)."""

    name: str
    generator: Callable[..., Schedule]
    torch_class: str | None                  # torch.distributed.pipelining's class, if any
    chunked: bool = False                    # generator(p, m, num_chunks): v stages per rank
    split_backward: bool = False             # runs I and W (zero bubble), not only B
    v_shaped: bool = False                   # stage s on rank s, then back down; else s % p
    closed_form: ClosedForm | None = None    # its bubble's formula, if it has one
    aliases: tuple[str, ...] = ()            # other names that mean this schedule
    torch_needs_m_ge_p: bool = False         # torch's class refuses m < p; pipelib's runs any m
    inflight: Callable[[int, int, int], int | None] | None = None  # rank 0's peak in flight, a formula
    in_megatron: bool = False                # Megatron-LM runs it (Narayanan et al. 2021: 1F1B, interleaved)

    @property
    def stages_per_rank(self) -> int | None:
        """Stages per rank when fixed (2 for a V, 1 for a plain pipeline); None when chunked (v)."""
        return None if self.chunked else 2 if self.v_shaped else 1

    def make(self, p: int, m: int, num_chunks: int | None = None) -> Schedule:
        """The schedule for p ranks and m microbatches; num_chunks (v) is used if `chunked`,
        else ignored (None: the generator's default, 2)."""
        if self.chunked and num_chunks is not None:
            return self.generator(p, m, num_chunks)
        return self.generator(p, m)

    def peak_inflight(self, p: int, m: int, v: int = 1) -> int:
        """Microbatches (of one chunk, for chunked schedules) whose activations rank 0 holds at
        its peak, from the formula; `simulate(...).peak_inflight[0]` measures the same (the
        planner sizes activation memory with it)."""
        n = None if self.inflight is None else self.inflight(p, m, v if self.chunked else 1)
        if n is None:
            raise ValueError(f"no in-flight formula for schedule {self.name!r} at p={p}, m={m}, v={v}; "
                             f"use simulate()")
        return n

    def bubble(self, p: int, m: int, v: int, costs, *, relative: bool = False) -> float:
        """The bubble from the closed form: idle share of the step, or idle / busy (`relative`)."""
        if self.closed_form is None:
            with_form = [n for n, i in REGISTRY.items() if i.closed_form is not None]
            raise ValueError(f"no closed form for schedule {self.name!r}; choose one of "
                             f"{', '.join(with_form)}, or use simulate()")
        where = f"bubble_closed_form({self.name!r})"
        check_int(p, "p", context=where, hint="ranks")
        check_int(m, "m", context=where, hint="num_microbatches")
        check_int(v, "v", context=where, hint="num_chunks: stages per rank")
        idle, busy = self.closed_form(p, m, v, costs)
        return idle / busy if relative else idle / (idle + busy)


REGISTRY: Mapping[str, ScheduleInfo] = MappingProxyType({info.name: info for info in (
    ScheduleInfo("naive", naive, None, closed_form=stop_and_wait, inflight=lambda p, m, v: 1),
    ScheduleInfo("gpipe", gpipe, "ScheduleGPipe", closed_form=fill_and_drain, aliases=("GPipe",),
                 inflight=lambda p, m, v: m),  # every forward before any backward
    ScheduleInfo("1f1b", one_f_one_b, "Schedule1F1B", closed_form=fill_and_drain,
                 aliases=("one_f_one_b",), torch_needs_m_ge_p=True, in_megatron=True,
                 inflight=lambda p, m, v: min(p, m)),  # p - r warm-up forwards on rank r
    ScheduleInfo("interleaved_1f1b", interleaved_1f1b, "ScheduleInterleaved1F1B", chunked=True,
                 closed_form=looped_fill_and_drain, inflight=looped_inflight, in_megatron=True),
    ScheduleInfo("looped_bfs", looped_bfs, "ScheduleLoopedBFS", chunked=True,
                 closed_form=breadth_first, inflight=lambda p, m, v: v * m),
    ScheduleInfo("llama3_interleaved", llama3_interleaved, None, chunked=True,
                 closed_form=rounds_of_n, aliases=("llama3",)),
    ScheduleInfo("zb_h1", zero_bubble_h1, "ScheduleInterleavedZeroBubble", split_backward=True,
                 closed_form=deferred_w, aliases=("zero_bubble_h1", "zbh1"), inflight=lambda p, m, v: min(p, m)),
    ScheduleInfo("zb_h2", zero_bubble_h2, None, split_backward=True, closed_form=parallelogram,
                 aliases=("zero_bubble_h2", "zbh2"), inflight=lambda p, m, v: min(2 * p - 1, m)),
    ScheduleInfo("interleaved_zero_bubble", interleaved_zero_bubble,
                 "ScheduleInterleavedZeroBubble", chunked=True, split_backward=True),
    ScheduleInfo("zbv", zbv, "ScheduleZBVZeroBubble", split_backward=True, v_shaped=True,
                 closed_form=v_filled),
    ScheduleInfo("dualpipe_v", dualpipe_v, "ScheduleDualPipeV", split_backward=True, v_shaped=True),
)})

ALIASES: Mapping[str, str] = MappingProxyType({a: info.name for info in REGISTRY.values() for a in info.aliases})
if set(ALIASES) & set(REGISTRY) or len(ALIASES) < sum(len(i.aliases) for i in REGISTRY.values()):
    raise ValueError(f"an alias names two schedules, or is a schedule's name: {ALIASES}")

# name -> generator, for callers that only need the function (the book's loops, the bench)
GENERATORS: Mapping[str, Callable[..., Schedule]] = MappingProxyType({n: i.generator for n, i in REGISTRY.items()})


def schedule_info(name: str) -> ScheduleInfo:
    """The registry entry for `name` or one of its aliases; a ValueError lists the names."""
    info = REGISTRY.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"unknown schedule {name!r}; choose one of {list(REGISTRY)} (aliases: "
                         f"{', '.join(f'{a} = {n}' for a, n in ALIASES.items())})")
    return info


def make_schedule(name: str, p: int, m: int, num_chunks: int | None = None) -> Schedule:
    """`schedule_info(name).make(p, m, num_chunks)`: a schedule by name or alias."""
    return schedule_info(name).make(p, m, num_chunks)


def resolve_schedule(schedule, p: int | None = None, m: int | None = None,
                     num_chunks: int = 2) -> Schedule:
    """A `Schedule` from a name or alias in `pipelib.pipeline.schedules.REGISTRY` (with p, m;
    num_chunks for chunked ones) or a Schedule/dict."""
    if not isinstance(schedule, str):
        return as_schedule(schedule)
    info = schedule_info(schedule)  # an unknown name: a ValueError listing the names
    if p is None or m is None:
        raise ValueError(f"schedule {schedule!r} by name needs p (ranks) and m (microbatches)")
    return info.make(p, m, num_chunks)
