"""Amdahl's and Gustafson's laws, measured on the cluster and fitted.

Notation as in the book (book/notation.md): s is the serial fraction, N the number of workers
(the argument `k` of these functions, and the key "k" of their rows).

Amdahl (1967), strong scaling: a fixed problem with serial fraction s on N workers runs
    T(N) = T(1) * (s + (1 - s) / N),   speedup S(N) = 1 / (s + (1 - s) / N) <= 1 / s.
Gustafson (1988), weak scaling: the parallel part grows with N, the serial part does not;
with s the serial share of the time on N workers, the scaled speedup is
    S(N) = s + (1 - s) * N.

The experiment (`strong_scaling_step`, `weak_scaling_step`) runs on every rank of a cluster:
rank 0 does the serial part, sends the input to the other workers, all N workers do their share
of the parallel part as real matrix multiplications, and rank 0 gathers their results. On a
simulated device the times come from the FLOPs; on the cpu device they are measured, and the
contention of N engines on a few cores shows up as a larger fitted serial fraction.

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


# ------------------------------------------------------------------ on the engines
def _work(units: int, x):
    """`units` real matmuls of (N, N); returns a small result so nothing is optimised away."""
    import torch

    acc = torch.zeros(MATMUL_N, MATMUL_N)
    for _ in range(units):
        acc += x @ x
    return acc[0, :8].clone()


def unit_flops() -> int:
    return 2 * MATMUL_N ** 3


def _scaling_step(k: int, serial_units: int, parallel_units_per_rank: list[int]):
    """One run on ranks 0..k-1 of the world: serial, scatter the go, parallel, gather.

    Returns the step time seen by each worker (rank 0's is the whole step)."""
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current

    dev, rank = current(), dist.get_rank()
    dist.barrier()  # start together (wall clock); the virtual clock was reset to 0 on every rank
    t0 = dev.clock.now()
    if rank >= k:
        return None
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(MATMUL_N, MATMUL_N, generator=g) / MATMUL_N
    dev.memory.set("buffers", x.numel() * x.element_size(), "input matrix")
    token = torch.zeros(8)
    if rank == 0:
        with dev.compute("serial", flops=serial_units * unit_flops()):
            token += _work(serial_units, x)
        handles = [comms.isend(token, dst, label="input") for dst in range(1, k)]
    else:
        comms.recv(token, 0, label="input")
    with dev.compute("parallel", flops=parallel_units_per_rank[rank] * unit_flops()):
        part = _work(parallel_units_per_rank[rank], x)
    if rank == 0:
        comms.wait_all(handles)
        buf = torch.empty(8)
        for src in range(1, k):
            part += comms.recv(buf, src, label="result")
        return dev.clock.now() - t0
    comms.send(part, 0, label="result")
    return dev.clock.now() - t0


def strong_scaling_step(k: int, total_units: int, serial_fraction: float):
    """Amdahl: a fixed amount of work, `serial_fraction` of it on rank 0 alone."""
    serial = round(total_units * serial_fraction)
    par = total_units - serial
    share = [par // k + (1 if r < par % k else 0) for r in range(k)]
    return _scaling_step(k, serial, share)


def weak_scaling_step(k: int, serial_units: int, parallel_units_per_rank: int):
    """Gustafson: every worker gets the same parallel work; the serial part stays fixed."""
    return _scaling_step(k, serial_units, [parallel_units_per_rank] * k)


def single_rank_step(units: int):
    """The whole problem on rank 0 alone: the reference time T(1)."""
    return _scaling_step(1, units, [0])


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


# ------------------------------------------------------------------ from the notebook
def measure_strong(cluster, ks, total_units: int, serial_fraction: float, repeats: int = 1) -> list[dict]:
    """Strong scaling on ranks 0..k-1 for each k; rank 0's clock at the end is the step time.

    One untimed run on every rank first (a fresh engine's first run pays one-off costs), then
    the best of `repeats` per k: on a shared machine noise only ever adds time, and a slow T(1)
    would inflate every speedup. On a simulated device every repeat is the same.
    """
    cluster.reset()
    cluster.run(strong_scaling_step, max(ks), total_units, serial_fraction)
    times = []
    for k in ks:
        runs = []
        for _ in range(repeats):
            cluster.reset()
            runs.append(cluster.run(strong_scaling_step, k, total_units, serial_fraction)[0])
        times.append(min(runs))
    return speedup_table(list(ks), times)


def measure_weak(cluster, ks, serial_units: int, per_rank_units: int, repeats: int = 1) -> list[dict]:
    """Weak scaling: T(k) with k workers against one rank doing the same scaled problem."""
    rows = []
    for k in ks:
        tk, t1 = [], []
        for _ in range(repeats):
            cluster.reset()
            tk.append(cluster.run(weak_scaling_step, k, serial_units, per_rank_units)[0])
            cluster.reset()
            t1.append(cluster.run(single_rank_step, serial_units + k * per_rank_units)[0])
        rows.append({"k": k, "time": median(tk), "time_one_rank": median(t1),
                     "scaled_speedup": median(t1) / median(tk)})
    return rows


def predict_strong_time(profile, k: int, total_units: int, serial_fraction: float) -> float:
    """The step time the cost model predicts for `strong_scaling_step` on a simulated device.

    Rank 0 computes the serial part, its messages arrive one link time later, every worker
    computes its share, and the results travel back: T = max(rank 0's end, last arrival).
    """
    unit = unit_flops() / profile.flops
    serial = round(total_units * serial_fraction)
    par = total_units - serial
    share = [par // k + (1 if r < par % k else 0) for r in range(k)]
    link = profile.message_time(8 * 4)  # the input token and each result: 8 float32
    t_serial = serial * unit
    ends = [t_serial + share[0] * unit]
    ends += [t_serial + link + share[r] * unit + link for r in range(1, k)]
    return max(ends)
