"""The DDP step on paper: compute from FLOPs, all-reduces from the alpha-beta link model.

Seed 003's milestone asks how much data parallelism's communication adds to a step, and when
two GPUs are slower than one. On one rank of N, for a model of psi parameters (4-byte
gradients) and T tokens per rank per step on a device of F FLOP/s with a link (alpha, beta):

    compute  = train FLOPs / F               (~ 6 psi T / F: forward 2, backward 4)
    comm     = sum over buckets of 2(N-1) alpha + 2(N-1)/N bytes / beta     (ring all-reduce)
    efficiency = compute / (compute + comm)    (seed 003's "communication efficiency")
    overhead   = comm / compute                (what communication adds to the step, unhidden)

These are the *no-overlap* figures (steps 1 and 2), at the profile's peak FLOP/s and link
bandwidth. `ddp_step_model(..., overlap=True)` gives step 3's: the buckets' all-reduces run on
a contention-free lane while backward goes on, each starting when its bucket is ready (backward
taken to produce the gradients in proportion to their parameters, in backward's order) and in
bucket order; only what outlasts backward is exposed. `scaled_profile(..., mfu=0.45)` gives a
device at a realistic share of its peak (model FLOPs utilisation). `overhead_breakdown` puts
both beside the closed form below, term by term.

The bandwidth term of comm / compute is (2(N-1)/N 4 psi / beta) / (6 psi T / F): psi cancels.
What DDP's overhead depends on is *tokens per rank per step* (T) against the device's FLOPs per
link byte (`DeviceProfile.flops_per_link_byte`); the model's size enters through the latency
(2(N-1) alpha per bucket, which small models cannot amortise) and the FLOPs that do not scale
with psi (attention, the head). Gradient accumulation (`DDP.no_sync`) multiplies T.

`ddp_step_model` predicts each part of a simulated step without overlap exactly as the cluster
times it (`pipelib.data_parallel.runner`): the virtual clock runs the same formulas, so chapter
07's check of one against the other is a check of the code, not of the physics; it then uses the
formulas at sizes a laptop cannot run. Step 3's estimate is approximate (the cluster times each
bucket's readiness from the FLOPs counted so far). `scaled_profile` gives a
device whose step on B sequences lasts what the original's lasts on `factor` x B: a tiny model
on a laptop, timed like a real batch on a real GPU (FLOPs scale with the batch exactly).

Pure: imports no torch (a test checks). Introduced in chapter 07.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipelib.checks import check_int
from pipelib.comm.alphabeta import predicted_time
from pipelib.costmodel import LINKS, DeviceProfile, get_profile
from pipelib.data_parallel.buckets import plan_buckets
from pipelib.memory import gpt_param_shapes, gpt_train_flops

OPTIMIZER_BYTES = 28  # Adam reads p, g, m, v and writes p, m, v: 7 fp32 tensors per parameter


def scaled_profile(profile, factor: float = 1.0, link: str | None = None, mfu: float = 1.0) -> DeviceProfile:
    """`profile` computing `factor` times fewer FLOP/s, on `link` (a name in
    `pipelib.costmodel.LINKS`) if given: forward and backward on B sequences then last what the
    original device takes on factor x B sequences (their FLOPs scale with B exactly). Memory
    bandwidth is kept: the optimizer's traffic does not grow with the batch. `mfu`: the share
    of the peak FLOP/s the training step achieves (1: the datasheet's peak)."""
    p = get_profile(profile)
    if not factor > 0:
        raise ValueError(f"scaled_profile: factor={factor!r}; pass a positive number "
                         f"(the batch it stands for / the batch run)")
    if not 0 < mfu <= 1:
        raise ValueError(f"scaled_profile: mfu={mfu!r}; pass the share of peak FLOP/s achieved, in (0, 1]")
    if link is not None and link not in LINKS:
        raise ValueError(f"scaled_profile: unknown link {link!r}; use one of {sorted(LINKS)}")
    name = (p.name + (f" x{factor:g} batch" if factor != 1 else "") + (f" over {link}" if link else "")
            + (f" at {mfu:.0%} MFU" if mfu != 1 else ""))
    return replace(p, name=name, flops=p.flops * mfu / factor, link=LINKS[link] if link else p.link)


def all_reduce_time(numels, n: int, profile, itemsize: int = 4) -> float:
    """Seconds of one ring all-reduce per entry of `numels` (elements), one after the other."""
    check_int(n, "n", context="all_reduce_time", hint="ranks of the ring")
    link = get_profile(profile).link
    return sum(predicted_time("all_reduce", k * itemsize, n, link.alpha, link.beta) for k in numels)


@dataclass(frozen=True)
class DDPStep:
    """One rank's DDP step, in seconds. `exposed`: the communication the step waits for (None:
    all of it, no overlap: steps 1 and 2 of chapter 07; step 3: what outlasts backward)."""

    forward: float
    backward: float
    optimizer: float
    comm: float
    exposed: float | None = None

    @property
    def compute(self) -> float:
        return self.forward + self.backward

    @property
    def waited(self) -> float:
        """The communication on the step's critical path."""
        return self.comm if self.exposed is None else self.exposed

    @property
    def step(self) -> float:
        return self.forward + self.backward + self.waited + self.optimizer

    @property
    def efficiency(self) -> float:
        """compute / (compute + waited communication): seed 003's communication efficiency."""
        return self.compute / (self.compute + self.waited)

    @property
    def overhead(self) -> float:
        """waited communication / compute: the share communication adds to the compute of a step."""
        return self.waited / self.compute


def ddp_step_model(cfg, batch: int, n: int, profile, *, bucket_bytes: int | None = 25 << 20,
                   first_bucket_bytes: int | None = None, overlap: bool = False) -> DDPStep:
    """The simulated DDP step of the GPT `cfg` with `batch` sequences of cfg.block_size tokens
    on each of n ranks: compute from `pipelib.memory.gpt_train_flops`, one ring all-reduce per
    bucket of `bucket_bytes` (None: per tensor, step 1), Adam's memory traffic. With `overlap`,
    the all-reduces run during backward (step 3; see the module's docstring): `exposed` is the
    part that outlasts it."""
    check_int(batch, "batch", context="ddp_step_model", hint="sequences per rank")
    check_int(n, "n", context="ddp_step_model", hint="ranks of the data-parallel group")
    p = get_profile(profile)
    shapes = gpt_param_shapes(cfg)
    numels = [_prod(s) for s in shapes.values()]
    psi = sum(numels)
    fwd = gpt_train_flops(cfg, batch, cfg.block_size) / 3
    plan = plan_buckets(list(zip(shapes, numels)), 1 if bucket_bytes is None else bucket_bytes, 4,
                        first_bucket_bytes)
    times = [all_reduce_time([b.numel], n, p) if n > 1 else 0.0 for b in plan]
    bwd = p.compute_time(2 * fwd)
    exposed = _exposed([b.numel for b in plan], times, psi, bwd) if overlap else None
    return DDPStep(p.compute_time(fwd), bwd, p.compute_time(0, OPTIMIZER_BYTES * psi), sum(times), exposed)


def _exposed(numels, times, psi: int, backward: float) -> float:
    """One lane, buckets in index order: bucket b ready when backward has produced the
    gradients up to it (in proportion to parameters), started when ready and the lane free."""
    free, done = 0.0, 0
    for k, t in zip(numels, times):
        done += k
        free = max(free, backward * done / psi) + t
    return max(0.0, free - backward)


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def two_ranks_slower(cfg, batch: int, profile, *, bucket_bytes: int | None = 25 << 20,
                     overlap: bool = False) -> bool:
    """With a global batch of `batch` sequences: is one DDP step on 2 ranks (batch / 2 each,
    plus the all-reduce, overlapped with backward or not) slower than the whole batch on 1 rank?
    (strong scaling)"""
    return (ddp_step_model(cfg, batch // 2, 2, profile, bucket_bytes=bucket_bytes, overlap=overlap).step
            > ddp_step_model(cfg, batch, 1, profile, bucket_bytes=bucket_bytes).step)


def _saved_per_param(tokens: int, p, n: int, overlap: bool, itemsize: int) -> float:
    """Seconds per parameter that n ranks save on compute, less the all-reduce's bandwidth
    term. Without overlap they save 6 T (1 - 1/n) / F; with ideal overlap (the all-reduce,
    longer than backward, starts with it) the step is 2 psi T / (n F) + comm: they save
    T (6 - 2/n) / F."""
    compute = 6 * (1 - 1 / n) if not overlap else 6 - 2 / n
    return compute * tokens / p.flops - 2 * (n - 1) / n * itemsize / p.link.beta


def crossover_params(tokens: int, profile, n: int = 2, buckets: int = 1, itemsize: int = 4,
                     overlap: bool = False) -> float:
    """Closed form: the parameter count below which n ranks (tokens / n each, then one ring
    all-reduce in `buckets` buckets) take longer than one rank on all `tokens`, with compute
    6 psi T / F. Without overlap n ranks save 6 psi T (1 - 1/n) / F of compute and pay
    buckets 2(n-1) alpha + 2 (n-1)/n itemsize psi / beta: equal at
    psi* = buckets 2(n-1) alpha / (6 T (1 - 1/n) / F - 2 (n-1)/n itemsize / beta).
    With ideal overlap, 6 T (1 - 1/n) becomes T (6 - 2/n) (`_saved_per_param`).
    Infinite when the link's bandwidth alone costs more than the compute saved (then n ranks
    lose at every size)."""
    p = get_profile(profile)
    saved = _saved_per_param(tokens, p, n, overlap, itemsize)
    return buckets * 2 * (n - 1) * p.link.alpha / saved if saved > 0 else float("inf")


def crossover_tokens(profile, n: int = 2, itemsize: int = 4, overlap: bool = False) -> float:
    """The global batch (tokens) below which n ranks lose to one at *every* model size, from
    the bandwidth alone: 2 (n-1)/n itemsize F / beta over the compute saved per token and
    parameter. Without overlap that is 6 (1 - 1/n): itemsize F / (3 beta), 4F / (3 beta) for
    4-byte gradients, whatever n. With ideal overlap it is 6 - 2/n: 4 (n-1) / (3n - 1) F / beta
    for 4-byte gradients, 4F / (5 beta) on 2 ranks."""
    p = get_profile(profile)
    compute = 6 * (1 - 1 / n) if not overlap else 6 - 2 / n
    return 2 * (n - 1) / n * itemsize * p.flops / p.link.beta / compute


@dataclass(frozen=True)
class Overhead:
    """What data parallelism adds to one rank's compute (waited communication / compute), taken
    apart. `plain` and `overlapped`: the step model without and with step 3's overlap. The
    closed form's two terms, each over the compute 6 psi T / F: `bandwidth`, the ring's
    2 (N-1)/N 4 psi / beta (psi cancels: (4/3) (N-1)/N (F / beta) / T), and
    `latency`, 2 (N-1) alpha per bucket. The step model counts the GPT's own FLOPs, so
    plain.overhead x `flops_over_6psit` = bandwidth + latency exactly (to rounding).
    `tail`: seconds of the last two buckets' all-reduces, the last one ready only when backward
    ends: when the lane has kept up with backward until the next-to-last bucket, step 3 exposes
    at least the last and at most these two."""

    plain: DDPStep
    overlapped: DDPStep
    bandwidth: float
    latency: float
    buckets: int
    tail: tuple[float, float]
    flops_over_6psit: float
    flops_per_link_byte: float


def overhead_breakdown(cfg, tokens: float, n: int, profile, *, bucket_bytes: int = 25 << 20) -> Overhead:
    """The DDP overhead of the GPT `cfg` at `tokens` tokens per rank and step on n ranks of
    `profile` (a real device; on paper, one sequence on a device tokens / cfg.block_size times
    slower: `scaled_profile`), with the closed form beside it (`Overhead`). Chapter 07's milestone."""
    p = get_profile(profile)
    if not tokens > 0:
        raise ValueError(f"overhead_breakdown: tokens={tokens!r}; pass the tokens per rank and step (> 0)")
    one = scaled_profile(p, tokens / cfg.block_size)  # one sequence timed as `tokens` tokens
    plain = ddp_step_model(cfg, 1, n, one, bucket_bytes=bucket_bytes)
    overlapped = ddp_step_model(cfg, 1, n, one, bucket_bytes=bucket_bytes, overlap=True)
    shapes = gpt_param_shapes(cfg)
    numels = [_prod(s) for s in shapes.values()]
    psi = sum(numels)
    plan = plan_buckets(list(zip(shapes, numels)), bucket_bytes, 4)  # ddp_step_model's buckets
    last = [all_reduce_time([b.numel], n, p) if n > 1 else 0.0 for b in plan[-2:]]
    compute = 6 * psi * tokens / p.flops
    return Overhead(
        plain, overlapped,
        bandwidth=2 * (n - 1) / n * 4 * psi / p.link.beta / compute,
        latency=len(plan) * 2 * (n - 1) * p.link.alpha / compute,
        buckets=len(plan),
        tail=tuple([0.0] * (2 - len(last)) + last),
        flops_over_6psit=gpt_train_flops(cfg, 1, cfg.block_size) / (6 * psi * cfg.block_size),
        flops_per_link_byte=p.flops_per_link_byte)


def step_parts(trace, rank: int = 0) -> dict:
    """Seconds of each part of the measured step(s) on `rank`, summed from its events (a
    `pipelib.trace.Trace`): forward "F", backward "B", "optimizer", all-reduce (COLLECTIVE
    events, on the communication lane) and exposed communication (RECV_WAIT "wait all-reduce":
    the compute lane idle, waiting for an all-reduce)."""
    out = dict.fromkeys(("forward", "backward", "optimizer", "comm", "exposed"), 0.0)
    key = {("compute", "F"): "forward", ("compute", "B"): "backward", ("compute", "optimizer"): "optimizer",
           ("recv-wait", "wait all-reduce"): "exposed"}
    for e in trace.events:
        if e.rank != rank:
            continue
        kind = getattr(e.kind, "value", e.kind)
        part = "comm" if kind == "collective" else key.get((kind, e.label))
        if part:
            out[part] += e.end - e.start
    return out
