"""The collectives' flight recorder: which collective each rank waits in, readable while it waits.

A rank that never calls a collective (it returned, or took another branch) or calls it on
another group leaves its peers waiting inside it; gloo only gives up at the cluster's timeout.
As NCCL's flight recorder and torch's desync debug do, every rank records the collective it is
in: its name, its group's ranks, its sequence number on that group (the n-th collective this
rank entered on it) and since when, beside the activity beacon (`pipelib.runtime.beacon`), in
the same memory-mapped file: the notebook reads it while the rank is blocked.

`never_complete` compares the records while `Cluster.run` waits (`pipelib.runtime.gather`). A
rank in collective #k of group G waits for the members of G that have entered fewer than k
collectives on G. Such a member will never come if it returned from the call (or is not
running it), or if it waits itself in a collective that will never complete (a cycle of ranks
each in another group's collective). A member still computing, or one whose own collective can
complete, may come later: a slow rank is never flagged, however long, nor are ranks that are
all inside the same collective. The records are read twice, 0.25 s apart, and only waits of
`DESYNC_SECONDS` or more count, so a rank that is just leaving a collective is not flagged.

Only pipelib's collectives (`pipelib.comm.collectives`, `algorithms`) and agreement checks
(`pipelib.comm.agreement`) record; a torch.distributed collective called directly, or a
point-to-point deadlock (chapter 05), still ends at the cluster's timeout.

Introduced in chapter 06 (collectives); every chapter's cluster uses it.
"""
from __future__ import annotations

import struct
import time
import zlib
from dataclasses import dataclass

DESYNC_SECONDS = 2.0  # a wait this long, for a peer that will never come, is an error
MAX_RANKS = 64        # pipelib.runtime.args.MAX_WORLD_SIZE: a group's ranks fit the record
MAX_GROUPS = 32       # groups whose counts a rank keeps in its file (more: no verdict on them)
_OP = 48              # bytes of a collective's name

_HEAD = struct.Struct("<IB")                            # version (odd while writing), has current
_ENTRY = struct.Struct(f"<dII{_OP}sH{MAX_RANKS}H")      # since, seq, group key, op, n ranks, ranks
_COUNT = struct.Struct("<II")                           # group key, collectives entered on it
SIZE = _HEAD.size + 2 * _ENTRY.size + 2 + MAX_GROUPS * _COUNT.size


@dataclass(frozen=True)
class Entry:
    """One collective call on one rank: `op` on the group of global `ranks`, its `seq`-th there."""

    op: str
    ranks: tuple
    key: int
    seq: int
    since: float

    def where(self) -> str:
        return f"{self.op} on group {list(self.ranks)}, that group's collective #{self.seq}"


@dataclass(frozen=True)
class Flight:
    """What one rank's record says: the collective it is in (None: none), the last it entered,
    and how many it entered on each group (by key)."""

    current: Entry | None
    last: Entry | None
    counts: dict
    complete: bool = True  # False: the rank uses more than MAX_GROUPS groups, some are unknown

    def entered(self, key: int) -> int | None:
        """How many collectives the rank entered on the group `key` (None: unknown)."""
        return self.counts.get(key, 0 if self.complete else None)


class FlightRecorder:
    """A rank's side: `enter` at the start of a collective, `unwind` to the depth before it at its
    end (or after an error). Writes to `map` at `offset` (a memory-mapped file) only what changed,
    a few microseconds a collective; without a map it does nothing (a device outside a cluster)."""

    def __init__(self, map=None, offset: int = 0):
        self.map, self.offset = map, offset
        self.stack: list[tuple[Entry, bytes]] = []
        self.counts: dict[int, int] = {}  # group key -> collectives entered on it
        self.slots: dict[int, int] = {}   # group key -> its row in the file's table
        self.groups: dict[int, tuple] = {}  # id(group) -> (group, key, ranks)
        self.version = 0
        if map is not None:
            self._begin()
            for at in (self._CURRENT, self._LAST):
                m = self.offset + at
                map[m:m + _ENTRY.size] = _EMPTY
            struct.pack_into("<H", map, self.offset + self._N, 0)
            self._end()

    _CURRENT, _LAST = _HEAD.size, _HEAD.size + _ENTRY.size
    _N = _HEAD.size + 2 * _ENTRY.size

    @property
    def depth(self) -> int:
        return len(self.stack)

    def enter(self, op: str, group=None) -> None:
        if self.map is None:
            return
        key, ranks = self._group(group)
        seq = self.counts[key] = self.counts.get(key, 0) + 1
        entry = Entry(op, ranks, key, seq, time.time())
        packed = _pack_entry(entry)
        self.stack.append((entry, packed))
        m, o = self.map, self.offset
        self._begin()
        m[o + self._CURRENT:o + self._CURRENT + _ENTRY.size] = packed
        m[o + self._LAST:o + self._LAST + _ENTRY.size] = packed
        slot = self.slots.setdefault(key, len(self.slots))  # a group's place in the file's table
        if slot < MAX_GROUPS:
            _COUNT.pack_into(m, o + self._N + 2 + slot * _COUNT.size, key, seq)
        if seq == 1:
            struct.pack_into("<H", m, o + self._N, len(self.slots))
        self._end()

    def unwind(self, depth: int) -> None:
        """Back to `depth` open collectives: the end of one, or those an exception left open."""
        if len(self.stack) > depth:
            del self.stack[depth:]
            m, o = self.map, self.offset + self._CURRENT
            self._begin()
            m[o:o + _ENTRY.size] = self.stack[-1][1] if self.stack else _EMPTY
            self._end()

    def _begin(self) -> None:
        self.version += 1
        _HEAD.pack_into(self.map, self.offset, 2 * self.version - 1, 0)  # odd: being written

    def _end(self) -> None:
        _HEAD.pack_into(self.map, self.offset, 2 * self.version, bool(self.stack))

    def _group(self, group) -> tuple[int, tuple]:
        import torch.distributed as dist

        g = dist.group.WORLD if group is None else group
        hit = self.groups.get(id(g))
        if hit is None or hit[0] is not g:
            hit = self.groups[id(g)] = (g, zlib.crc32(str(g.group_name).encode()),
                                        tuple(dist.get_process_group_ranks(g)))
        return hit[1], hit[2]


def _pack_entry(e: Entry) -> bytes:
    ranks = list(e.ranks[:MAX_RANKS]) + [0] * (MAX_RANKS - min(len(e.ranks), MAX_RANKS))
    return _ENTRY.pack(e.since, e.seq, e.key, e.op.encode()[:_OP], len(e.ranks), *ranks)


_EMPTY = bytes(_ENTRY.size)


def _unpack_entry(data: bytes, at: int) -> Entry | None:
    since, seq, key, op, n, *ranks = _ENTRY.unpack_from(data, at)
    if seq == 0 or n > MAX_RANKS:
        return None
    return Entry(op.rstrip(b"\0").decode(errors="replace"), tuple(ranks[:n]), key, seq, since)


def read(path: str, offset: int) -> Flight | None:
    """A rank's record from its beacon file (None if absent or being rewritten on every try)."""
    for _ in range(3):
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(SIZE)
                f.seek(offset)
                again = f.read(SIZE)
            version, has_current = _HEAD.unpack_from(data, 0)
        except (OSError, struct.error):
            return None
        if version == 0 or version % 2 or data != again:  # unwritten, or written meanwhile
            continue
        at = _HEAD.size
        current, last = _unpack_entry(data, at), _unpack_entry(data, at + _ENTRY.size)
        at += 2 * _ENTRY.size
        (n,) = struct.unpack_from("<H", data, at)
        counts = dict(_COUNT.unpack_from(data, at + 2 + i * _COUNT.size) for i in range(min(n, MAX_GROUPS)))
        return Flight(current if has_current else None, last, counts, n <= MAX_GROUPS)
    return None


@dataclass(frozen=True)
class Wait:
    """A rank waiting in a collective that can never complete, and the members that never come."""

    rank: int
    entry: Entry
    age: float
    missing: tuple


def never_complete(flights: dict, running, now: float, min_age: float = DESYNC_SECONDS) -> list[Wait]:
    """The ranks waiting, for `min_age` seconds or more, in a collective that can never complete.

    `flights`: every rank's `Flight` (None: unreadable, counted as a rank that may still come);
    `running`: the ranks still inside the call (the others returned or never ran it). A waiting
    rank may complete once every member it waits for may come: a running rank outside any
    collective (computing), or one whose own wait may complete; the least such set is found
    by iteration, so a cycle of ranks each waiting for the next never completes."""
    running = set(running)
    waiting = {r: f.current for r, f in flights.items()
               if r in running and f is not None and f.current is not None and now - f.current.since >= min_age}

    def missing(r):
        e = waiting[r]
        return tuple(m for m in e.ranks if m != r and _behind(flights.get(m), e))

    may = {r for r in flights if r in running and r not in waiting} | {r for r, f in flights.items() if f is None}
    grew = True
    while grew:
        grew = False
        for r in waiting:
            if r not in may and all(m in may for m in missing(r)):
                may.add(r)
                grew = True
    return [Wait(r, waiting[r], now - waiting[r].since, missing(r)) for r in sorted(waiting) if r not in may]


def _behind(f: Flight | None, e: Entry) -> bool:
    """True when the rank of record `f` has not yet entered the collective `e` (known only)."""
    n = None if f is None else f.entered(e.key)
    return n is not None and n < e.seq


def desync_message(waits: list[Wait], flights: dict, running, ranks, name: str) -> str:
    """`DesyncError`'s message: each waiting rank, its collective, and what each missing rank did
    instead (returned from the call, is not running it, or waits in another collective)."""
    running, ranks = set(running), set(ranks)

    def instead(m) -> str:
        f = flights.get(m)
        if m in running and f is not None and f.current is not None:
            return f"waits in {f.current.where()}"
        what = f"returned from {name} without calling it" if m in ranks else f"is not running {name}"
        last = f.last if f is not None else None
        return what + (f" (its last collective: {last.where()})" if last is not None else "")

    lines = []
    for w in waits:
        said = {}  # what a missing rank did instead -> the ranks that did it
        for m in w.missing:
            said.setdefault(instead(m), []).append(m)
        who = "; ".join(f"rank {ms[0]}, which {what}" if len(ms) == 1 else
                        f"ranks {', '.join(map(str, ms))}, which each {what.replace('its last', 'their last')}"
                        for what, ms in said.items())
        lines.append(f"rank {w.rank} has waited {w.age:.1f} s in {w.entry.where()}, for {who}")
    return "\n".join(lines) + (
        "\nThese collectives can never complete: every rank of a group must call the same collectives, "
        "on the same group, in the same order (one rank skipped a collective or called it on another group).")
