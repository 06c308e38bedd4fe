"""Memory bandwidth measured: the STREAM kernels, and read bandwidth by working-set size.

Bytes are the *compulsory* traffic, as STREAM counts them (McCalpin 1995): copy moves 2 words
per element, add and triad 3. `read_bandwidth_curve` reads one buffer over and over, so the
fastest level of the memory hierarchy that holds it (L1, L2, last-level cache, RAM) sets the
speed; `pipelib.viz.hardware.bandwidth_figure` draws it with the cache sizes marked.

Introduced in chapter 01.
"""
from __future__ import annotations

import torch

from pipelib.costmodel import MiB
from pipelib.hardware.machine import best_time, num_threads
from pipelib.hardware.roofline import MeasuredOp


def measure_stream(kind: str, numel: int, device="cpu", dtype=torch.float32,
                   threads: int | None = None, repeats: int = 5) -> MeasuredOp:
    """STREAM kernels: copy c = a (0 FLOPs, 2 words), add c = a + b (1, 3), triad c = a + s b (2, 3)."""
    a = torch.full((numel,), 1.0, device=device, dtype=dtype)
    b = torch.full((numel,), 2.0, device=device, dtype=dtype)
    c = torch.empty_like(a)
    fns = {"copy": (lambda: c.copy_(a), 0, 2), "add": (lambda: torch.add(a, b, out=c), 1, 3),
           "triad": (lambda: torch.add(a, b, alpha=3.0, out=c), 2, 3)}
    if kind not in fns:
        raise ValueError(f"kind must be one of {sorted(fns)}, got {kind!r}")
    fn, flops, words = fns[kind]
    with num_threads(threads):
        t = best_time(fn, device, repeats)
    return MeasuredOp(f"{kind} {numel * a.element_size() // MiB} MiB", flops * numel,
              words * numel * a.element_size(), t)


def read_bandwidth_curve(sizes_bytes, device="cpu", threads: int | None = 1,
                         repeats: int = 3, total_bytes: int = 256 * MiB) -> list[tuple[int, float]]:
    """Read bandwidth for working sets of each size: sum a buffer over and over.

    The buffer is viewed `total_bytes / size` times with stride 0 (`expand`), so one call reads
    the same bytes again and again from the fastest level of the memory hierarchy that holds
    them: L1, L2, last-level cache, then RAM. One thread by default: caches L1 and L2 are per
    core.
    """
    out = []
    for size in sizes_bytes:
        n = max(1, size // 4)
        x = torch.full((n,), 1.0, device=device)
        reps = max(1, total_bytes // (4 * n))
        xs = x.expand(reps, n)
        with num_threads(threads):
            t = best_time(xs.sum, device, repeats, min_seconds=0.005)
        out.append((4 * n, 4 * n * reps / t))
    return out
