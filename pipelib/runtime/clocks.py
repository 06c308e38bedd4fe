"""Two clocks behind every rank's `Device`: a logical one and the wall.

With the virtual clock (the default on a simulated device) each rank keeps a logical clock that
advances only by modelled durations: a compute op by its roofline time, a message by
alpha + bytes / beta. Deterministic: the same timeline on an idle or a loaded machine.

With the wall clock the rank sleeps until each op's modelled deadline, so a demo moves in real
time (sleeping burns no CPU: 8 engines fit on 2 cores); real devices (``cpu``, ``cuda``) always
use it and time what really happens. Every engine of a cluster shares one epoch, so the ranks'
timestamps are comparable.

Both have the same four methods (`now`, `advance`, `wait_until`, `reset`) and a `virtual` flag.

Introduced in chapter 04.
"""
from __future__ import annotations

import time

CLOCKS = ("virtual", "wall")


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
