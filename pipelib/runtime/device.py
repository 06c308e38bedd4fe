"""One rank's device: what the notebook asked for (`DeviceSpec`) and what each engine holds (`Device`).

Every engine of a `Cluster` holds one `Device` (`pipelib.runtime.device.current()`), set up when the
cluster starts. Three kinds:

- ``sim`` (default): math is real and runs on the CPU, *time* is modelled from a
  `DeviceProfile`: a compute op lasts its roofline time, a message alpha + bytes / beta, on a
  virtual or a wall clock (`pipelib.runtime.clocks`).
- ``cpu``: real math, real wall-clock time (noisy on 2 shared cores: that is reality).
- ``cuda``: one GPU per rank, real time, the allocator's counters for memory.

A Device gathers one rank's pieces: its clock, its `Tracer` (every op becomes an Event), its
memory tracker (`pipelib.runtime.memtrack`: measured, with a capacity on a simulated device) and
its activity beacon (`pipelib.runtime.beacon`: what the rank is doing, for the cluster's errors).
`Device.compute` is the one way an op is timed and recorded, modelled or measured.

Introduced in chapter 04.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from pipelib.costmodel import DeviceProfile, get_profile
from pipelib.runtime.beacon import Activity
from pipelib.runtime.clocks import CLOCKS, VirtualClock, WallClock
from pipelib.runtime.matching import MATCHING, matching_for
from pipelib.runtime.measured import TimedOp, allocated_bytes, allocator_reset, compute_text
from pipelib.runtime.memtrack import MemoryTracker
from pipelib.trace import Kind, Tracer

DEVICE_KINDS = ("sim", "cpu", "cuda")


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
    # how point-to-point messages are matched (`pipelib.runtime.matching`): None is NCCL's rules
    # on cuda and gloo's elsewhere, unless PIPELIB_P2P_MATCHING says "nccl"; resolved here, so
    # the engines follow what the notebook's process chose
    matching: str | None = None

    def __post_init__(self):
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"unknown device {self.kind!r}; use one of {DEVICE_KINDS}")
        if self.clock not in CLOCKS:
            raise ValueError(f"unknown clock {self.clock!r}; use one of {CLOCKS}")
        get_profile(self.profile)  # raises a ValueError naming the profile
        if self.track_memory not in (None, True, False):
            raise ValueError(f"track_memory={self.track_memory!r}; use None (on for 'sim' only), "
                             f"True or False")
        object.__setattr__(self, "matching", matching_for(self.kind, self.matching))

    @property
    def tracks_activations(self) -> bool:
        return self.kind == "sim" if self.track_memory is None else self.track_memory


class Device:
    """One rank's device: its clock, tracer, memory tracker and activity beacon."""

    def __init__(self, rank: int = 0, world_size: int = 1, spec: DeviceSpec | None = None,
                 epoch: float | None = None, activity_path: str | None = None, *, trace: bool = True):
        spec = spec or DeviceSpec()
        self.rank, self.world_size, self.kind = rank, world_size, spec.kind
        self.profile: DeviceProfile = get_profile(spec.profile)
        self.modelled = spec.kind == "sim"
        self.clock = VirtualClock() if (self.modelled and spec.clock == "virtual") else WallClock(epoch)
        self.tracer = Tracer(rank, enabled=trace)
        self.spec = spec
        self.matching = MATCHING[spec.matching]  # by tag (gloo) or by order (NCCL's rules)
        self.memory = self.fresh_memory()
        self.activity = Activity(activity_path)
        self.comm_counts: dict[str, int] = {}  # `counters()`: bytes and messages sent and received
        self.outstanding: dict = {}  # pipelib.comm.message.Handle: posted, not yet waited, by id
        self.scratch: dict = {}      # pipelib.comm.ring.scratch_buffer: receive buffers kept, by (device, dtype)
        self.groups: dict = {}       # process groups made once (pipelib.runtime.mesh), by key
        self.axes: dict = {}         # id(process group) -> its mesh axis, for Event.axis
        self.allocator_peak = 0      # cuda: the allocator's peak carried across scopes (runtime.measured)
        self.torch_device = self._torch_device()

    def counters(self) -> dict:
        """This rank's payload bytes and messages sent and received (`pipelib.comm.p2p` counts
        them); `reset()` (and so `Cluster.reset()`) empties them, nothing else does."""
        if not self.comm_counts:
            self.comm_counts.update(dict.fromkeys(("bytes_sent", "bytes_received", "messages_sent",
                                                   "messages_received"), 0))
        return self.comm_counts

    def axis_of(self, group) -> str | None:
        """The mesh axis ("dp", "tp", ...) whose group this is, or None (`runtime.mesh`)."""
        return self.axes.get(id(group)) if self.axes else None

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
            import os

            torch.cuda.set_device(gpu_of({"RANK": self.rank, **os.environ}, torch.cuda.device_count()))
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def __repr__(self) -> str:
        clock = "virtual" if self.clock.virtual else "wall"
        return f"Device(rank={self.rank}, kind={self.kind!r}, profile={self.profile.name!r}, clock={clock!r})"

    def now(self) -> float:
        return self.clock.now()

    def synchronize(self) -> None:
        """Wait until this rank's GPU has done what was queued (a no-op off cuda): before the end
        stamp of a step timer, since CUDA runs asynchronously to the host."""
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize(self.torch_device)

    def memory_now(self) -> int:
        """Bytes held now: the CUDA allocator's `memory_allocated` on cuda, else the tracker's total."""
        return allocated_bytes(self)

    @contextlib.contextmanager
    def lane(self, clock):
        """Time what this rank does inside the block on `clock`, a second lane beside compute
        (chapter 07's communication stream: a bucket's all-reduce runs on it while backward's
        clock stands still); the compute clock is back afterwards, whatever happens."""
        compute, self.clock = self.clock, clock
        try:
            yield clock
        finally:
            self.clock = compute

    def measure(self, *, fresh_memory: bool = False):
        """Measure what this rank does inside the block: a `Span` filled in on exit (a context
        manager). The one owner of measurement (`pipelib.runtime.span.measure_scope`): clock span,
        bytes and messages sent, peak memory; scopes nest; `fresh_memory=True` counts the block
        on an empty tracker (a new model) and gives the device's own back afterwards."""
        from pipelib.runtime.span import measure_scope

        return measure_scope(self, fresh_memory)

    def overrides(self, *, profile=None, capacity: int | None = None):
        """Another profile and/or memory capacity inside the block, the device's own afterwards
        (a context manager: `pipelib.runtime.span.override_scope`)."""
        from pipelib.runtime.span import override_scope

        return override_scope(self, profile, capacity)

    def off_record(self):
        """Run the block off the record: no events, no bytes counted, no virtual time (a context
        manager: `pipelib.runtime.span.off_record_scope`; the pipeline's shape handshake)."""
        from pipelib.runtime.span import off_record_scope

        return off_record_scope(self)

    def reset(self) -> None:
        """Start a new measurement: clock to 0 (virtual) and an empty trace."""
        if self.clock.virtual:
            self.clock.reset(0.0)
        self.tracer.clear()
        self.memory.reset_peak()
        self.comm_counts.clear()
        allocator_reset(self)

    def compute(self, label: str, *, flops: float | None = None, nbytes: float = 0.0,
                duration: float | None = None, stage: int | None = None, microbatch: int | None = None):
        """Run the body as one compute op and record it (a context manager).

        On a simulated device its duration is `duration` if given, else the roofline time of
        `flops` (counted with torch's FlopCounterMode when not given) and `nbytes`. On real
        devices the duration is measured (`flops`, `nbytes` and `duration` are not used).
        """
        if not self.modelled:
            return TimedOp(self, label, stage, microbatch)
        return self._modelled(label, flops, nbytes, duration, stage, microbatch)

    @contextlib.contextmanager
    def _modelled(self, label, flops, nbytes, duration, stage, microbatch):
        counter = None
        if duration is None and flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
        start = self.clock.now()
        with self.activity.doing(compute_text(label, stage, microbatch)):
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


def gpu_of(environ, gpus: int) -> int:
    """This rank's GPU: torchrun's LOCAL_RANK (its rank on this node) when set, else RANK modulo
    the node's GPUs; a ValueError when the node has fewer GPUs than that."""
    local = environ.get("LOCAL_RANK")
    index = int(local) if local is not None else int(environ["RANK"]) % gpus
    if index >= gpus:
        raise ValueError(f"LOCAL_RANK={index} but this node has {gpus} GPU(s): NCCL needs one GPU per rank; "
                         f"use --nproc-per-node {gpus} or fewer, or --device cpu")
    return index


class _Slot:
    """Where this process keeps its Device: one attribute of one object (no module global is
    rebound), set by the cluster's engine or `set_current`."""

    device: Device | None = None


_SLOT = _Slot()


def current() -> Device:
    """The Device of this process.

    On the book's engines it is set up when the Cluster starts. Anywhere else (a library user's
    torchrun or torch.multiprocessing job, a test) it is the real device, made on first use:
    this rank's GPU under NCCL (or with no process group) when CUDA is available, else the CPU,
    with real time, no simulated capacity,
    and measurement off (no events recorded, no activation hooks) until asked for with
    `set_current(Device(..., DeviceSpec("cpu", track_memory=True)))`. Never a simulated toy GPU
    nobody asked for."""
    dev = _SLOT.device
    if dev is None:
        dev = _SLOT.device = _real_device()
    return dev


def _real_device() -> Device:
    import torch
    import torch.distributed as dist

    up = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if up else (0, 1)
    # a gloo job runs on CPU tensors even on a GPU machine; NCCL (or no process group) on the GPU
    cuda = torch.cuda.is_available() and (not up or "nccl" in str(dist.get_backend()))
    spec = DeviceSpec("cuda" if cuda else "cpu", track_memory=False)
    return Device(rank, world, spec, trace=False)


def set_current(device: Device | None) -> Device | None:
    """Make `device` this process's Device (None: back to the real device, made on next use)."""
    _SLOT.device = device
    return device
