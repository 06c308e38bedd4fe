"""How often to checkpoint: Young's interval, Daly's refinement, and the share of time lost.

    young_interval(save_s=30, mtbf_s=3 * 3600)    # sqrt(2 delta M) = 822 s
    daly_interval(save_s=30, mtbf_s=3 * 3600)     # a little less
    lost_fraction(interval_s, save_s, mtbf_s, restart_s)

A run that saves every tau seconds, each save taking delta, on a machine failing every M seconds
on average (the whole job's mean time between failures: one GPU's divided by the number of
GPUs), loses per unit of time the saves, delta / tau, plus on each failure the work since the
last save, about (tau + delta) / 2, and the restart R: a fraction

    lost(tau) ~ delta / tau + (tau + delta) / (2 M) + R / M,

smallest at tau = sqrt(2 delta M) (Young 1974, first order, delta << M). Daly (2006) solves the
exponential model to higher order: tau = sqrt(2 delta M) (1 + sqrt(delta / (2 M)) / 3 + delta /
(18 M)) - delta for delta < 2 M, else M. Llama 3 405B (Dubey et al. 2024): 466 interruptions in
54 days on 16,384 GPUs, M of about 2.8 hours for the job.

Pure arithmetic: no torch. Introduced in chapter 18.
"""
from __future__ import annotations

import math

LLAMA3_INTERRUPTIONS = 466
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384


def llama3_mtbf_s() -> float:
    """The Llama 3 405B job's mean time between interruptions, in seconds (54 days / 466)."""
    return LLAMA3_DAYS * 86_400 / LLAMA3_INTERRUPTIONS


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval, sqrt(2 delta M), in seconds."""
    if save_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"young_interval: save_s={save_s}, mtbf_s={mtbf_s}; both must be > 0")
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006), in seconds; M itself once delta >= 2 M."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    r = save_s / (2 * mtbf_s)
    return young_interval(save_s, mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_s


def lost_fraction(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """The first-order share of time lost to saves, recomputed work and restarts."""
    return save_s / interval_s + (interval_s + save_s) / (2 * mtbf_s) + restart_s / mtbf_s


def fit_save_time(mib, seconds) -> tuple[float, float]:
    """Least squares of measured save times against sizes: (fixed seconds, seconds per MiB);
    1 / slope is the bandwidth of a save, the fixed part its fsyncs, renames and manifest."""
    xs, ys = list(mib), list(seconds)
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError(f"fit_save_time: need two sizes or more, got {xs}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope
