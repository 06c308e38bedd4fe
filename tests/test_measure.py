"""One owner of measurement: Device.measure() and Device.overrides() scope, nest and restore."""
import pytest
import torch

from pipelib.runtime.device import Device, DeviceSpec, current, set_current
from pipelib.runtime.memtrack import SimulatedOutOfMemoryError
from pipelib.trace import Kind, Tracer


def test_measure_scopes_clock_bytes_and_peak_and_nests():
    dev = Device(0, 1, DeviceSpec("sim"))
    counts = dev.counters()
    dev.memory.add("parameters", 100)
    with dev.measure() as outer:
        counts["bytes_sent"] += 10
        dev.memory.add("activations", 500)
        with dev.compute("F", duration=2.0):
            pass
        dev.memory.add("activations", -500)
        with dev.measure() as inner:
            counts["bytes_sent"] += 7
            dev.memory.add("activations", 50)
            dev.idle(1.0)
            dev.memory.add("activations", -50)
    assert (inner.time, inner.bytes_sent, inner.peak_bytes, inner.base_bytes) == (1.0, 7, 150, 100)
    assert (outer.time, outer.bytes_sent, outer.peak_bytes) == (3.0, 17, 600)
    assert dev.memory.peak == 600 and counts["bytes_sent"] == 17  # nothing was reset


def test_fresh_memory_scope_counts_a_new_model_and_gives_the_tracker_back():
    dev = Device(0, 1, DeviceSpec("sim"))
    own = dev.memory
    own.add("gradients", 1000)
    with dev.measure(fresh_memory=True) as m:
        assert dev.memory is not own and dev.memory.capacity == own.capacity
        dev.memory.add("parameters", 40)
    assert dev.memory is own and own.total == 1000
    assert m.peak_bytes == 40 and m.memory["parameters"] == 40


def test_overrides_restore_profile_and_capacity_even_on_error():
    dev = Device(0, 1, DeviceSpec("sim", profile="toy-gpu"))
    before = (dev.profile, dev.memory.capacity)
    with pytest.raises(SimulatedOutOfMemoryError):
        with dev.overrides(profile="h100", capacity=64):
            assert dev.profile.name == "h100" and dev.memory.capacity == 64
            dev.memory.add("activations", 65)
    assert (dev.profile, dev.memory.capacity) == before


def test_outside_a_cluster_the_device_is_the_real_one_and_measures_nothing():
    set_current(None)
    try:
        dev = current()
        assert dev.kind == ("cuda" if torch.cuda.is_available() else "cpu")
        assert not dev.modelled and dev.memory.capacity is None and not dev.memory.track_activations
        with dev.compute("F"):
            pass
        assert dev.tracer.events == []  # off until asked for
    finally:
        set_current(None)


def test_the_tracer_keeps_a_bounded_window():
    tr = Tracer(0, limit=100)
    for i in range(1000):
        tr.record(Kind.COMPUTE, "F", i, i + 1)
    assert len(tr.events) <= 100 and tr.dropped == 1000 - len(tr.events)
    assert tr.events[-1].start == 999
