"""Memory from the CUDA allocator (`pipelib.runtime.measured`), with the allocator's counters
replaced by a fake one: there is no GPU here, and what is checked is how nested
`Device.measure()` scopes share its one peak counter (an outer scope still sees an inner
scope's peak; each scope its own)."""
import types

import torch

from pipelib.runtime import measured
from pipelib.runtime.memtrack import MemoryTracker


class FakeAllocator:
    def __init__(self):
        self.now = self.peak = 0

    def alloc(self, n):
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n):
        self.now -= n


def _gpu(monkeypatch):
    a = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: a.now)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: a.peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(a, "peak", a.now))
    dev = types.SimpleNamespace(kind="cuda", torch_device="cuda:0", allocator_peak=0, memory=MemoryTracker())
    return a, dev


def test_nested_scopes_each_see_their_own_peak_and_the_outer_one_sees_all(monkeypatch):
    a, dev = _gpu(monkeypatch)
    a.alloc(100)
    outer = measured.allocator_peak_open(dev)
    a.alloc(50)
    a.free(50)                      # outer's peak so far: 150
    inner = measured.allocator_peak_open(dev)
    a.alloc(30)
    a.free(30)                      # inner's peak: 130
    assert measured.allocator_peak_close(dev, inner) == 130
    a.alloc(10)                     # 110 after the inner scope
    assert measured.allocator_peak_close(dev, outer) == 150
    assert measured.allocated_bytes(dev) == 110


def test_an_inner_peak_above_the_outer_one_reaches_the_outer_scope(monkeypatch):
    a, dev = _gpu(monkeypatch)
    outer = measured.allocator_peak_open(dev)
    inner = measured.allocator_peak_open(dev)
    a.alloc(400)
    a.free(400)
    assert measured.allocator_peak_close(dev, inner) == 400
    assert measured.allocator_peak_close(dev, outer) == 400


def test_off_cuda_the_tracker_is_the_reading_and_there_is_no_allocator_peak():
    dev = types.SimpleNamespace(kind="cpu", memory=MemoryTracker(), allocator_peak=0)
    dev.memory.add("parameters", 64)
    assert measured.allocated_bytes(dev) == 64
    assert measured.allocator_peak_open(dev) is None
    assert measured.allocator_peak_close(dev, None) is None
