"""Scoped measurement on one rank's device: `Device.measure()` and `Device.overrides()`.

    with dev.measure() as step:           # a Span: time, bytes sent, peak memory of the block
        ...
    with dev.overrides(capacity=2**30):   # a smaller simulated device, for this block only
        ...

Measurement has one owner (DESIGN.md section 7): a runner or the trainer opens the scopes;
strategies never reset counters, replace the memory tracker or swap the profile, so scopes nest
(a context-parallel step inside a pipeline step inside a data-parallel run). Counters are read
as differences, the peak is saved and restored around an inner scope.

Introduced with the spine (chapter 15); every runner measures through it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from pipelib.costmodel import get_profile
from pipelib.runtime.measured import allocator_peak_close, allocator_peak_open


@dataclass
class Span:
    """What one `Device.measure()` scope saw on this rank (filled in when the scope closes).

    time:        seconds on this device's clock (virtual on "sim", wall on "cpu"/"cuda")
    bytes_sent:  payload bytes this rank sent (headers are machinery, not data)
    peak_bytes:  the most memory the tracker held at any moment of the scope, all categories
    base_bytes:  what it held when the scope opened (parameters and buffers, typically)
    memory:      bytes by category when the scope closed
    allocated_peak: on cuda, the CUDA allocator's peak during the scope (`max_memory_allocated`:
                 everything the tracker counts and what it cannot see); None elsewhere
    """

    start: float
    end: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    peak_bytes: int = 0
    base_bytes: int = 0
    memory: dict = field(default_factory=dict)
    allocated_peak: int | None = None

    @property
    def time(self) -> float:
        return (self.end if self.end is not None else self.start) - self.start


@contextlib.contextmanager
def measure_scope(dev, fresh_memory: bool = False):
    """Measure what this rank does inside the block: a `Span` filled in on exit.

    The one owner of measurement (DESIGN.md section 7): the clock span, the bytes and
    messages sent and received (differences of the device's counters, never a reset), and
    the peak memory inside the block. Scopes nest: an inner scope sees its own peak, and
    the outer one still sees the highest of both. `fresh_memory=True` counts the block on
    an empty tracker (a new model: no pointers or gradients of an earlier one), with the
    same capacity, and puts the device's own tracker back afterwards. Strategies never
    reset counters or replace the tracker: the trainer (or a chapter's runner) opens one
    scope per step."""
    counts = dev.counters()
    before = dict(counts)
    outer = dev.memory
    if fresh_memory:
        dev.memory = dev.fresh_memory()
    mem = dev.memory
    old_peak, mem.peak = mem.peak, mem.total
    seen = allocator_peak_open(dev)
    m = Span(start=dev.clock.now(), base_bytes=mem.total)
    try:
        yield m
    finally:
        m.end = dev.clock.now()
        m.bytes_sent = counts["bytes_sent"] - before["bytes_sent"]
        m.bytes_received = counts["bytes_received"] - before["bytes_received"]
        m.messages_sent = counts["messages_sent"] - before["messages_sent"]
        m.peak_bytes = mem.peak
        m.memory = dict(mem.bytes)
        mem.peak = max(old_peak, mem.peak)
        m.allocated_peak = allocator_peak_close(dev, seen)
        if fresh_memory:
            dev.memory = outer


@contextlib.contextmanager
def override_scope(dev, profile=None, capacity: int | None = None):
    """Use another device profile (a name or `DeviceProfile`) and/or memory capacity inside
    the block, and the device's own again afterwards, whatever happens (chapter 07's
    what-if links; chapter 14's small device that runs out of memory)."""
    before_profile, mem = dev.profile, dev.memory
    before_capacity = mem.capacity
    if profile is not None:
        dev.profile = get_profile(profile)
    if capacity is not None:
        mem.capacity = capacity
    try:
        yield dev
    finally:
        dev.profile = before_profile
        mem.capacity = before_capacity


@contextlib.contextmanager
def off_record_scope(dev):
    """Run the block off the record: no events, no bytes counted, and on a virtual clock no time
    (the clock is put back). For machinery that must really run but is no part of the step,
    such as the pipeline's shape handshake, whose forward on zeros runs a tensor-parallel
    stage's collectives too (torch's pipelining infers shapes once, before its first step)."""
    counts = dev.counters()
    before, enabled, peak = dict(counts), dev.tracer.enabled, dev.memory.peak
    start = dev.clock.now()
    dev.tracer.enabled = False
    try:
        yield dev
    finally:
        dev.tracer.enabled = enabled
        counts.update(before)
        dev.memory.peak = max(peak, dev.memory.total)
        if dev.clock.virtual:
            dev.clock.reset(start)
