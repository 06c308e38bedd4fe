"""One event type for what the cluster measured and what `simulate` predicts.

Every op in pipelib (compute, send, receive, collective) records an `Event` on its rank;
`Cluster.trace()` gathers every rank's events into one `Trace`. `pipelib.pipeline.simulate` produces
events of the same type, so one figure function draws predicted above measured, and the
bubble is simply idle time on the timeline.

Waiting is never counted as communication: a receive that blocks records a RECV_WAIT event
(the rank sat idle) and, separately, a TRANSFER event (the bytes were on the link). Folding the
two together under-reports the bubble (see chapter 04 and DESIGN.md section 5).

Introduced in chapter 04.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum


class Kind(str, Enum):
    """What a rank was doing during an event."""

    COMPUTE = "compute"        # F, B, I, W, optimizer, any modelled or measured math
    SEND = "send"              # posting a message (the sender's side)
    RECV_WAIT = "recv-wait"    # a rank blocked, waiting for bytes to arrive: idle time
    TRANSFER = "transfer"      # bytes on the link, from the send to their arrival
    COLLECTIVE = "collective"  # a whole collective call, as seen by one rank

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


@dataclass(frozen=True, init=False)
class Event:
    """One interval on one rank's timeline (seconds since the cluster's epoch)."""

    rank: int
    kind: Kind
    label: str
    start: float
    end: float
    stage: int | None = None
    microbatch: int | None = None
    bytes: int = 0
    memory: int | None = None  # bytes allocated on this rank after the event
    peer: int | None = None    # the other rank of a send, receive or transfer
    axis: str | None = None    # the mesh axis whose group carried it ("dp", "tp", "pp", "cp", "ep")

    def __init__(self, rank: int, kind: Kind, label: str, start: float, end: float, stage: int | None = None,
                 microbatch: int | None = None, bytes: int = 0, memory: int | None = None, peer: int | None = None,
                 axis: str | None = None):
        # the fields above, filled at once: a frozen dataclass's own __init__ sets each through
        # object.__setattr__ (1.2 µs an event against 0.6), and every message records two or more
        if end < start:
            raise ValueError(f"Event {label!r} on rank {rank} ends before it starts (start={start}, end={end}); "
                             f"pass end >= start.")
        self.__dict__.update(rank=rank, kind=kind, label=label, start=start, end=end, stage=stage,
                             microbatch=microbatch, bytes=bytes, memory=memory, peer=peer, axis=axis)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def shifted(self, dt: float) -> Event:
        return replace(self, start=self.start + dt, end=self.end + dt)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = self.kind.value
        return d


class Tracer:
    """Per-rank recorder. The runtime appends; `Cluster.trace()` collects and clears.

    It never grows without bound: it keeps the last `limit` events (older ones are counted in
    `dropped`), so a loop nobody collects (a library user's 10,000 DDP steps) holds a fixed
    amount of memory. Outside the book's cluster it starts disabled (`runtime.device.current`):
    measurement is then asked for, not paid for."""

    LIMIT = 100_000  # events kept per rank: a chapter's longest run records a few thousand

    def __init__(self, rank: int = 0, *, enabled: bool = True, limit: int = LIMIT):
        self.rank, self.enabled, self.limit = rank, enabled, limit
        self.events: list[Event] = []
        self.dropped = 0

    def record(self, kind: Kind, label: str, start: float, end: float, **fields) -> Event:
        ev = Event(self.rank, kind if type(kind) is Kind else Kind(kind), label, start, end, **fields)
        if self.enabled:
            if len(self.events) >= self.limit:  # forget the oldest half: amortised O(1) per event
                half = self.limit // 2 or 1
                del self.events[:half]
                self.dropped += half
            self.events.append(ev)
        return ev

    def take(self) -> list[Event]:
        """Return the recorded events and start afresh."""
        evs = self.events
        self.clear()
        return evs

    def clear(self) -> None:
        self.events = []
        self.dropped = 0


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


class Trace:
    """The events of every rank, gathered into one table.

    >>> t = Trace([Event(0, Kind.COMPUTE, "F", 0, 1), Event(1, Kind.COMPUTE, "F", 1, 2)])
    >>> t.span, t.idle_fraction(0)
    (2, 0.5)
    """

    def __init__(self, events: Iterable[Event], world_size: int | None = None):
        self.events: list[Event] = sorted(events, key=lambda e: (e.start, e.rank, e.end))
        ranks = {e.rank for e in self.events}
        self.world_size = world_size if world_size is not None else (max(ranks) + 1 if ranks else 0)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __eq__(self, other) -> bool:
        return isinstance(other, Trace) and self.events == other.events

    def __repr__(self) -> str:
        return f"Trace({len(self.events)} events, world_size={self.world_size}, span={self.span:.6g} s)"

    @property
    def start(self) -> float:
        return min((e.start for e in self.events), default=0.0)

    @property
    def end(self) -> float:
        return max((e.end for e in self.events), default=0.0)

    @property
    def span(self) -> float:
        return self.end - self.start

    def filter(self, *, rank=None, kind=None, label=None, axis=None) -> Trace:
        kinds = None if kind is None else {Kind(k) for k in (kind if isinstance(kind, (list, tuple, set)) else [kind])}
        evs = [
            e for e in self.events
            if (rank is None or e.rank == rank)
            and (kinds is None or e.kind in kinds)
            and (label is None or e.label == label)
            and (axis is None or e.axis == axis)
        ]
        return Trace(evs, self.world_size)

    def busy(self, rank: int, kinds=(Kind.COMPUTE,)) -> float:
        """Seconds `rank` spent in events of `kinds` (overlaps counted once)."""
        ks = {Kind(k) for k in kinds}
        return _union_length((e.start, e.end) for e in self.events if e.rank == rank and e.kind in ks)

    def idle_fraction(self, rank: int, kinds=(Kind.COMPUTE,)) -> float:
        """Share of the trace's span that `rank` was not computing."""
        span = self.span
        return 0.0 if span == 0 else 1.0 - self.busy(rank, kinds) / span

    def bubble_fraction(self, kinds=(Kind.COMPUTE,)) -> float:
        """Idle share of the whole timeline: 1 - sum(busy) / (world_size * span)."""
        span = self.span
        if span == 0 or self.world_size == 0:
            return 0.0
        busy = sum(self.busy(r, kinds) for r in range(self.world_size))
        return 1.0 - busy / (self.world_size * span)

    def first_ranks(self, n: int | None = None) -> Trace:
        """The events of ranks 0..n-1 only (a pipeline on the first ranks of a larger cluster)."""
        n = self.world_size if n is None else n
        return Trace([e for e in self.events if e.rank < n], world_size=n)

    def bytes_sent(self, rank: int | None = None, axis: str | None = None) -> int:
        """Payload bytes sent (SEND events), by one rank or all, on one mesh axis or any."""
        return sum(e.bytes for e in self.events if e.kind == Kind.SEND and (rank is None or e.rank == rank)
                   and (axis is None or e.axis == axis))

    def peak_memory(self, rank: int) -> int:
        return max((e.memory for e in self.events if e.rank == rank and e.memory is not None), default=0)

    def rows(self) -> list[dict]:
        return [e.as_dict() for e in self.events]

    def table(self, limit: int | None = 20) -> str:
        """A fixed-width text table (deterministic, for notebooks and error messages)."""
        head = f"{'rank':>4} {'kind':<10} {'label':<14} {'start':>10} {'end':>10} {'bytes':>9}"
        lines = [head]
        evs = self.events if limit is None else self.events[:limit]
        for e in evs:
            lines.append(
                f"{e.rank:>4} {e.kind.value:<10} {e.label[:14]:<14} {e.start:>10.6f} {e.end:>10.6f} {e.bytes:>9}"
            )
        if limit is not None and len(self.events) > limit:
            lines.append(f"... {len(self.events) - limit} more events")
        return "\n".join(lines)

    def matches(self, predicted: Trace, *, kinds=(Kind.COMPUTE,), tol: float | None = None,
                align: bool = False, ranks: Mapping[int, int] | Sequence[int] | None = None) -> float:
        """How far this trace is from `predicted` (a `simulate` timeline, or another run): the
        largest difference, in seconds, between the start or the end of one event and of the same
        event there, over the events of `kinds` (compute by default).

        Rank by rank, both must hold the same events in the same order (kind, label, stage,
        microbatch): otherwise an AssertionError names the rank and the first event that differs.
        With `tol`, a difference above it raises too, naming the event. `align=True` counts each
        trace from its own first event of `kinds` (a wall clock's epoch is not a prediction's 0).
        `ranks` maps each rank here to the rank of `predicted` it must follow (a dict, or a list
        indexed by rank), when a prediction has fewer ranks than the run: on a pp x ep mesh the
        ranks at one pipeline position all follow `simulate`'s rank for it,
        `ranks={r: topo.coords(r).pp for r in range(topo.world_size)}`. Every rank here with events
        must be in it, and every rank there with events followed. Without it, rank r follows rank r.
        Chapters 10-13 check a measured step against its prediction (or two runs) with it, chapter 16
        a pipeline of MoE layers.
        """
        ks = {Kind(k) for k in kinds}
        ours = [e for e in self.events if e.kind in ks]
        theirs = [e for e in predicted.events if e.kind in ks]
        t0 = min((e.start for e in ours), default=0.0) if align else 0.0
        t1 = min((e.start for e in theirs), default=0.0) if align else 0.0
        pairs = _rank_pairs({e.rank for e in ours}, {e.rank for e in theirs}, ranks)
        worst, where = 0.0, None
        for rank, other in pairs:
            a = [e for e in ours if e.rank == rank]
            b = [e for e in theirs if e.rank == other]
            for i in range(max(len(a), len(b))):
                x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
                if x is None or y is None or _event_key(x) != _event_key(y):
                    there = "" if other == rank else f" (its rank {other})"
                    raise AssertionError(
                        f"rank {rank} ran another order: event {i} is {_event_text(x)} here but "
                        f"{_event_text(y)} in the prediction{there} ({len(a)} events here, {len(b)} there)")
                d = max(abs((x.start - t0) - (y.start - t1)), abs((x.end - t0) - (y.end - t1)))
                if d > worst:
                    worst, where = d, x
        if tol is not None and worst > tol:
            raise AssertionError(f"rank {where.rank}'s {_event_text(where)} is {worst:.3g} s away from "
                                 f"its prediction (tolerance {tol:g} s)")
        return worst


def _rank_pairs(ours: set[int], theirs: set[int], ranks) -> list[tuple[int, int]]:
    """(rank here, rank in the prediction) pairs for `Trace.matches`: r with r, or by `ranks`."""
    if ranks is None:
        return [(r, r) for r in sorted(ours | theirs)]
    follows = dict(ranks) if isinstance(ranks, Mapping) else dict(enumerate(ranks))
    if ours - follows.keys():
        raise ValueError(f"ranks {sorted(ours - follows.keys())} have events here but no rank of the prediction "
                         f"in `ranks` ({follows}): map every rank to the one it follows")
    if theirs - set(follows.values()):
        raise AssertionError(f"the prediction's ranks {sorted(theirs - set(follows.values()))} have events that "
                             f"no rank here follows (ranks={follows})")
    return sorted(follows.items())


def _event_key(e: Event) -> tuple:
    return e.kind, e.label, e.stage, e.microbatch


def _event_text(e: Event | None) -> str:
    if e is None:
        return "missing"
    where = "".join(f" {k} {v}" for k, v in (("stage", e.stage), ("microbatch", e.microbatch)) if v is not None)
    return f"{e.kind.value} {e.label!r}{where} [{e.start:.6g}, {e.end:.6g}]"
