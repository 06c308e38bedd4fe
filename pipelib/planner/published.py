"""The planner against published large runs: their configuration, where the planner ranks it,
and the utilisation it predicts beside the published one (chapter 15).

Sources (each row's `source`):

- Megatron-LM on Selene: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM" (SC '21, arXiv:2104.04473). Table 1 (weak scaling; GPT
  models of vocabulary 51,200 and sequences of 2048): the 145.6B model (80 layers, hidden
  12,288, 96 heads) at tensor 8 x pipeline 8 on 1536 A100s, batch 2304, 148 TFLOP/s per GPU,
  47% of the A100's 312 TFLOP/s; the 1T model (128 layers, hidden 25,600, 160 heads) at tensor 8
  x pipeline 64 on 3072 A100s, batch 3072, 163 TFLOP/s, 52%. Section 5.1: GPT-3 175B on 1024
  A100s with batch 1536 at 140 TFLOP/s per GPU (45%), its degrees not given (the planner chooses
  them). Their count (eq. 3) includes the forward pass that full recomputation runs again: a
  *hardware* FLOPs utilisation; every run used full recomputation. Selene's nodes: 8 A100s on
  NVLink 3, eight 200 Gb/s HDR InfiniBand ports a node (25 GB/s a GPU).
- Llama 3 405B on 8,192 and 16,384 H100s: Dubey et al. 2024, "The Llama 3 Herd of Models"
  (arXiv:2407.21783), Table 4: tensor 8 x context 1 x pipeline 16 x data 64 (resp. 128),
  sequences of 8192, 16M tokens a batch (2048 sequences), 430 (resp. 400) TFLOP/s per GPU, a
  BF16 *model* FLOPs utilisation of 43% (resp. 41%). Nodes of 8 H100s on NVLink, 400 Gb/s a GPU
  between nodes (RoCE; modelled as `LINKS["ib-ndr"]`, the same 50 GB/s). Section 3.3.2: the
  126 layers are balanced over 16 stages by taking one layer off the first and the last stage
  (which hold the embedding and the output layer): the planner, which splits layers evenly,
  plans 128 layers, 1.6% more parameters and FLOPs than the model has. Their data parallelism
  is FSDP sharding optimizer states and gradients; the planner's pipeline takes ZeRO-1 at most.

What is fitted: one number, `Machine.efficiency`, the fraction of dense peak a large matmul
reaches (the same for both devices), chosen so the planner's prediction of the *calibration*
row (the first: Table 1's 145.6B, whose degrees are published) equals its published figure
(bisection); every other row is then a prediction, and `comparison` says how far off. Each row
is planned with its published degrees (where published) and the planner's choice of everything
else not published (ZeRO stage, recomputation, microbatch, schedule), and ranked among every
feasible plan of the whole search. What each paper states beyond the degrees is kept
(`PublishedRun.known`): Megatron-LM's full recomputation and unsharded data parallelism (its
distributed optimizer came later), and for both the 1F1B and interleaved
schedules of their time (the planner's zero-bubble schedules came later).

Llama 3's runs are planned a second way, closer to what the paper describes (`balanced`): the
search splits layers evenly and so fits Llama 3's degrees only with full recomputation, which
Llama 3 did not use; with the paper's balance (one layer off the first and the last stage), each
stage's memory counted under 1F1B (`balanced_stage_memory`), the degrees fit with no
recomputation (or selective, Korthikanti et al. 2022, which under fused attention keeps the same
bytes and reruns the attention core), and the prediction at the calibrated efficiency is
reported beside the published figure: not fitted to it. Pure. Introduced in chapter 15.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipelib.costmodel import LINKS, PROFILES, Link
from pipelib.pipeline.schedules.registry import REGISTRY
from pipelib.planner.memory import layer_activation_bytes, memory
from pipelib.planner.search import Candidate, evaluate, search
from pipelib.planner.spec import GPT3_175B, Machine, ModelSpec
from pipelib.planner.strategy import Strategy
from pipelib.planner.timing import hardware_flops_per_token

UTILISATION = ("model", "hardware")  # what the published FLOP count includes: the model's, or also recomputation's

# Narayanan et al. 2021, Table 1's 145.6B and 1T models (vocabulary 51,200, sequences of 2048)
MEGATRON_146B = ModelSpec("GPT 145.6B", n_layer=80, hidden=12288, n_head=96, vocab=51200, seq_len=2048)
MEGATRON_1T = ModelSpec("GPT 1T", n_layer=128, hidden=25600, n_head=160, vocab=51200, seq_len=2048)
# Llama 3 405B (Dubey et al. 2024, table 3), planned as 128 layers (module docstring)
LLAMA3_405B_STAGED = ModelSpec("Llama 3 405B (126 layers planned as 128)", n_layer=128, hidden=16384, n_head=128,
                               vocab=128256, seq_len=8192, n_kv_head=8, ffn=53248, tied=False, gated=True,
                               learned_positions=False)
SELENE = Machine(PROFILES["a100"], gpus_per_node=8, inter_node=Link("ib-hdr", alpha=5e-6, beta=25e9))
META_H100 = Machine(PROFILES["h100"], gpus_per_node=8, inter_node=LINKS["ib-ndr"])


@dataclass(frozen=True)
class PublishedRun:
    """One published training configuration and the utilisation it reported."""

    name: str
    model: ModelSpec
    machine: Machine
    n_devices: int
    global_batch: int
    degrees: tuple[int, int, int, int] | None   # dp, tp, pp, cp; None where not published
    utilisation: float
    counts: str                          # one of UTILISATION
    source: str
    known: tuple = ()                    # (Strategy field, values the run could have used), as published

    def allows(self, c: Candidate) -> bool:
        lay = c.layout
        return ((self.degrees is None or (lay.dp, lay.tp, lay.pp, lay.cp) == self.degrees)
                and all(getattr(lay, f) in values for f, values in self.known))


# the schedules both papers describe (1F1B and its interleaved form); zero-bubble schedules came later
THEIR_SCHEDULES = ("schedule", tuple(n for n, info in REGISTRY.items() if info.in_megatron))
# Megatron-LM in 2021: full recomputation, plain data parallelism (no optimizer sharding yet)
MEGATRON_KNOWN = (THEIR_SCHEDULES, ("recompute", ("full",)), ("zero", (0,)))
PUBLISHED = (
    PublishedRun("GPT 145.6B, Megatron-LM", MEGATRON_146B, SELENE, 1536, 2304, (24, 8, 8, 1), 0.47, "hardware",
                 "Narayanan et al. 2021, Table 1", known=MEGATRON_KNOWN),
    PublishedRun("GPT 1T, Megatron-LM", MEGATRON_1T, SELENE, 3072, 3072, (6, 8, 64, 1), 0.52, "hardware",
                 "Narayanan et al. 2021, Table 1", known=MEGATRON_KNOWN),
    PublishedRun("GPT-3 175B, Megatron-LM", GPT3_175B, SELENE, 1024, 1536, None, 140 / 312, "hardware",
                 "Narayanan et al. 2021, section 5.1", known=MEGATRON_KNOWN),
    PublishedRun("Llama 3 405B, 8,192 GPUs", LLAMA3_405B_STAGED, META_H100, 8192, 2048, (64, 8, 16, 1), 0.43,
                 "model", "Dubey et al. 2024, Table 4", known=(THEIR_SCHEDULES,)),
    PublishedRun("Llama 3 405B, 16,384 GPUs", LLAMA3_405B_STAGED, META_H100, 16384, 2048, (128, 8, 16, 1), 0.41,
                 "model", "Dubey et al. 2024, Table 4", known=(THEIR_SCHEDULES,)),
)


def utilisation(c: Candidate, model: ModelSpec, machine: Machine, n_devices: int, counts: str) -> float:
    """The candidate's FLOPs utilisation as the publication counts it: model FLOPs (`c.mfu`) or
    hardware FLOPs (recomputation's included) over the devices' dense peak."""
    if counts not in UTILISATION:
        raise ValueError(f"counts={counts!r}; use one of {UTILISATION}")
    if counts == "model":
        return c.mfu
    return hardware_flops_per_token(model, c.layout) * c.tokens_per_s / (n_devices * machine.device.flops)


def _ranked(run: PublishedRun, efficiency: float) -> tuple[list[Candidate], int]:
    """Every feasible plan, fastest first, and the index of the fastest the run could have used
    (its degrees and what else it published, `PublishedRun.known`)."""
    machine = replace(run.machine, efficiency=efficiency)
    found = search(run.model, machine, run.n_devices, run.global_batch, cp=(run.degrees or (1, 1, 1, 1))[3:])
    at = next((i for i, c in enumerate(found) if run.allows(c)), None)
    if at is None:
        raise ValueError(f"{run.name}: no feasible plan with (dp, tp, pp, cp) = {run.degrees} and {dict(run.known)} "
                         f"on {run.n_devices} x {machine.device.name}; the planner finds it does not fit")
    return found, at


def predicted(run: PublishedRun, efficiency: float) -> float:
    """The utilisation the planner predicts for `run`'s degrees at `efficiency`, counted as published."""
    found, at = _ranked(run, efficiency)
    return utilisation(found[at], run.model, replace(run.machine, efficiency=efficiency), run.n_devices, run.counts)


def calibrate(run: PublishedRun, lo: float = 0.05, hi: float = 1.0, steps: int = 40) -> float:
    """The efficiency at which the planner's prediction of `run` equals its published
    utilisation (bisection; predictions rise with efficiency); a ValueError if none in (lo, hi]."""
    if not predicted(run, lo) <= run.utilisation <= predicted(run, hi):
        raise ValueError(f"{run.name}: published {run.utilisation:.0%} is outside what efficiency in "
                         f"[{lo}, {hi}] predicts; check the run's figures")
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(run, mid) < run.utilisation else (lo, mid)
    return (lo + hi) / 2


def comparison(runs=PUBLISHED, calibrate_on: int = 0) -> tuple[float, list[dict]]:
    """(efficiency, rows): the efficiency fitted on `runs[calibrate_on]`, and for every run its
    published degrees, the planner's plan with them, its rank among all feasible plans, the
    predicted and published utilisation and the error, and the planner's own first choice."""
    eff = calibrate(runs[calibrate_on])
    rows = []
    for i, run in enumerate(runs):
        found, at = _ranked(run, eff)
        machine = replace(run.machine, efficiency=eff)
        mine = utilisation(found[at], run.model, machine, run.n_devices, run.counts)
        rows.append({"run": run.name, "source": run.source, "counts": run.counts, "calibration": i == calibrate_on,
                     "degrees": run.degrees, "plan": found[at], "rank": at + 1, "feasible": len(found),
                     "published": run.utilisation, "predicted": mine, "error": mine / run.utilisation - 1,
                     "best": found[0],
                     "best_utilisation": utilisation(found[0], run.model, machine, run.n_devices, run.counts)})
    return eff, rows


def balanced_stage_memory(model: ModelSpec, lay: Strategy, m: int, fewer: int) -> list[dict]:
    """Bytes of every pipeline stage, itemised, with `fewer` layers taken off the first and the
    last stage (Llama 3's balance, Dubey et al. 2024, section 3.3.2: the first stage holds the
    embedding and the most microbatches in flight, the last the output layer): stage s holds
    its layers' states and, at its peak, the microbatches its schedule keeps in flight there,
    replayed from the schedule's own actions (1F1B's min(p - s, m)), of its layers'
    activations (`planner.memory`'s formulas, the same per layer). One stage per rank."""
    from pipelib.pipeline.schedules.ir import Op
    from pipelib.pipeline.schedules.registry import make_schedule, schedule_info

    if lay.pp < 2 or schedule_info(lay.schedule).chunked:
        raise ValueError(f"balanced_stage_memory: schedule={lay.schedule!r}, pp={lay.pp}, virtual={lay.virtual}; "
                         f"it counts a pipeline of one stage per rank (1F1B, GPipe, zero bubble)")
    sched = make_schedule(lay.schedule, lay.pp, m, None)
    even = model.n_layer // lay.pp
    out = []
    for s in range(lay.pp):
        held = peak = 0
        for act in sched.actions[s]:  # a forward saves a microbatch; the backward that ends it frees it
            held += 1 if act.op == Op.F else -1 if act.op in (Op.B, Op.W) else 0
            peak = max(peak, held)
        layers = even - fewer if s in (0, lay.pp - 1) else even
        mem = memory(replace(model, n_layer=layers * lay.pp), lay, m)  # the states of a stage of `layers`
        mem["activations"] = layers * layer_activation_bytes(model, lay) * peak
        out.append(mem)
    return out


def balanced(run: PublishedRun, efficiency: float, fewer: int = 1) -> dict:
    """`run`'s published degrees under 1F1B (`Strategy`'s default) and the recomputation policy (none or selective)
    that fits and runs fastest, each stage's memory counted with `fewer` layers off the first
    and last stage (`balanced_stage_memory`), the time of the evenly split model (its planned
    layers: within 1.6% of Llama 3's FLOPs). Nothing is fitted: `efficiency` is the one
    calibrated on another run. Returns the candidate, every stage's bytes, whether the fullest
    fits, and the utilisation predicted beside the published one."""
    machine = replace(run.machine, efficiency=efficiency)
    dp, tp, pp, cp = run.degrees
    tried = []
    for rc in ("none", "selective"):
        lay = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, zero=1, recompute=rc, micro_batch=1)  # 1F1B
        c = evaluate(run.model, machine, run.n_devices, run.global_batch, lay)
        stages = balanced_stage_memory(run.model, lay, run.global_batch // (dp * lay.micro_batch), fewer)
        fullest = max(sum(d.values()) for d in stages)
        tried.append({"plan": c, "stages": stages, "fullest": fullest, "fits": fullest <= machine.device.memory})
    fit = [t for t in tried if t["fits"]] or tried
    best = min(fit, key=lambda t: t["plan"].step_time)
    best["predicted"] = utilisation(best["plan"], run.model, machine, run.n_devices, run.counts)
    best["published"], best["error"] = run.utilisation, best["predicted"] / run.utilisation - 1
    return best
