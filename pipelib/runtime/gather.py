"""Waiting for the ranks of one `Cluster.run`: deaths, errors and stalls become errors.

Every rank's AsyncResult is polled; a rank whose process died raises `RankDiedError` at once,
one that raised `RankError` (after a short grace, so its peers' errors are gathered too), and
one that passes the timeout is interrupted and raises `RankTimeoutError` naming what it was
doing (its activity beacon). Ranks left waiting in a collective that can never complete (a
rank of its group returned without calling it, or waits in another collective) raise
`DesyncError` within seconds, from the ranks' flight records (`pipelib.runtime.flight`).
Introduced in chapter 04.
"""
from __future__ import annotations

import os
import signal
import time

from pipelib.runtime.errors import (DesyncError, RankDiedError, RankError, RankTimeoutError, died_message,
                                    raised_message, stuck_message)
from pipelib.runtime.faults import broken_by, group_failed, stopped_in_communication
from pipelib.runtime.flight import DESYNC_SECONDS, desync_message, never_complete


def _interrupt(cluster, ranks) -> None:
    for r in ranks:
        try:
            os.kill(cluster.info[r]["pid"], signal.SIGINT)
        except (OSError, TypeError, IndexError, KeyError):
            pass


def wait_for_ranks(cluster, ars, name, timeout, ranks=None, grace=2.0) -> list:
    """Wait for one AsyncResult per rank of `cluster` (all, or `ranks`), turning deaths, errors
    and stalls into errors; one result per rank."""
    from ipyparallel.error import EngineError, RemoteError

    ranks = list(range(cluster.world_size)) if ranks is None else ranks
    results, errors, pending = {}, {}, dict(zip(ranks, ars))
    deadline, first_error = time.monotonic() + timeout, None
    desync = _DesyncWatch(cluster)
    while pending:
        for r, ar in list(pending.items()):
            if ar.ready():
                del pending[r]
                try:
                    results[r] = ar.get()
                except EngineError:
                    errors[r] = "died"
                except RemoteError as e:
                    errors[r] = e
        dead = [r for r in ranks if (errors.get(r) == "died") or (r in pending and not cluster._alive(r))]
        if dead:
            cluster._broken = f"rank(s) {dead} died while running {name}"
            raise RankDiedError(died_message(dead, name, cluster.activities(), errors, _collectives(cluster)), dead)
        now = time.monotonic()
        if errors and first_error is None:
            first_error = now
        stalled = first_error is not None and now - first_error > grace and _all_started(cluster, pending)
        if pending and (stalled or now > deadline):
            _fail_pending(cluster, pending, name, timeout, errors)
        if pending and not errors:  # a failed rank is the cause: the grace above names it
            _fail_desync(cluster, pending, name, ranks, desync.look(pending, now))
        if pending:
            cluster.client.wait(list(pending.values()), timeout=0.05)
    if errors:
        why = broken_by(errors, name)
        if why:
            cluster._broken = why
        raise RankError(raised_message(errors, name) + (
            f"\nThe process group is dead ({why}): call cluster.restart() to continue." if why else ""), errors)
    return [results[r] for r in ranks]


class _DesyncWatch:
    """Reads every rank's flight record every 0.25 s once the call is `DESYNC_SECONDS` old; a
    verdict stands only when two looks in a row find the same waits."""

    def __init__(self, cluster):
        self.cluster, self.next, self.before = cluster, time.monotonic() + DESYNC_SECONDS, None

    def look(self, pending, now):
        """(waits that can never complete, every rank's record), or None."""
        from pipelib.runtime.beacon import Activity
        from pipelib.runtime.flight import read

        if now < self.next or not self.cluster._rundir:
            return None
        self.next = now + 0.25
        flights = {r: read(self.cluster._activity_path(r), Activity.SIZE) for r in range(self.cluster.world_size)}
        waits = never_complete(flights, pending, time.time())
        seen = [(w.rank, w.entry.key, w.entry.seq, w.missing) for w in waits]
        confirmed, self.before = bool(waits) and seen == self.before, seen
        return (waits, flights) if confirmed else None


def _collectives(cluster) -> dict[int, str]:
    """What each rank's flight record says: the collective it is in, or the last it called."""
    from pipelib.runtime.beacon import Activity
    from pipelib.runtime.flight import read

    if not cluster._rundir:
        return {}
    flights = {r: read(cluster._activity_path(r), Activity.SIZE) for r in range(cluster.world_size)}
    return {r: f"was in {f.current.where()}" if f.current else f"had last called {f.last.where()}"
            for r, f in flights.items() if f is not None and (f.current or f.last)}


def _fail_desync(cluster, pending, name, ranks, found) -> None:
    """Raise `DesyncError` for `found` (from `_DesyncWatch.look`), after interrupting the pending
    ranks; the cluster is broken (the waiting ranks hold receives posted in gloo)."""
    if not found:
        return
    waits, flights = found
    waiting, missing = [w.rank for w in waits], sorted({m for w in waits for m in w.missing})
    message = desync_message(waits, flights, pending, ranks, name)
    _interrupt(cluster, sorted(pending))
    cluster._broken = f"rank(s) {waiting} waited in collectives that could never complete in {name}"
    raise DesyncError(message + " The waiting ranks were interrupted; call cluster.restart() to continue.",
                      waiting, missing)


def _all_started(cluster, pending) -> bool:
    """False while a pending rank's beacon still reads "idle": it has not begun this call (a
    loaded machine starts ranks late), so it is not waiting for a failed peer and the grace
    after a peer's error does not run out on it; the timeout still does."""
    from pipelib.runtime.beacon import Activity

    return not any(Activity.read(cluster._activity_path(r))[1] == "idle" for r in pending)


def _fail_pending(cluster, pending, name, timeout, errors):
    acts = cluster.activities()
    stuck = sorted(pending)
    _interrupt(cluster, stuck)
    end = time.monotonic() + 2.0
    while time.monotonic() < end and any(not ar.ready() for ar in pending.values()):
        cluster.client.wait(list(pending.values()), timeout=0.1)
    late = {r: _error_of(ar) for r, ar in pending.items() if ar.ready()}
    if any(not ar.ready() for ar in pending.values()):
        cluster._broken = f"rank(s) {stuck} stuck in {name}"
    else:  # returned: from plain Python the cluster stays usable, from torch.distributed it does not
        inside = [r for r, e in late.items() if stopped_in_communication(e)]
        if inside:
            cluster._broken = (f"rank(s) {inside} timed out inside torch.distributed in {name} "
                               f"(gloo closes a connection that timed out)")
    late = {r: e for r, e in late.items() if group_failed(e)}  # gloo's own timeout: worth a line
    raise RankTimeoutError(stuck_message(stuck, name, timeout, acts, errors, bool(cluster._broken), late), stuck)


def _error_of(ar):
    """The RemoteError a finished AsyncResult holds, or None."""
    from ipyparallel.error import RemoteError

    try:
        ar.get(timeout=0)
    except RemoteError as e:
        return e
    except Exception:  # noqa: BLE001 - an engine error is a death, handled elsewhere
        return None
    return None
