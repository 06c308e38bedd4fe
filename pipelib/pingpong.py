"""The ping-pong lab: measure a link, fit the alpha-beta model, predict the collectives.

Rank a sends n bytes to rank b, which sends them straight back; half the round trip is the
one-way time of an n-byte message. Over sizes from 1 byte to tens of MiB the points lie on
t(n) = alpha + n / beta (Hockney 1994): alpha, the latency, dominates small messages; beta, the
bandwidth, large ones. A least-squares fit gives both, and from them the time of every
collective (`pipelib.collectives.predicted_time`, e.g. ring all-reduce
2(n-1) alpha + 2(n-1)/n N / beta).

On a simulated device the fit returns the profile's link exactly (a test checks it); on the
cpu device it measures loopback TCP through gloo.

Introduced in chapter 05.
"""
from __future__ import annotations

import statistics

DEFAULT_SIZES = [2**k for k in range(0, 25, 2)]  # 1 B .. 16 MiB (CI-sized; the book goes to 64 MiB)


def pingpong(sizes=DEFAULT_SIZES, repeats: int = 5, ranks=(0, 1), group=None, warmup: int = 1) -> list[dict] | None:
    """Run on every rank of the cluster (`cluster.run(pingpong, sizes)`); ranks outside `ranks`
    return None at once. Returns, on ranks[0] and ranks[1], one row per size: bytes, one-way time
    (median over `repeats` round trips, halved), bandwidth in bytes/s."""
    import torch
    import torch.distributed as dist

    from . import comms
    from .device import current

    me = dist.get_rank(group)
    a, b = ranks
    if me not in (a, b):
        return None
    dev, peer = current(), b if me == a else a
    rows = []
    for n in sizes:
        buf = torch.zeros(max(int(n), 1), dtype=torch.uint8)
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
        rows.append({"bytes": buf.numel(), "time": t, "bandwidth": buf.numel() / t if t > 0 else float("inf")})
    return rows


def fit_alpha_beta(nbytes, times) -> tuple[float, float]:
    """Least squares of t = alpha + n / beta; returns (alpha seconds, beta bytes/s).

    Ordinary least squares weighs the big messages most, which is what beta needs; alpha comes
    out of the intercept (chapter 05 shows the residuals)."""
    xs, ys = [float(x) for x in nbytes], [float(y) for y in times]
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError(f"need at least two different message sizes to fit alpha and beta, got {xs}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        raise ValueError(f"time does not grow with size (slope {slope:.3g} s/B): measure larger messages")
    return my - slope * mx, 1.0 / slope


def predict(nbytes, alpha: float, beta: float) -> list[float]:
    """The fitted line at each size."""
    return [alpha + n / beta for n in nbytes]


def predict_collectives(nbytes: int, n: int, alpha: float, beta: float) -> dict[str, float]:
    """Alpha-beta time of every from-scratch collective for an N-byte tensor on n ranks."""
    from .collectives import predicted_time

    names = ("broadcast", "reduce", "all_reduce_naive", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")
    return {k: predicted_time(k, nbytes, n, alpha, beta) for k in names}


# ------------------------------------------------------------------ chapter 05's small experiments
def overlap_demo(mode: str, delay: float = 0.05, work: float = 0.05, numel: int = 1024) -> float | None:
    """Rank 1 posts its receive `delay` seconds late; rank 0 sends, then computes for `work`
    seconds. gloo sends are rendezvous, so a *blocking* send holds rank 0 until rank 1 is
    ready: delay + work. With `isend` the compute overlaps the wait: max(delay, work).
    Returns rank 0's elapsed seconds (None elsewhere). Run it on the cpu device."""
    import time

    import torch
    import torch.distributed as dist

    from . import comms

    r = dist.get_rank()
    x = torch.ones(numel)
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

    from . import comms

    r = dist.get_rank()
    if r > 1:
        return None
    peer = 1 - r
    mine, theirs = torch.full((numel,), float(r)), torch.empty(numel)
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
