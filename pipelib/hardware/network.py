"""Networks measured: an HTTP round trip on loopback, and a ping-pong between two engines.

Rank 0 sends n bytes to a peer, which sends them straight back: half the round trip is the
one-way time. Tiny messages measure the latency alpha, large ones the bandwidth beta, and
alpha + n / beta is the link model (Hockney 1994) every cost estimate of the book uses. This is
chapter 01's raw torch.distributed version, which keeps the *best* of the repeats; chapter 05
returns to it with `pipelib.comm.lab.pingpong` (timed, traced messages) and fits the model by
least squares (`pipelib.comm.alphabeta.fit_alpha_beta`).

Introduced in chapter 01.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from pipelib.checks import check_int
from pipelib.hardware.machine import synchronize


def http_roundtrip(requests: int = 20, nbytes: int = 1024) -> float:
    """Median seconds for one HTTP GET of `nbytes` from a server on this machine (loopback).

    Client and server in one process, on 127.0.0.1: the client opens a TCP connection, sends
    "GET / HTTP/1.1", the server answers "200 OK" and the bytes. Nothing leaves the machine.
    """
    import http.server
    import threading
    import urllib.request

    body = b"x" * nbytes

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the name http.server calls)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # keep the notebook quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    try:
        times = []
        for _ in range(requests + 1):
            t0 = time.perf_counter()
            with opener.open(url, timeout=5) as r:
                if len(r.read()) != nbytes:
                    raise OSError(f"expected {nbytes} bytes from {url}")
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def pingpong_times(sizes_bytes, repeats: int = 10, peer: int = 1, device=None) -> dict | None:
    """Run on every rank of a cluster: rank 0 and `peer` bounce messages; others do nothing.

    Rank 0 sends n bytes to `peer`, which sends them straight back; a round trip moves 2n bytes.
    Returns, on rank 0, {n: [one-way seconds = round trip / 2, ...]} (None elsewhere).
    torch.distributed's blocking send/recv on the default group (gloo on CPU, NCCL on GPUs).
    `summarize_pingpong` turns the times into a `LinkMeasurement`.
    """
    import torch.distributed as dist

    check_int(repeats, "repeats", context="pingpong_times", hint="round trips per size; the best is kept")
    check_int(peer, "peer", context="pingpong_times", hint="the rank that bounces rank 0's messages back")

    if device is None:
        from pipelib.runtime.device import current

        device = current().torch_device
    rank = dist.get_rank()
    if rank not in (0, peer):
        return None
    other = peer if rank == 0 else 0
    out = {}
    for n in sizes_bytes:
        buf = torch.zeros(max(1, n), dtype=torch.uint8, device=device)
        times = []
        # small messages cost microseconds: sample them 8x more, so that on a machine whose cores
        # are busy with other processes some round trips run without waiting for a time slice
        reps = repeats * 8 if n <= 64 * 1024 else repeats
        for i in range(reps + 1):  # the first round trip warms the connection up
            synchronize(device)
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, other)
                dist.recv(buf, other)
            else:
                dist.recv(buf, other)
                dist.send(buf, other)
            synchronize(device)
            if i:
                times.append((time.perf_counter() - t0) / 2)
        out[buf.numel()] = times
    return out if rank == 0 else None


@dataclass(frozen=True)
class LinkMeasurement:
    """One-way time per message size, and the alpha-beta link two of them define."""

    sizes: tuple        # bytes
    one_way: tuple      # best one-way seconds per size over the repeats
    latency: float      # alpha: the least one-way time (small messages)
    bandwidth: float    # beta: the most bytes / second any size reached (large messages)

    def link(self, name: str = "measured"):
        """A costmodel.Link: alpha + n / beta seconds for n bytes."""
        from pipelib.costmodel import Link

        return Link(name, self.latency, self.bandwidth)


def summarize_pingpong(times: dict) -> LinkMeasurement:
    """Best one-way time per size over the repeats: other processes on a busy machine can only
    add time, so the minimum is what the link itself can do (the usual rule for latency
    benchmarks). The latency is the least of them (a tiny message costs only alpha) and the
    bandwidth the best n / t."""
    sizes = tuple(sorted(times))
    best = tuple(min(times[n]) for n in sizes)
    return LinkMeasurement(sizes, best, min(best), max(n / t for n, t in zip(sizes, best)))
