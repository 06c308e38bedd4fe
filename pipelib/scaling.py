"""Amdahl's and Gustafson's laws, their fits to measured speedups, and the predicted step time.

Notation as in the book (book/notation.md): s is the serial fraction, N the number of workers
(the argument `k` of these functions, and the key "k" of their rows).

Amdahl (1967), strong scaling: a fixed problem with serial fraction s on N workers runs
    T(N) = T(1) * (s + (1 - s) / N),   speedup S(N) = 1 / (s + (1 - s) / N) <= 1 / s.
Gustafson (1988), weak scaling: the parallel part grows with N, the serial part does not;
with s the serial share of the time on N workers, the scaled speedup is
    S(N) = s + (1 - s) * N.

Pure (DESIGN.md section 2): the laws, their fits, the speedup table and the time the cost model
predicts for the experiment; no torch, no process. The experiment itself runs on a cluster:
`pipelib.scaling_step`.

Introduced in chapter 04.
"""
from __future__ import annotations

import math

MATMUL_N = 96  # each unit of work is one (N, N) @ (N, N) product: 2 N^3 FLOPs


def amdahl_speedup(s: float, k):
    """Strong-scaling speedup on k workers for serial fraction s."""
    _check_fraction(s)
    return 1.0 / (s + (1.0 - s) / k)


def gustafson_speedup(s: float, k):
    """Weak-scaling (scaled) speedup on k workers for serial fraction s."""
    _check_fraction(s)
    return s + (1.0 - s) * k


def _check_fraction(s):
    if not 0.0 <= s <= 1.0:
        raise ValueError(f"serial fraction must be in [0, 1], got {s}")


def fit_amdahl(ks, speedups) -> float:
    """Least-squares serial fraction s from measured speedups.

    1 / S(k) = s + (1 - s) / k is linear in s:  1/S - 1/k = s (1 - 1/k).
    """
    num = sum((1 / S - 1 / k) * (1 - 1 / k) for k, S in zip(ks, speedups))
    den = sum((1 - 1 / k) ** 2 for k in ks)
    if den == 0:
        raise ValueError("need at least one measurement with k > 1 to fit a serial fraction")
    return min(1.0, max(0.0, num / den))


def fit_gustafson(ks, speedups) -> float:
    """Least-squares serial fraction s from scaled speedups: S(k) - k = s (1 - k)."""
    num = sum((S - k) * (1 - k) for k, S in zip(ks, speedups))
    den = sum((1 - k) ** 2 for k in ks)
    if den == 0:
        raise ValueError("need at least one measurement with k > 1 to fit a serial fraction")
    return min(1.0, max(0.0, num / den))


def unit_flops() -> int:
    """FLOPs of one unit of work: one (N, N) @ (N, N) product."""
    return 2 * MATMUL_N ** 3


def strong_split(k: int, total_units: int, serial_fraction: float) -> tuple[int, list[int]]:
    """Amdahl's fixed problem cut for k workers: (rank 0's serial units, each rank's parallel
    units), the parallel units dealt out as evenly as whole units allow."""
    serial = round(total_units * serial_fraction)
    par = total_units - serial
    return serial, [par // k + (1 if r < par % k else 0) for r in range(k)]


def speedup_table(ks, times) -> list[dict]:
    t1 = times[0] if ks[0] == 1 else None
    if t1 is None:
        raise ValueError(f"the first measurement must be k=1, got k={ks[0]}")
    return [{"k": k, "time": t, "speedup": t1 / t, "efficiency": t1 / t / k} for k, t in zip(ks, times)]


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def relative_error(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), math.ulp(1.0))


def predict_strong_time(profile, k: int, total_units: int, serial_fraction: float) -> float:
    """The step time the cost model predicts for `scaling_step.strong_scaling_step` on a simulated device.

    Rank 0 computes the serial part, its messages arrive one link time later, every worker
    computes its share, and the results travel back: T = max(rank 0's end, last arrival).
    """
    unit = unit_flops() / profile.flops
    serial, share = strong_split(k, total_units, serial_fraction)
    link = profile.message_time(8 * 4)  # the input token and each result: 8 float32
    t_serial = serial * unit
    ends = [t_serial + share[0] * unit]
    ends += [t_serial + link + share[r] * unit + link for r in range(1, k)]
    return max(ends)
