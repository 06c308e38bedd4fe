"""The ping-pong lab: measure a link and the collectives, to fit and check the alpha-beta model.

Rank a sends n bytes to rank b, which sends them straight back; half the round trip is the
one-way time of an n-byte message. Over sizes from 1 byte to tens of MiB the points lie on
t(n) = alpha + n / beta (Hockney 1994): alpha, the latency, dominates small messages; beta, the
bandwidth, large ones. A least-squares fit gives both (`pipelib.comm.alphabeta.fit_alpha_beta`),
and from them the time of every collective (`pipelib.comm.alphabeta.predicted_time`, e.g. ring
all-reduce 2(N-1) alpha + 2(N-1)/N n / beta on N ranks). This module measures; `alphabeta`
computes. A simulated device's fit returns its profile's link exactly; cpu measures loopback TCP.

A ring keeps every link busy at once, and on a laptop the "links" are processes sharing a few
cores: a ping-pong between two ranks (one message in flight) overstates the bandwidth each
link gets then. `ring_shift` measures the link as a ring uses it (every rank sends to its right
neighbour and receives from its left at once, on the same world); `measure_collective` times a
collective the same way on every rank, so chapter 06 can set measured beside predicted:

    rows = cluster.run(lab.ring_shift, sizes)[0]
    alpha, beta = alphabeta.fit_alpha_beta([r["bytes"] for r in rows], [r["time"] for r in rows], relative=True)
    meas = cluster.run(lab.measure_collective, "all_reduce", sizes)[0]
    table = alphabeta.compare("all_reduce", meas, world_size, alpha, beta)

On real cores the reduction itself takes time too: `reduce_rate` measures it, and
``alphabeta.compare(..., gamma=1 / rate)`` adds the (N-1)/N n bytes each rank reduces (Thakur
et al. 2005).

Introduced in chapter 05; `ring_shift`, `measure_collective` and `reduce_rate` in chapter 06.
"""
from __future__ import annotations

import statistics

from pipelib.checks import check_int
from pipelib.comm.alphabeta import check_name  # noqa: F401 (the one name check, also here)
from pipelib.comm.registry import collective_info

DEFAULT_SIZES = tuple(2**k for k in range(0, 25, 2))  # 1 B .. 16 MiB (CI-sized; the book goes to 64 MiB)


def _check_repeats(repeats, warmup, what: str) -> None:
    check_int(repeats, "repeats", context=what, hint="timed runs per size; their median is kept")
    check_int(warmup, "warmup", minimum=0, context=what, hint="untimed runs before them")


def pingpong(sizes=DEFAULT_SIZES, repeats: int = 5, ranks=(0, 1), group=None, warmup: int = 1) -> list[dict] | None:
    """Run on every rank of the cluster (`cluster.run(pingpong, sizes)`); ranks outside `ranks`
    return None at once. Returns, on ranks[0] and ranks[1], one row per size: bytes, one-way time
    (median of `repeats` round trips, halved), best (the fastest: other programs only ever add
    time), times (all of them), bandwidth in bytes/s (from the median)."""
    _check_repeats(repeats, warmup, "pingpong")
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current

    me = dist.get_rank(group)
    a, b = ranks
    if me not in (a, b):
        return None
    dev, peer = current(), b if me == a else a
    rows = []
    for n in sizes:
        buf = torch.zeros(max(int(n), 1), dtype=torch.uint8, device=dev.torch_device)
        label = f"ping {n} B"
        times = []
        for i in range(warmup + repeats):
            t0 = dev.now()
            with dev.activity.doing(f"ping-pong {n} bytes with rank {peer}"):
                if me == a:
                    comms.send(buf, peer, group, label=label, check=False)
                    comms.recv(buf, peer, group, label=label, check=False)
                else:
                    comms.recv(buf, peer, group, label=label, check=False)
                    comms.send(buf, peer, group, label=label, check=False)
            if i >= warmup:
                times.append((dev.now() - t0) / 2)
        t = statistics.median(times)
        rows.append({"bytes": buf.numel(), "time": t, "best": min(times), "times": times,
                     "bandwidth": buf.numel() / t if t > 0 else float("inf")})
    return rows


# ------------------------------------------------------------------ chapter 06: rings and collectives
def _start(dev, group) -> float:
    """A common start on every rank: a barrier on a real device; on a virtual clock, every
    clock moves to the latest one (a barrier in modelled time; gloo's own barrier takes none)."""
    import torch
    import torch.distributed as dist

    if not dev.clock.virtual:
        dist.barrier(group=group)
        return dev.now()
    t = torch.tensor([dev.now()], dtype=torch.float64, device=dev.torch_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    dev.clock.wait_until(float(t))
    return float(t)


def _slowest(times: list[list[float]], group) -> list[list[float]]:
    """Per repeat, the time of the slowest rank (a collective ends when its last rank does)."""
    import torch
    import torch.distributed as dist

    from pipelib.runtime.device import current

    t = torch.tensor(times, dtype=torch.float64, device=current().torch_device)  # NCCL reduces GPU tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def _rows(sizes, times) -> list[dict]:
    return [{"bytes": int(n), "time": statistics.median(ts), "times": ts,
             "bandwidth": n / statistics.median(ts) if statistics.median(ts) > 0 else float("inf")}
            for n, ts in zip(sizes, times)]


def ring_shift(sizes=DEFAULT_SIZES, repeats: int = 5, group=None, warmup: int = 1) -> list[dict] | None:
    """Run on every rank: each rank sends n bytes to its right neighbour and receives n from its
    left, all at once (one ring step; on 2 ranks, an exchange). Returns, on every rank, one row
    per size: bytes, time (median over `repeats` of the slowest rank), the per-link bandwidth
    while every link is busy. Fit alpha and beta to it to predict a ring on this world size."""
    _check_repeats(repeats, warmup, "ring_shift")
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current

    if dist.get_rank(group) < 0:
        return None
    dev, n, me = current(), dist.get_world_size(group), dist.get_rank(group)
    if n < 2:
        raise ValueError(f"ring_shift needs a group of at least 2 ranks, got {n}")
    right, left = (me + 1) % n, (me - 1) % n
    times = []
    for size in sizes:
        out, into = (torch.zeros(max(int(size), 1), dtype=torch.uint8, device=dev.torch_device),
                     torch.empty(max(int(size), 1), dtype=torch.uint8, device=dev.torch_device))
        ts = []
        for i in range(warmup + repeats):
            t0 = _start(dev, group)
            comms.wait_all(comms.batch_isend_irecv([  # one exchange: on 2 ranks left is right
                comms.P2POp("recv", into, left, group, label=f"shift {size} B"),
                comms.P2POp("send", out, right, group, label=f"shift {size} B")], check=False))
            if i >= warmup:
                ts.append(dev.now() - t0)
        times.append(ts)
    return _rows([max(int(s), 1) for s in sizes], _slowest(times, group))


def measure_collective(name: str = "all_reduce", sizes=DEFAULT_SIZES, repeats: int = 5, group=None,
                       warmup: int = 1, *, builtin: bool = False, **kw) -> list[dict] | None:
    """Run on every rank: time collective `name` of `pipelib.comm.registry` (or, with
    ``builtin=True``, its twin: torch's built-in on gloo) on a float32 tensor of each size in
    bytes (all_gather: one rank's input), from a common start (`_start`) to the end of the
    slowest rank. Returns, on every rank, one row per size: bytes, time (median over
    `repeats`), times, bandwidth. `kw` goes to the collective (check=False, segment_bytes=...).
    Sizes are rounded down to whole floats, and for a built-in that needs it
    (`CollectiveInfo.twin_even`: gloo's reduce_scatter) to a multiple of the world size."""
    _check_repeats(repeats, warmup, "measure_collective")
    import torch
    import torch.distributed as dist

    from pipelib.runtime.device import current

    info = collective_info(name)
    if dist.get_rank(group) < 0:
        return None
    dev, n = current(), dist.get_world_size(group)
    sizes = [max(int(s) // 4, 1) for s in sizes]
    if builtin and info.twin_even:
        sizes = [max(s // n, 1) * n for s in sizes]
    times = []
    for numel in sizes:
        x, ts = torch.ones(numel, device=dev.torch_device), []
        for i in range(warmup + repeats):
            y = x.clone()
            t0 = _start(dev, group)
            if builtin:
                info.twin(y, group)
            else:
                info.run(y, group, **kw)
            dev.synchronize()  # on cuda: done, not only queued
            if i >= warmup:
                ts.append(dev.now() - t0)
        times.append(ts)
    return _rows([4 * s for s in sizes], _slowest(times, group))


def reduce_rate(sizes=DEFAULT_SIZES, repeats: int = 5, group=None, warmup: int = 1) -> list[dict] | None:
    """Run on every rank: time the local reduction of the rings (``torch.add(a, b, out=a)`` on
    float32 tensors of each size in bytes), all ranks at once as in a collective (they share
    the cores). Returns, on every rank, rows of bytes, time (median of the slowest rank),
    bandwidth; ``1 / alphabeta.fit_alpha_beta(...)[1]`` is gamma, seconds per byte reduced."""
    _check_repeats(repeats, warmup, "reduce_rate")
    import time

    import torch
    import torch.distributed as dist

    from pipelib.runtime.device import current

    if dist.get_rank(group) < 0:
        return None
    dev, sizes, times = current(), [max(int(s) // 4, 1) for s in sizes], []
    for numel in sizes:
        a, b, ts = torch.ones(numel, device=dev.torch_device), torch.ones(numel, device=dev.torch_device), []
        for i in range(warmup + repeats):
            _start(dev, group)
            t0 = time.perf_counter()
            torch.add(a, b, out=a)
            dev.synchronize()  # on cuda the add is only launched: time the kernel, not the launch
            if i >= warmup:
                ts.append(time.perf_counter() - t0)
        times.append(ts)
    return _rows([4 * s for s in sizes], _slowest(times, group))


# ------------------------------------------------------------------ chapter 05's small experiments
def overlap_demo(mode: str, delay: float = 0.05, work: float = 0.05, numel: int = 1024) -> float | None:
    """Rank 1 posts its receive `delay` seconds late; rank 0 sends, then computes for `work`
    seconds. gloo sends are rendezvous, so a *blocking* send holds rank 0 until rank 1 is
    ready: delay + work. With `isend` the compute overlaps the wait: max(delay, work).
    Returns rank 0's elapsed seconds (None elsewhere). Run it on the cpu device. A barrier
    first: `cluster.run` reaches the engines one after the other, a skew rank 1's delay lacks."""
    import time

    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current

    r = dist.get_rank()
    x = torch.ones(numel, device=current().torch_device)
    dist.barrier()
    if r == 1:
        time.sleep(delay)
        comms.recv(x, 0)
        return None
    if r != 0:
        return None
    t0 = time.perf_counter()
    if mode == "blocking":
        comms.send(x, 1)
        time.sleep(work)  # stands for compute that does not need the message
    elif mode == "nonblocking":
        h = comms.isend(x, 1)
        time.sleep(work)
        h.wait()
    else:
        raise ValueError(f"mode must be 'blocking' or 'nonblocking', got {mode!r}")
    return time.perf_counter() - t0


def exchange(mode: str, numel: int = 4) -> float | None:
    """Ranks 0 and 1 swap a tensor. ``"send-first"``: both send, then receive: with rendezvous
    sends each waits for the other's receive, forever (a deadlock). ``"isend"``: post the send,
    then receive. ``"ordered"``: rank 0 sends first, rank 1 receives first. Returns what this
    rank received (its peer's rank), None on other ranks."""
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current

    r = dist.get_rank()
    if r > 1:
        return None
    peer, device = 1 - r, current().torch_device
    mine, theirs = torch.full((numel,), float(r), device=device), torch.empty(numel, device=device)
    if mode == "send-first":
        comms.send(mine, peer, label="swap")
        comms.recv(theirs, peer, label="swap")
    elif mode == "isend":
        h = comms.isend(mine, peer, label="swap")
        comms.recv(theirs, peer, label="swap")
        h.wait()
    elif mode == "ordered":
        if r == 0:
            comms.send(mine, peer, label="swap")
            comms.recv(theirs, peer, label="swap")
        else:
            comms.recv(theirs, peer, label="swap")
            comms.send(mine, peer, label="swap")
    else:
        raise ValueError(f"mode must be 'send-first', 'isend' or 'ordered', got {mode!r}")
    return theirs[0].item()
