"""This machine, and how every measurement of `pipelib.hardware` is timed.

`machine_info` says what the machine is (/proc/cpuinfo, sysfs, torch): its label names the
measuring machine in every figure and table. `best_time` times a call: the *best* of several
repeats, because a shared laptop's noise only ever slows a run down. On a GPU
(`device="cuda"`) it synchronises before reading the clock.

Introduced in chapter 01.
"""
from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass

import torch

from pipelib.checks import check_int
from pipelib.costmodel import GiB, KiB, MiB


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
            read = lambda f: open(f"{base}/index{i}/{f}").read().strip()  # noqa: E731, B023
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


@dataclass(frozen=True)
class CpuSharing:
    """Who else wants this machine's CPUs right now (/proc/loadavg, sysfs topology)."""

    cores: int                 # CPUs this process may use
    hyperthreads: bool | None  # are two of them the hardware threads of one physical core?
    running: int               # runnable tasks at this instant, this process included
    load_1min: float           # average runnable tasks over the last minute

    @property
    def busy_elsewhere(self) -> float:
        """Cores' worth of work other programs want now: a thread beyond our own that runs."""
        return max(0.0, self.load_1min - 1.0)


def cpu_sharing() -> CpuSharing:
    """What competes with a measurement for the CPUs: hyperthread siblings and other processes.

    Two "CPUs" that are the two hardware threads of one core share its vector units, so a
    compute-bound matmul gains little from the second; and a load above 1 means other programs
    take time slices on the cores a second thread would use.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    smt = None
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            text = f.read().strip()
        smt = "," in text or "-" in text
    except OSError:
        pass
    try:
        with open("/proc/loadavg") as f:
            fields = f.read().split()
        load, running = float(fields[0]), int(fields[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        load, running = 0.0, 1
    return CpuSharing(cores, smt, running, load)


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


def synchronize(device) -> None:
    """Wait for the device's queued work (a GPU runs asynchronously); nothing on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def best_time(fn, device="cpu", repeats: int = 5, min_seconds: float = 0.01) -> float:
    """Seconds per call of fn: best of `repeats`, each long enough (min_seconds) to time well."""
    check_int(repeats, "repeats", context="best_time", hint="timed repeats; the fastest is kept")
    fn()  # warm-up: first-call allocations, lazy init
    synchronize(device)
    inner, t = 1, 0.0
    while True:  # calibrate how many calls one repeat makes
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        synchronize(device)
        t = time.perf_counter() - t0
        if t >= min_seconds or inner >= 2**20:
            break
        inner *= 2 if t == 0 else max(2, min(16, int(min_seconds / t) + 1))
    times = [t / inner]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) / inner)
    return min(times)
