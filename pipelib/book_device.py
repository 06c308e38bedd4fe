"""Which device a chapter's clusters run on, chosen from outside the notebook, and the asserts
that hold only on the simulated one.

Every chapter that starts a cluster has a `DEVICE` in its parameters cell,
`DEVICE = book_device("sim")`: the simulated device unless the environment variable
`PIPELIB_BOOK_DEVICE` names another kind (`make chapters DEVICE=cpu`, or
`tests/test_chapters_on_cpu.py`), so one notebook runs on the simulated device, on real CPU
engines (wall clock) or on GPUs without being edited.

Some of a chapter's asserts are facts of the simulation, not of the algorithm: equalities of the
virtual clock (to 1e-9 or 1e-12), a simulated capacity and its `SimulatedOutOfMemoryError`.
(The activation tracker counts on simulated devices only unless asked: the chapters that assert
its peaks start their cluster with `track_memory=True`, so those hold everywhere.) A chapter
runs them under `if sim_only(DEVICE, "what they check"):`, which on any other device prints one
line saying what is skipped and why, so a reader on a real device sees it and nothing is silent.
Two more facts hold on CPU engines but not on GPUs (`holds_on(DEVICE, guarantee, what)`): gloo's
rendezvous (a blocking send waits for its receive: chapter 12's deadlock demo) and bitwise
equality between runs of different code paths (CPU kernels add in a fixed order); `GUARANTEES`
says which kind gives what.

Used by chapters 01 and 04 to 19 (every chapter that starts a cluster).
"""
from __future__ import annotations

import os
from types import MappingProxyType

from pipelib.runtime.device import DEVICE_KINDS, DeviceSpec

BOOK_DEVICE_ENV = "PIPELIB_BOOK_DEVICE"

# What a chapter's asserts may rely on, by device kind (`pipelib.runtime.device.DEVICE_KINDS`),
# and why the others lack it: the one place that tells the kinds apart for the chapters.
WHY = MappingProxyType({
    "virtual clock": "holds on the simulated device only (its virtual clock and memory are the model; "
                     "a real device measures)",
    "gloo rendezvous": "holds where ranks talk through gloo (a blocking send waits for its receive); "
                       "NCCL queues sends on the GPU",
    "bitwise": "holds where the same ops give the same bits (CPU kernels); GPU kernels may add in "
               "another order",
})
GUARANTEES = MappingProxyType({
    "sim": frozenset({"virtual clock", "gloo rendezvous", "bitwise"}),
    "cpu": frozenset({"gloo rendezvous", "bitwise"}),
    "cuda": frozenset(),
})


def book_device(default: str = DeviceSpec.kind) -> str:
    """The device kind a chapter's clusters use: `$PIPELIB_BOOK_DEVICE` when it is set and not
    empty, else `default`; a ValueError naming the value and the kinds when it is neither."""
    value = os.environ.get(BOOK_DEVICE_ENV, "").strip()
    source = f"{BOOK_DEVICE_ENV}={value!r}" if value else f"book_device({default!r})"
    value = value or default
    if value not in DEVICE_KINDS:
        raise ValueError(f"{source}: {value!r} is not a device kind; use one of {DEVICE_KINDS}")
    return value


def holds_on(device: str, guarantee: str, what: str) -> bool:
    """True where `device` gives `guarantee` (a key of `WHY`), so the asserts about `what` hold
    there; elsewhere print that they are skipped and why, and return False."""
    if guarantee not in WHY:
        raise ValueError(f"unknown guarantee {guarantee!r}; use one of {tuple(WHY)}")
    if guarantee in _guarantees(device):
        return True
    print(f"[skipped on DEVICE={device!r}] {what}: {WHY[guarantee]}")
    return False


def _guarantees(device: str) -> frozenset:
    if device not in GUARANTEES:
        raise ValueError(f"{device!r} is not a device kind; use one of {DEVICE_KINDS}")
    return GUARANTEES[device]


def simulated(device: str) -> bool:
    """Whether `device` is the simulated kind: time and memory are the model, not measured."""
    return "virtual clock" in _guarantees(device)


def sim_only(device: str, what: str) -> bool:
    """True on the simulated device, where the asserts about `what` hold; on any other device,
    print that they are skipped and why, and return False (`if sim_only(DEVICE, "..."):`)."""
    return holds_on(device, "virtual clock", what)
