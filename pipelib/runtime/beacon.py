"""The activity beacon: one line saying what a rank is doing, readable while the rank is stuck.

A rank blocked in a receive, or spinning in a deadlock, cannot answer a message, but a file can
still be read. Each rank's `Device` holds an `Activity` on a file in the cluster's run directory;
the device sets it around every compute op ("compute F stage 1 microbatch 2"), the
point-to-point layer around every message, the cluster around every function it runs. When a
rank dies or does not finish, `Cluster` reads the beacons and its `RankDiedError` or
`RankTimeoutError` names what each rank was doing and for how long. After the text, the same
file holds the collectives' flight recorder (`pipelib.runtime.flight`, `Activity.flight`): the
collective the rank is in, on which group, its sequence number there.

Introduced in chapter 04 (the cluster's errors); chapter 05 reads it to explain a deadlock.
"""
from __future__ import annotations

import functools
import os
import struct
import time


class Activity:
    """A one-line beacon saying what this rank is doing, readable from the notebook process
    while the rank is stuck (a blocked rank cannot answer a message, but a file can be read).

    The file is mapped into memory and holds the time it was set (8 bytes) and the text:
    setting it is two copies into the page cache, no system call and no formatting of the
    time, cheap enough for every compute op and message of a pipeline step. A text's bytes are
    kept after their first use (a step repeats the same few hundred texts).
    Without a path it only remembers the text (a device outside a cluster).

    `flight` records the collective the rank is in, from byte `SIZE` of the same file; a
    `doing` block closes the collectives an exception left open inside it."""

    SIZE = 512  # the stamp and the text; the flight record follows
    _STAMP = struct.Struct("<d")

    def __init__(self, path: str | None = None):
        from pipelib.runtime.flight import SIZE as FLIGHT_SIZE, FlightRecorder

        self.path, self.map, self.text = path, None, "idle"
        if path:
            import mmap

            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, self.SIZE + FLIGHT_SIZE)
                self.map = mmap.mmap(fd, self.SIZE + FLIGHT_SIZE)
            finally:
                os.close(fd)
            self.set("idle")
        self.flight = FlightRecorder(self.map, self.SIZE)

    def set(self, text: str) -> None:
        self.text = text
        if self.map is not None:
            self.map[8:self.SIZE] = _encoded(text)
            self._STAMP.pack_into(self.map, 0, time.time())

    def doing(self, text: str) -> _Doing:
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
    """The text as the beacon stores it: UTF-8, cut or padded with spaces to fill the file."""
    return text.encode()[: Activity.SIZE - 8].ljust(Activity.SIZE - 8)


class _Doing:
    """`Activity.doing`: a class, not a generator, since it wraps every op of a pipeline step."""

    __slots__ = ("activity", "text", "before", "depth")

    def __init__(self, activity: Activity, text: str):
        self.activity, self.text = activity, text

    def __enter__(self):
        self.before, self.depth = self.activity.text, self.activity.flight.depth
        self.activity.set(self.text)

    def __exit__(self, *exc):
        self.activity.set(self.before)
        if self.activity.flight.depth != self.depth:  # a collective left by an exception
            self.activity.flight.unwind(self.depth)
