"""Simulated and real devices: clocks, modelled durations, memory tracking, what a rank is doing.

Every engine of a `Cluster` holds one `Device` (`pipelib.runtime.device.current()`), set up when the
cluster starts. Three kinds:

- ``sim`` (default): math is real and runs on the CPU, *time* is modelled from a
  `DeviceProfile`: a compute op lasts its roofline time, a message alpha + bytes / beta.
  With the virtual clock (default) each rank keeps a logical clock: deterministic, identical on
  an idle or a loaded machine. With the wall clock the rank sleeps until each op's modelled
  deadline, so a demo moves in real time (sleeping burns no CPU: 8 engines fit on 2 cores).
- ``cpu``: real math, real wall-clock time (noisy on 2 shared cores: that is reality).
- ``cuda``: one GPU per rank, real time, the allocator's counters for memory.

Memory is measured, not assumed: saved activations through
`torch.autograd.graph.saved_tensors_hooks`, plus parameters, gradients, optimizer state and
buffers registered with the tracker. A simulated device has a capacity and raises
`SimulatedOutOfMemoryError` naming the rank, the need and the capacity.

Introduced in chapter 04.
"""
from __future__ import annotations

import contextlib
import functools
import os
import struct
import time
from dataclasses import dataclass

from pipelib.costmodel import DeviceProfile, get_profile
from pipelib.trace import Kind, Tracer

DEVICE_KINDS = ("sim", "cpu", "cuda")
CLOCKS = ("virtual", "wall")


class SimulatedOutOfMemoryError(RuntimeError):
    """A rank needed more memory than its simulated device has."""

    def __init__(self, rank: int, what: str, need: int, capacity: int, breakdown: dict):
        self.rank, self.need, self.capacity, self.breakdown = rank, need, capacity, dict(breakdown)
        parts = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in breakdown.items() if v)
        super().__init__(
            f"rank {rank}: simulated out of memory while allocating {what}: needs "
            f"{need / 2**20:.2f} MiB but the device holds {capacity / 2**20:.2f} MiB ({parts}). "
            f"Use a smaller batch or more microbatches, shard with ZeRO, recompute activations, "
            f"or choose a profile with more memory."
        )


# ---------------------------------------------------------------- clocks
class VirtualClock:
    """A logical clock: time advances only by modelled durations. Deterministic."""

    virtual = True

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def advance(self, duration: float) -> tuple[float, float]:
        start = self.t
        self.t = start + max(0.0, duration)
        return start, self.t

    def wait_until(self, t: float) -> tuple[float, float]:
        start = self.t
        self.t = max(self.t, t)
        return start, self.t

    def reset(self, start: float = 0.0) -> None:
        self.t = float(start)


class WallClock:
    """Seconds since a shared epoch (time.time() is one clock for every process on a host)."""

    virtual = False

    def __init__(self, epoch: float | None = None):
        self.epoch = time.time() if epoch is None else epoch

    def now(self) -> float:
        return time.time() - self.epoch

    def advance(self, duration: float) -> tuple[float, float]:
        start = self.now()
        self.wait_until(start + duration)
        return start, self.now()

    def wait_until(self, t: float) -> tuple[float, float]:
        start = self.now()
        while True:  # sleep to the deadline; the last millisecond is slept in small steps
            left = t - self.now()
            if left <= 0:
                break
            time.sleep(left if left > 2e-3 else left / 2)
        return start, self.now()

    def reset(self, start: float = 0.0) -> None:
        self.epoch = time.time() - start


# ---------------------------------------------------------------- what a rank is doing
class Activity:
    """A one-line beacon saying what this rank is doing, readable from the notebook process
    while the rank is stuck (a blocked rank cannot answer a message, but a file can be read).

    The file is mapped into memory and holds the time it was set (8 bytes) and the text:
    setting it is two copies into the page cache, no system call and no formatting of the
    time, cheap enough for every compute op and message of a pipeline step. A text's bytes are
    kept after their first use (a step repeats the same few hundred texts)."""

    SIZE = 512
    _STAMP = struct.Struct("<d")

    def __init__(self, path: str | None = None):
        self.path, self.map, self.text = path, None, "idle"
        if path:
            import mmap

            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, self.SIZE)
                self.map = mmap.mmap(fd, self.SIZE)
            finally:
                os.close(fd)
            self.set("idle")

    def set(self, text: str) -> None:
        self.text = text
        if self.map is not None:
            self.map[8:] = _encoded(text)
            self._STAMP.pack_into(self.map, 0, time.time())

    def doing(self, text: str) -> "_Doing":
        """Context manager: the beacon says `text` inside, what it said before after."""
        return _Doing(self, text)

    @staticmethod
    def read(path: str) -> tuple[float | None, str]:
        """(seconds since it was set, text) for a beacon file; (None, 'unknown') if absent."""
        try:
            with open(path, "rb") as f:
                data = f.read(Activity.SIZE)
            (stamp,) = Activity._STAMP.unpack_from(data, 0)
            return time.time() - stamp, data[8:].decode(errors="replace").rstrip()
        except (OSError, ValueError, struct.error):
            return None, "unknown"


@functools.lru_cache(maxsize=4096)
def _encoded(text: str) -> bytes:
    return text.encode()[: Activity.SIZE - 8].ljust(Activity.SIZE - 8)


class _Doing:
    __slots__ = ("activity", "text", "before")

    def __init__(self, activity: Activity, text: str):
        self.activity, self.text = activity, text

    def __enter__(self):
        self.before = self.activity.text
        self.activity.set(self.text)

    def __exit__(self, *exc):
        self.activity.set(self.before)


# ---------------------------------------------------------------- memory
class MemoryTracker:
    """Bytes held on one rank by category; checks a capacity on every increase."""

    CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")

    def __init__(self, rank: int = 0, capacity: int | None = None, track_activations: bool = True):
        self.rank, self.capacity, self.track_activations = rank, capacity, track_activations
        self.bytes = dict.fromkeys(self.CATEGORIES, 0)
        self.peak = 0
        self._storages: dict[int, list] = {}  # storage ptr -> [refcount, nbytes]
        self._param_ptrs: set[int] = set()

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def add(self, category: str, nbytes: int, what: str = "") -> None:
        if category not in self.bytes:
            raise ValueError(f"unknown memory category {category!r}; use one of {self.CATEGORIES}")
        new_total = self.total + nbytes
        if nbytes > 0 and self.capacity is not None and new_total > self.capacity:
            raise SimulatedOutOfMemoryError(
                self.rank, what or category, new_total, self.capacity, {**self.bytes, category: self.bytes[category] + nbytes}
            )
        self.bytes[category] += nbytes
        self.peak = max(self.peak, self.total)

    def set(self, category: str, nbytes: int, what: str = "") -> None:
        self.add(category, nbytes - self.bytes[category], what)

    def reset_peak(self) -> None:
        self.peak = self.total

    # -- parameters, gradients, optimizer state
    def track_module(self, *modules) -> None:
        """Count the parameters and buffers of `modules` (replacing what was tracked before).

        Their storages are remembered so that a saved view of a weight or of a buffer (a causal
        mask, say) is not counted again as an activation.
        """
        params = [p for m in modules for p in m.parameters()]
        buffers = [b for m in modules for b in m.buffers()]
        self._param_ptrs = {t.untyped_storage().data_ptr() for t in [*params, *buffers]}
        self.set("parameters", sum(p.numel() * p.element_size() for p in params), "parameters")
        self.set("buffers", sum(b.numel() * b.element_size() for b in buffers), "buffers")

    def update_gradients(self, module) -> None:
        self.set("gradients", sum(p.grad.numel() * p.grad.element_size() for p in module.parameters()
                                  if p.grad is not None), "gradients")

    def update_optimizer(self, optimizer) -> None:
        import torch

        n = sum(v.numel() * v.element_size() for st in optimizer.state.values()
                for v in st.values() if isinstance(v, torch.Tensor))
        self.set("optimizer", n, "optimizer state")

    # -- saved activations
    def saved_activations(self):
        """Count tensors autograd saves for backward (unique storages, parameters excluded).

        A context manager: every tensor autograd saves inside it is packed into a `_Saved`,
        which adds its storage's bytes when the first saved tensor of that storage appears and
        takes them off when the last one is freed (when its graph dies). With
        track_activations=False (real devices unless asked: `DeviceSpec.track_memory`) it does
        nothing: the hooks cost a Python call per saved tensor, 4% of a CPU pipeline step."""
        import torch

        if not self.track_activations:
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(functools.partial(_Saved, self), _Saved.unpack)


class _Saved:
    """One tensor saved for backward, counted on a `MemoryTracker` while it lives.

    It runs once per saved tensor (a dozen per stage forward): one class for every tracker,
    not a class made per forward."""

    __slots__ = ("t", "key", "tracker")

    def __init__(self, tracker: MemoryTracker, t):
        # Keep a detached alias: same storage, no grad_fn. Keeping `t` itself makes a cycle
        # when autograd saves a node's own output (t -> grad_fn -> this -> t), and with
        # retain_graph (zero-bubble I/W) the activation would outlive its graph until the
        # garbage collector ran.
        self.t, self.key, self.tracker = t.detach(), None, tracker
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or ptr in tracker._param_ptrs:
            return
        entry = tracker._storages.get(ptr)
        if entry is None:
            tracker.add("activations", nbytes, f"saved activation {tuple(t.shape)}")
            tracker._storages[ptr] = [1, nbytes]
        else:
            entry[0] += 1
        self.key = ptr

    def unpack(self):
        return self.t

    def __del__(self):
        if self.key is not None:
            storages = self.tracker._storages
            entry = storages.get(self.key)
            if entry is not None:
                entry[0] -= 1
                if entry[0] == 0:
                    del storages[self.key]
                    self.tracker.bytes["activations"] -= entry[1]


# ---------------------------------------------------------------- the device
@dataclass(frozen=True)
class DeviceSpec:
    """What the notebook asked for; validated before any process starts."""

    kind: str = "sim"
    profile: str | DeviceProfile = "toy-gpu"
    clock: str = "virtual"
    # count saved activations (`MemoryTracker.saved_activations`): None means on a simulated
    # device, whose memory is the model (capacity, out-of-memory errors), and off on real ones,
    # where the hooks would slow every op being timed; True turns them on there too
    track_memory: bool | None = None

    def __post_init__(self):
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"unknown device {self.kind!r}; use one of {DEVICE_KINDS}")
        if self.clock not in CLOCKS:
            raise ValueError(f"unknown clock {self.clock!r}; use one of {CLOCKS}")
        get_profile(self.profile)  # raises a ValueError naming the profile
        if self.track_memory not in (None, True, False):
            raise ValueError(f"track_memory={self.track_memory!r}; use None (on for 'sim' only), "
                             f"True or False")

    @property
    def tracks_activations(self) -> bool:
        return self.kind == "sim" if self.track_memory is None else self.track_memory


class Device:
    """One rank's device: its clock, tracer, memory tracker and activity beacon."""

    def __init__(self, rank: int = 0, world_size: int = 1, spec: DeviceSpec | None = None,
                 epoch: float | None = None, activity_path: str | None = None):
        spec = spec or DeviceSpec()
        self.rank, self.world_size, self.kind = rank, world_size, spec.kind
        self.profile: DeviceProfile = get_profile(spec.profile)
        self.modelled = spec.kind == "sim"
        self.clock = VirtualClock() if (self.modelled and spec.clock == "virtual") else WallClock(epoch)
        self.tracer = Tracer(rank)
        self.spec = spec
        self.memory = self.fresh_memory()
        self.activity = Activity(activity_path)
        self.comm_counts: dict[str, int] = {}  # filled by pipelib.comm.p2p: bytes and messages
        self.outstanding: dict = {}  # pipelib.comm.p2p: posted handles not yet waited, by id
        self.scratch: dict = {}      # pipelib.comm.collectives: receive buffers reused between calls, by dtype
        self.torch_device = self._torch_device()

    def fresh_memory(self) -> MemoryTracker:
        """An empty tracker with the current one's capacity and activation tracking (the
        device's defaults at first): a new model's memory starts here, with no pointers of an
        earlier model's parameters."""
        old = getattr(self, "memory", None)
        if old is None:
            return MemoryTracker(self.rank, self.profile.memory if self.modelled else None,
                                 self.spec.tracks_activations)
        return MemoryTracker(self.rank, old.capacity, old.track_activations)

    def _torch_device(self):
        import torch

        if self.kind == "cuda":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def __repr__(self) -> str:
        clock = "virtual" if self.clock.virtual else "wall"
        return f"Device(rank={self.rank}, kind={self.kind!r}, profile={self.profile.name!r}, clock={clock!r})"

    def now(self) -> float:
        return self.clock.now()

    def reset(self) -> None:
        """Start a new measurement: clock to 0 (virtual) and an empty trace."""
        if self.clock.virtual:
            self.clock.reset(0.0)
        self.tracer.clear()
        self.memory.reset_peak()
        self.comm_counts.clear()

    def compute(self, label: str, *, flops: float | None = None, nbytes: float = 0.0,
                duration: float | None = None, stage: int | None = None, microbatch: int | None = None):
        """Run the body as one compute op and record it (a context manager).

        On a simulated device its duration is `duration` if given, else the roofline time of
        `flops` (counted with torch's FlopCounterMode when not given) and `nbytes`. On real
        devices the duration is measured (`flops`, `nbytes` and `duration` are not used).
        """
        if not self.modelled:
            return _Measured(self, label, stage, microbatch)
        return self._modelled(label, flops, nbytes, duration, stage, microbatch)

    @contextlib.contextmanager
    def _modelled(self, label, flops, nbytes, duration, stage, microbatch):
        counter = None
        if duration is None and flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
        start = self.clock.now()
        with self.activity.doing(_compute_text(label, stage, microbatch)):
            with counter if counter is not None else contextlib.nullcontext():
                yield self
            if duration is None:
                flops = counter.get_total_flops() if counter is not None else flops
                duration = self.profile.compute_time(flops, nbytes)
            if self.clock.virtual:
                start, end = self.clock.advance(duration)
            else:
                self.clock.wait_until(start + duration)
                end = self.clock.now()
        self.tracer.record(Kind.COMPUTE, label, start, end, stage=stage, microbatch=microbatch,
                           memory=self.memory.total)

    def idle(self, duration: float, label: str = "idle") -> None:
        """Let modelled time pass without work (sleeps under the wall clock)."""
        if self.clock.virtual:
            self.clock.advance(duration)
        else:
            self.clock.wait_until(self.clock.now() + duration)


def _compute_text(label: str, stage, microbatch) -> str:
    return (f"compute {label}" + (f" stage {stage}" if stage is not None else "")
            + (f" microbatch {microbatch}" if microbatch is not None else ""))


class _Measured:
    """`Device.compute` on a real device: the op's wall-clock time, recorded once it ended (a
    class, not a generator: it runs around every F, B, I and W of a pipeline step)."""

    __slots__ = ("dev", "label", "stage", "microbatch", "before", "start")

    def __init__(self, dev: Device, label: str, stage, microbatch):
        self.dev, self.label, self.stage, self.microbatch = dev, label, stage, microbatch

    def __enter__(self):
        activity = self.dev.activity
        self.before = activity.text
        activity.set(_compute_text(self.label, self.stage, self.microbatch))
        self.start = self.dev.clock.now()
        return self.dev

    def __exit__(self, exc_type, exc, tb):
        dev = self.dev
        if exc_type is None:
            if dev.kind == "cuda":
                import torch

                torch.cuda.synchronize()
            dev.tracer.record(Kind.COMPUTE, self.label, self.start, dev.clock.now(),
                              stage=self.stage, microbatch=self.microbatch, memory=dev.memory.total)
        dev.activity.set(self.before)
        return False


_CURRENT: Device | None = None


def current() -> Device:
    """The Device of this process (set up on every engine when a Cluster starts)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = Device()
    return _CURRENT


def set_current(device: Device) -> Device:
    global _CURRENT
    _CURRENT = device
    return device
