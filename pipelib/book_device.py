"""Which device a chapter's clusters run on, chosen from outside the notebook, and the asserts
that hold only on the simulated one.

Every chapter that starts a cluster has a `DEVICE` in its parameters cell,
`DEVICE = book_device("sim")`: the simulated device unless the environment variable
`PIPELIB_BOOK_DEVICE` names another kind (`make chapters DEVICE=cpu`, or
`tests/test_chapters_on_cpu.py`), so one notebook runs on the simulated device, on real CPU
engines (wall clock) or on GPUs without being edited.

Some of a chapter's asserts are facts of the simulation, not of the algorithm: equalities of the
virtual clock (to 1e-9 or 1e-12), a simulated capacity and its `SimulatedOutOfMemoryError`, the
activation tracker's exact peaks (it counts activations on simulated devices only). A chapter
runs them under `if sim_only(DEVICE, "what they check"):`, which on any other device prints one
line saying what is skipped and why, so a reader on a real device sees it and nothing is silent.

Used by chapters 01 and 04 to 19 (every chapter that starts a cluster).
"""
from __future__ import annotations

import os

from pipelib.runtime.device import DEVICE_KINDS, DeviceSpec

BOOK_DEVICE_ENV = "PIPELIB_BOOK_DEVICE"


def book_device(default: str = DeviceSpec.kind) -> str:
    """The device kind a chapter's clusters use: `$PIPELIB_BOOK_DEVICE` when it is set and not
    empty, else `default`; a ValueError naming the value and the kinds when it is neither."""
    value = os.environ.get(BOOK_DEVICE_ENV, "").strip()
    source = f"{BOOK_DEVICE_ENV}={value!r}" if value else f"book_device({default!r})"
    value = value or default
    if value not in DEVICE_KINDS:
        raise ValueError(f"{source}: {value!r} is not a device kind; use one of {DEVICE_KINDS}")
    return value


def simulated(device: str) -> bool:
    """Whether `device` is the simulated kind (modelled time, simulated memory): `DeviceSpec`'s
    default, the one `pipelib.runtime.device.Device` models."""
    return DeviceSpec(kind=device).kind == DeviceSpec().kind


def sim_only(device: str, what: str) -> bool:
    """True on the simulated device, where the asserts about `what` hold; on any other device,
    print that they are skipped and why, and return False (`if sim_only(DEVICE, "..."):`)."""
    if simulated(device):
        return True
    print(f"[skipped on DEVICE={device!r}] {what}: holds on the simulated device only "
          f"(its virtual clock and memory are the model; a real device measures)")
    return False
