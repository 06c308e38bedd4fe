"""A rank's Device: modelled and measured compute, its memory tracker and beacon wired in."""
import time

import pytest
import torch
from sleeps import best_of

from pipelib.costmodel import PROFILES, get_profile
from pipelib.runtime.beacon import Activity
from pipelib.runtime.device import Device, DeviceSpec
from pipelib.runtime.memtrack import SimulatedOutOfMemoryError
from pipelib.trace import Kind


def test_profile_lookup_errors_name_the_value():
    with pytest.raises(ValueError, match="'nope'"):
        get_profile("nope")
    with pytest.raises(ValueError, match="'tpu'"):
        DeviceSpec(kind="tpu")
    with pytest.raises(ValueError, match="'sundial'"):
        DeviceSpec(clock="sundial")


def test_virtual_compute_takes_roofline_time_of_counted_flops():
    dev = Device(spec=DeviceSpec("sim", "toy-gpu", "virtual"))
    a = torch.randn(64, 32)
    b = torch.randn(32, 16)
    with dev.compute("mm"):
        a @ b
    (e,) = dev.tracer.events
    assert e.kind is Kind.COMPUTE and e.start == 0.0
    assert e.duration == pytest.approx(2 * 64 * 32 * 16 / PROFILES["toy-gpu"].flops)
    with dev.compute("given", duration=0.5):
        pass
    assert dev.now() == pytest.approx(e.duration + 0.5)


def test_wall_clock_sleeps_to_the_modelled_deadline():
    def padded():
        dev = Device(spec=DeviceSpec("sim", "toy-gpu", "wall"))
        t0 = time.perf_counter()
        with dev.compute("padded", duration=0.2):
            pass
        real = time.perf_counter() - t0
        (e,) = dev.tracer.events
        return [e.duration, real]

    # never before the deadline (every try), within 10 ms after it (the best of a few tries)
    best_of(padded, at_least=0.2, at_most=0.2 + 0.01)


def test_simulated_out_of_memory_names_rank_need_and_capacity():
    dev = Device(rank=3, spec=DeviceSpec("sim", get_profile("toy-gpu").with_memory(1000), "virtual"))
    x = torch.randn(100, 10, requires_grad=True)
    with pytest.raises(SimulatedOutOfMemoryError) as err:
        with dev.memory.saved_activations():
            (x.exp() * 2).sum()
    msg = str(err.value)
    assert "rank 3" in msg and "0.00 MiB" in msg and err.value.need > 1000 and err.value.capacity == 1000


def test_saved_activations_counted_on_sim_only_unless_asked():
    with pytest.raises(ValueError, match="track_memory='yes'"):
        DeviceSpec("cpu", track_memory="yes")
    x = torch.randn(64, 32, requires_grad=True)
    counted = {}
    for spec in (DeviceSpec("sim"), DeviceSpec("cpu"), DeviceSpec("cpu", track_memory=True),
                 DeviceSpec("sim", track_memory=False)):
        dev = Device(spec=spec)
        with dev.memory.saved_activations():
            y = x.exp()  # saves its result: 64 x 32 float32
        counted[spec.kind, spec.track_memory] = dev.memory.bytes["activations"]
        del y
        assert dev.memory.bytes["activations"] == 0
        fresh = dev.fresh_memory()  # a new model's tracker keeps the device's choice
        assert fresh.track_activations == dev.memory.track_activations
    assert counted == {("sim", None): 64 * 32 * 4, ("cpu", None): 0, ("cpu", True): 64 * 32 * 4,
                       ("sim", False): 0}


def test_measured_compute_records_its_wall_time_and_restores_the_beacon(tmp_path):
    dev = Device(spec=DeviceSpec("cpu"), activity_path=str(tmp_path / "beacon"))
    with dev.activity.doing("running a test"):
        with dev.compute("F", stage=1, microbatch=2):
            assert Activity.read(str(tmp_path / "beacon"))[1] == "compute F stage 1 microbatch 2"
            time.sleep(0.05)
        with pytest.raises(ZeroDivisionError):
            with dev.compute("B", stage=1, microbatch=2):
                _ = 1 / 0
        age, text = Activity.read(str(tmp_path / "beacon"))
        assert text == "running a test" and 0 <= age < 5
    (e,) = dev.tracer.events  # the failed op is not recorded
    assert (e.label, e.stage, e.microbatch) == ("F", 1, 2) and 0.05 <= e.duration < 1.0


def test_a_lane_times_its_block_on_its_own_clock_and_gives_the_compute_clock_back():
    """Chapter 07's communication stream: work inside `lane` moves the lane's clock only, and
    the compute clock is restored even when the block raises."""
    from pipelib.runtime.clocks import VirtualClock

    dev = Device(spec=DeviceSpec(kind="sim"))
    compute = dev.clock
    with dev.compute("F", duration=1.0):
        pass
    lane = VirtualClock(0.5)
    with dev.lane(lane):
        with dev.compute("comm", duration=2.0):
            pass
    assert dev.clock is compute and compute.now() == 1.0 and lane.now() == 2.5
    with pytest.raises(RuntimeError):
        with dev.lane(VirtualClock(0.0)):
            raise RuntimeError("a ring step failed")
    assert dev.clock is compute


def test_off_the_record_runs_the_block_but_leaves_no_event_bytes_or_virtual_time():
    dev = Device(0, 1)
    with dev.compute("kept", duration=0.5):
        pass
    counts, t = dict(dev.counters()), dev.now()
    with dev.off_record():
        with dev.compute("handshake", duration=2.0):
            x = torch.ones(3) * 2  # the block really runs
        dev.counters()["bytes_sent"] += 64
    assert x.sum().item() == 6.0
    assert dev.now() == t and dev.counters() == counts and dev.tracer.enabled
    assert [e.label for e in dev.tracer.take()] == ["kept"]
