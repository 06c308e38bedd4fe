"""Amdahl's and Gustafson's laws measured on a cluster (chapter 04); the laws and their fits are
`pipelib.scaling` (pure).

The experiment (`strong_scaling_step`, `weak_scaling_step`) runs on every rank of a cluster:
rank 0 does the serial part, sends the input to the other workers, all N workers do their share
of the parallel part as real matrix multiplications, and rank 0 gathers their results (one
8-float message each way per worker, `pipelib.comm.p2p`). On a simulated device the times come
from the FLOPs; on the cpu device they are measured, and the contention of N engines on a few
cores shows up as a larger fitted serial fraction.

The runtime layer (DESIGN.md section 2): torch, torch.distributed and the rank's `Device`,
imported inside the functions that run on the engines, so the notebook side stays light.
"""
from __future__ import annotations

from pipelib.scaling import MATMUL_N, median, speedup_table, strong_split, unit_flops


# ------------------------------------------------------------------ on the engines
def _work(units: int, x):
    """`units` real matmuls of (N, N); returns a small result so nothing is optimised away."""
    import torch

    acc = torch.zeros(MATMUL_N, MATMUL_N, device=x.device)
    for _ in range(units):
        acc += x @ x
    return acc[0, :8].clone()


def _scaling_step(k: int, serial_units: int, parallel_units_per_rank: list[int]):
    """One run on ranks 0..k-1 of the world: serial, scatter the go, parallel, gather.

    Returns the step time seen by each worker (rank 0's is the whole step)."""
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current
    from pipelib.runtime.place import to_rank_device

    dev, rank = current(), dist.get_rank()
    dist.barrier()  # start together (wall clock); the virtual clock was reset to 0 on every rank
    t0 = dev.clock.now()
    if rank >= k:
        return None
    g = torch.Generator().manual_seed(1234)
    x = to_rank_device(torch.randn(MATMUL_N, MATMUL_N, generator=g) / MATMUL_N)  # drawn on the CPU
    dev.memory.set("buffers", x.numel() * x.element_size(), "input matrix")
    token = torch.zeros(8, device=x.device)
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
        buf = torch.empty(8, device=x.device)
        for src in range(1, k):
            part += comms.recv(buf, src, label="result")
        return dev.clock.now() - t0
    comms.send(part, 0, label="result")
    return dev.clock.now() - t0


def strong_scaling_step(k: int, total_units: int, serial_fraction: float):
    """Amdahl: a fixed amount of work, `serial_fraction` of it on rank 0 alone."""
    return _scaling_step(k, *strong_split(k, total_units, serial_fraction))


def weak_scaling_step(k: int, serial_units: int, parallel_units_per_rank: int):
    """Gustafson: every worker gets the same parallel work; the serial part stays fixed."""
    return _scaling_step(k, serial_units, [parallel_units_per_rank] * k)


def single_rank_step(units: int):
    """The whole problem on rank 0 alone: the reference time T(1)."""
    return _scaling_step(1, units, [0])


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
