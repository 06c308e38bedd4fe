"""The machine measured: FLOP/s, memory and file bandwidth, engine-to-engine links, the roofline.

Every number a chapter states about "this machine" comes from here, measured live; published
figures of GPUs and interconnects sit beside them in `PUBLISHED`, each with its datasheet. The
same functions measure a GPU when given `device="cuda"` (they synchronise before reading the
clock).

Conventions (say them, or the numbers mean nothing):

- throughput is the *best* of several repeats: a shared laptop's noise only ever slows a run down;
- a matmul of (m, k) @ (k, n) does 2 m k n FLOPs (`costmodel.matmul_flops`);
- bytes are the *compulsory* traffic, each input read once and each output written once, as
  STREAM counts them (McCalpin 1995: copy moves 2 words per element, triad 3). A written-out
  attention also writes and reads its T x T score matrix, and that is counted;
- the roofline (Williams, Waterman and Patterson 2009): an op of intensity I = FLOPs / byte can
  at best reach min(peak, bandwidth * I) FLOP/s. Here the roof is built from *measured* peak
  and bandwidth, not from a datasheet.

Introduced in chapter 01; the ping-pong returns in chapter 05, which fits the alpha-beta model.
"""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from pipelib.costmodel import LINKS, PROFILES, GiB, KiB, MiB, matmul_flops

SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide (exp counted as one FLOP)


# ----------------------------------------------------------------------------- the machine
@dataclass(frozen=True)
class MachineInfo:
    """What this machine says it is (/proc/cpuinfo, sysfs, torch)."""

    cpu: str
    cores: int            # cores this process may use
    memory_bytes: int     # RAM
    caches: tuple         # ((level, type, bytes), ...) of core 0
    system: str
    torch: str
    gpu: str | None

    @property
    def label(self) -> str:
        """Names the measuring machine in every figure and table."""
        gpu = f", {self.gpu}" if self.gpu else ""
        return f"{self.cpu}, {self.cores} cores, {self.memory_bytes / GiB:.0f} GiB{gpu}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _caches() -> tuple:
    out, base = [], "/sys/devices/system/cpu/cpu0/cache"
    for i in range(8):
        try:
            read = lambda f: open(f"{base}/index{i}/{f}").read().strip()  # noqa: E731
            level, kind, size = int(read("level")), read("type"), read("size")
        except OSError:
            break
        mult = {"K": KiB, "M": MiB, "G": GiB}.get(size[-1], 1)
        out.append((level, kind, int(size.rstrip("KMG")) * mult))
    return tuple(out)


def machine_info() -> MachineInfo:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = 0
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return MachineInfo(_cpu_model(), cores, mem, _caches(), f"{platform.system()} {platform.release()}",
                       torch.__version__, gpu)


# ----------------------------------------------------------------------------- timing
@contextlib.contextmanager
def num_threads(n: int | None):
    """Run the body with torch using n threads (None: leave as is)."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def best_time(fn, device="cpu", repeats: int = 5, min_seconds: float = 0.01) -> float:
    """Seconds per call of fn: best of `repeats`, each long enough (min_seconds) to time well."""
    fn()  # warm-up: first-call allocations, lazy init
    _sync(device)
    inner, t = 1, 0.0
    while True:  # calibrate how many calls one repeat makes
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        t = time.perf_counter() - t0
        if t >= min_seconds or inner >= 2**20:
            break
        inner *= 2 if t == 0 else max(2, min(16, int(min_seconds / t) + 1))
    times = [t / inner]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


# ----------------------------------------------------------------------------- operations
@dataclass(frozen=True)
class Op:
    """One measured operation: its FLOPs, its compulsory bytes and its best time."""

    name: str
    flops: float
    nbytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte of memory traffic."""
        return self.flops / self.nbytes

    @property
    def achieved(self) -> float:
        """FLOP/s reached."""
        return self.flops / self.seconds

    @property
    def bandwidth(self) -> float:
        """Bytes per second moved."""
        return self.nbytes / self.seconds


def measure_matmul(n: int, device="cpu", dtype=torch.float32, threads: int | None = None,
                   repeats: int = 5) -> Op:
    """(n, n) @ (n, n): 2 n^3 FLOPs over 3 n^2 elements (A and B read, C written)."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    c = torch.empty(n, n, device=device, dtype=dtype)
    with num_threads(threads):
        t = best_time(lambda: torch.matmul(a, b, out=c), device, repeats)
    return Op(f"matmul {n}", matmul_flops(n, n, n), 3 * n * n * a.element_size(), t)


def measure_stream(kind: str, numel: int, device="cpu", dtype=torch.float32,
                   threads: int | None = None, repeats: int = 5) -> Op:
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
    return Op(f"{kind} {numel * a.element_size() // MiB} MiB", flops * numel,
              words * numel * a.element_size(), t)


def measure_softmax(rows: int, cols: int, device="cpu", threads: int | None = None,
                    repeats: int = 5) -> Op:
    """Row softmax: about 5 FLOPs per element over 2 words (read x, write y)."""
    x = torch.randn(rows, cols, device=device)
    with num_threads(threads):
        t = best_time(lambda: torch.softmax(x, dim=-1), device, repeats)
    n = rows * cols
    return Op(f"softmax {rows}x{cols}", SOFTMAX_FLOPS_PER_ELEMENT * n, 2 * 4 * n, t)


def measure_attention(heads: int, seq: int, head_size: int, written_out: bool = True,
                      device="cpu", threads: int | None = None, repeats: int = 5) -> Op:
    """softmax(q k^T / sqrt(d)) v over `heads` (batch x heads) independent heads, fp32.

    FLOPs: 4 h T^2 d for the two products, 5 h T^2 for the softmax. Bytes: q, k, v read and y
    written (4 h T d words); written out (as `pipelib.model` does) the scores are also written,
    read and written by the softmax, and read again by the second product (4 h T^2 words more).
    A fused kernel (F.scaled_dot_product_attention) keeps them out of memory.
    """
    q, k, v = (torch.randn(heads, seq, head_size, device=device) for _ in range(3))
    scale = head_size ** -0.5

    def math_attention():
        return torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v

    def fused():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    with num_threads(threads):
        t = best_time(math_attention if written_out else fused, device, repeats)
    flops = 4 * heads * seq * seq * head_size + SOFTMAX_FLOPS_PER_ELEMENT * heads * seq * seq
    words = 4 * heads * seq * head_size + (4 * heads * seq * seq if written_out else 0)
    name = f"attention T={seq} " + ("written out" if written_out else "fused (SDPA)")
    return Op(name, flops, 4 * words, t)


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


# ----------------------------------------------------------------------------- files
@dataclass(frozen=True)
class FileRead:
    """Reading back a file just written: from the page cache, then after asking for eviction."""

    nbytes: int
    filesystem: str
    write_bps: float        # write + fsync: the data reached the storage device (or its cache)
    cached_bps: float       # read of a file just written: served from the page cache (RAM)
    evicted_bps: float | None  # read after posix_fadvise(DONTNEED); None where unsupported


def _filesystem(path: str) -> str:
    best, fs = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _, mnt, kind = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fs = mnt, kind
    except OSError:
        pass
    return fs


def file_read_bandwidth(nbytes: int = 256 * MiB, directory: str | None = None,
                        chunk: int = 8 * MiB) -> FileRead:
    """Write a temporary file, fsync it, read it twice; delete it. Sizes in bytes.

    A file just written is still in the operating system's page cache, so the first read
    measures RAM, not the disk: it is labelled "page cache". Then the kernel is asked to drop
    the file's clean pages (posix_fadvise POSIX_FADV_DONTNEED, no root needed) and it is read
    again. On tmpfs, or a virtual machine whose host caches the disk, that second read may
    still come from RAM somewhere: the filesystem type is reported with the numbers.
    """
    directory = directory or tempfile.gettempdir()
    buf = bytearray(os.urandom(min(chunk, MiB))) * max(1, chunk // MiB)
    view = memoryview(buf)
    fd, path = tempfile.mkstemp(prefix="pipelib-read-", dir=directory)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < nbytes:
            written += os.write(fd, view[: min(len(buf), nbytes - written)])
        os.fsync(fd)
        write_bps = written / (time.perf_counter() - t0)

        def read_all() -> float:
            os.lseek(fd, 0, os.SEEK_SET)
            t0, got = time.perf_counter(), 0
            while True:
                n = os.readv(fd, [view])
                if n == 0:
                    break
                got += n
            if got != written:
                raise OSError(f"read {got} bytes back from {path}, wrote {written}")
            return got / (time.perf_counter() - t0)

        cached = max(read_all() for _ in range(2))
        evicted = None
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            evicted = read_all()
        return FileRead(written, _filesystem(os.path.realpath(directory)), write_bps, cached, evicted)
    finally:
        os.close(fd)
        os.unlink(path)


# ----------------------------------------------------------------------------- engines
def pingpong(sizes_bytes, repeats: int = 10, peer: int = 1, device=None) -> dict | None:
    """Run on every rank of a cluster: rank 0 and `peer` bounce messages; others do nothing.

    Rank 0 sends n bytes to `peer`, which sends them straight back; a round trip moves 2n bytes.
    Returns, on rank 0, {n: [one-way seconds = round trip / 2, ...]} (None elsewhere).
    torch.distributed's blocking send/recv on the default group (gloo on CPU, NCCL on GPUs).
    """
    import torch.distributed as dist

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
            _sync(device)
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, other)
                dist.recv(buf, other)
            else:
                dist.recv(buf, other)
                dist.send(buf, other)
            _sync(device)
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


# ----------------------------------------------------------------------------- the roofline
@dataclass(frozen=True)
class Roofline:
    """Peak FLOP/s and memory bandwidth (bytes/s): the two roofs of Williams et al. 2009."""

    name: str
    peak: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """Intensity (FLOP/byte) where the two roofs meet: below it an op is memory-bound."""
        return self.peak / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The most FLOP/s an op of this intensity can reach: min(peak, bandwidth * I)."""
        return min(self.peak, self.bandwidth * intensity)

    def time(self, flops: float, nbytes: float) -> float:
        """Least time for `flops` over `nbytes`: max(flops / peak, bytes / bandwidth)."""
        return max(flops / self.peak, nbytes / self.bandwidth)

    def bound(self, intensity: float) -> str:
        return "memory-bound" if intensity < self.ridge else "compute-bound"

    @classmethod
    def from_ops(cls, name: str, compute_ops, memory_ops) -> "Roofline":
        """The measured roofline: best FLOP/s of `compute_ops`, best bytes/s of `memory_ops`."""
        return cls(name, max(o.achieved for o in compute_ops), max(o.bandwidth for o in memory_ops))

    @classmethod
    def from_profile(cls, name: str) -> "Roofline":
        """A published roofline from `costmodel.PROFILES` (e.g. "h100": BF16 dense, HBM3)."""
        p = PROFILES[name]
        return cls(f"{name} (published)", p.flops, p.mem_bandwidth)


def roofline_figure(roofs, ops=(), title: str = "Roofline", imin: float = 1 / 16,
                    imax: float = 4096.0):
    """Log-log roofline: one line per Roofline, one marker per measured Op."""
    import math

    import plotly.graph_objects as go

    colors = ["#4C78A8", "#F58518", "#54A24B", "#B279A2"]
    fig = go.Figure()
    xs = [imin * 2 ** (i / 4) for i in range(int(4 * math.log2(imax / imin)) + 1)]
    for i, r in enumerate(roofs):
        fig.add_trace(go.Scatter(
            x=xs, y=[r.attainable(x) for x in xs], mode="lines", name=r.name,
            line=dict(color=colors[i % len(colors)], width=3 if i == 0 else 2,
                      dash="solid" if i == 0 else "dot"),
            hovertemplate="I=%{x:.3g} FLOP/B: %{y:.3s}FLOP/s<extra>" + r.name + "</extra>"))
    if ops:
        fig.add_trace(go.Scatter(
            x=[o.intensity for o in ops], y=[o.achieved for o in ops], mode="markers+text",
            name="measured operations", text=[o.name for o in ops], textposition="top center",
            marker=dict(size=10, color="#E45756", symbol="diamond"),
            hovertemplate="%{text}<br>I=%{x:.3g} FLOP/B<br>%{y:.3s}FLOP/s<extra></extra>"))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title="FLOP/s", exponentformat="SI")
    fig.update_layout(title=title, template="plotly_white", height=520,
                      legend=dict(orientation="h", y=-0.2))
    return fig


def bandwidth_figure(curve, caches=(), title: str = "Read bandwidth by working-set size"):
    """Bandwidth against working-set size, with the cache sizes marked."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(
        x=[s for s, _ in curve], y=[b / 1e9 for _, b in curve], mode="lines+markers",
        name="measured", hovertemplate="%{x:.3s}B: %{y:.1f} GB/s<extra></extra>"))
    for level, kind, size in caches:
        if kind != "Instruction":
            fig.add_vline(x=size, line=dict(dash="dot", color="gray"),
                          annotation_text=f"L{level} {size // KiB} KiB" if size < MiB
                          else f"L{level} {size // MiB} MiB")
    fig.update_xaxes(type="log", title="working set (bytes)", exponentformat="SI")
    fig.update_yaxes(title="GB/s", rangemode="tozero")
    fig.update_layout(title=title, template="plotly_white", height=420, showlegend=False)
    return fig


# ----------------------------------------------------------------------------- published
@dataclass(frozen=True)
class Published:
    """A figure from a datasheet or standard. value in base units (FLOP/s, bytes/s, bytes)."""

    item: str
    quantity: str
    value: float
    unit: str
    source: str


_H, _A = PROFILES["h100"], PROFILES["a100"]
PUBLISHED = (
    Published("H100 SXM", "compute, BF16 dense", _H.flops, "FLOP/s", _H.source),
    Published("H100 SXM", "compute, FP32 (no tensor cores)", 67e12, "FLOP/s",
              "NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TFLOPS (SXM)"),
    Published("H100 SXM", "memory bandwidth (HBM3)", _H.mem_bandwidth, "B/s", _H.source),
    Published("H100 SXM", "memory capacity", 80e9, "B", _H.source),
    Published("A100 SXM 80GB", "compute, BF16 dense", _A.flops, "FLOP/s", _A.source),
    Published("A100 SXM 80GB", "compute, FP32 (no tensor cores)", 19.5e12, "FLOP/s",
              "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS"),
    Published("A100 SXM 80GB", "memory bandwidth (HBM2e)", _A.mem_bandwidth, "B/s", _A.source),
    Published("A100 SXM 80GB", "memory capacity", 80e9, "B", _A.source),
    Published("NVLink 4 (H100)", "GPU-to-GPU, both directions", 2 * LINKS["nvlink4"].beta, "B/s",
              "NVIDIA H100 datasheet: NVLink 900 GB/s (18 links, total of both directions)"),
    Published("NVLink 3 (A100)", "GPU-to-GPU, both directions", 2 * LINKS["nvlink3"].beta, "B/s",
              "NVIDIA A100 datasheet: NVLink 600 GB/s"),
    Published("PCIe 5.0 x16", "CPU-to-GPU, per direction", 64e9, "B/s",
              "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s x 16 lanes, 128b/130b"),
    Published("InfiniBand NDR", "node-to-node, per port, per direction", LINKS["ib-ndr"].beta,
              "B/s", "NVIDIA ConnectX-7 / Quantum-2 NDR datasheets: 400 Gb/s per port"),
    Published("Ethernet 10GBASE-T", "LAN, per direction", 10e9 / 8, "B/s",
              "IEEE 802.3an-2006: 10 Gb/s"),
    Published("DDR5-4800", "CPU memory, per channel", 4800e6 * 8, "B/s",
              "JEDEC JESD79-5 DDR5: 4800 MT/s x 8 bytes per 64-bit channel"),
    Published("NVMe SSD (PCIe 4.0 x4)", "sequential read", 7.45e9, "B/s",
              "Samsung 990 PRO datasheet: up to 7,450 MB/s sequential read"),
)


def fmt(value: float, unit: str) -> str:
    """1.23e12, 'FLOP/s' -> '1.23 TFLOP/s' (decimal prefixes, as datasheets use)."""
    for p, s in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= p:
            return f"{value / p:.3g} {s}{unit}"
    return f"{value:.3g} {unit}"


def comparison_markdown(measured: dict, machine: str) -> str:
    """A markdown table: rows measured here (quantity -> (value, unit)), then PUBLISHED."""
    rows = ["| machine | quantity | value | source |", "|---|---|---|---|"]
    for quantity, (value, unit) in measured.items():
        rows.append(f"| **this machine** | {quantity} | **{fmt(value, unit)}** | measured above on {machine} |")
    for p in PUBLISHED:
        rows.append(f"| {p.item} | {p.quantity} | {fmt(p.value, p.unit)} | {p.source} |")
    return "\n".join(rows)
