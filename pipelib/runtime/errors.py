"""Faults are errors, never hangs: what `Cluster.run` raises, and the messages that teach.

A rank that raises, dies or does not finish becomes one exception in the notebook, naming every
rank involved and what each was doing (its activity beacon, `pipelib.runtime.beacon`):

- `RankError`: code raised on one or more ranks; the message gives each rank's exception and
  the first rank's traceback, cut to the reader's own frames;
- `RankDiedError`: a rank's process died (a segfault, a kill, `os._exit`); the cluster must be
  restarted;
- `RankTimeoutError`: a rank did not finish within the timeout, or kept waiting after another
  rank failed (a peer that never sends: a deadlock or a dead peer);
- `DesyncError`, a `RankTimeoutError` raised within seconds rather than at the timeout: ranks
  wait in a collective that can never complete, because a rank of its group returned without
  calling it or waits in another collective (`pipelib.runtime.flight`).

All three are `ClusterError`s. Introduced in chapter 04; chapters 05, 06 and 12 catch them on
purpose: two blocking sends that deadlock, a collective whose ranks disagree on the shape,
1F1B with blocking sends.
"""
from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The line of `pipelib.runtime.engine._call` (under `_run_on_rank`) that calls the user's function: a remote
# traceback is cut after it, dropping ipyparallel's and pipelib's own frames.
_CALL = "return fn(*args, **kwargs)\n"


class ClusterError(RuntimeError):
    """Something went wrong on the cluster; the message names the ranks involved."""


class RankError(ClusterError):
    """Code raised an exception on one or more ranks."""

    def __init__(self, message: str, errors: dict):
        super().__init__(message)
        self.errors = errors  # rank -> ipyparallel RemoteError


class RankDiedError(ClusterError):
    """A rank's process died."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class RankTimeoutError(ClusterError, TimeoutError):
    """One or more ranks did not finish within the timeout."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class DesyncError(RankTimeoutError):
    """Ranks wait in a collective that can never complete: a rank of its group returned without
    calling it, or called another one (another group, another order). `ranks`: the waiting ranks;
    `missing`: the ranks that never came."""

    def __init__(self, message: str, ranks: list[int], missing: list[int]):
        super().__init__(message, ranks)
        self.missing = missing


def short(err) -> str:
    """One line for a rank's failure: 'died', or the remote exception's type and message."""
    if err == "died":
        return "died"
    return f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}"


def raised_message(errors: dict, name: str) -> str:
    """`RankError`'s message: each rank's exception in `name`, then the first one's traceback."""
    lines = [f"rank {r} raised {short(e)} in {name}" for r, e in sorted(errors.items())]
    first = errors[min(errors)]
    tb = getattr(first, "traceback", None)
    if tb:
        tb = _ANSI.sub("", tb)
        if _CALL in tb:
            tb = tb.split(_CALL, 1)[1]
        lines.append(f"--- traceback on rank {min(errors)} ---\n{tb.strip()}")
    return "\n".join(lines)


def died_message(dead: list[int], name: str, activities: dict[int, str], errors: dict,
                 collectives: dict[int, str] | None = None) -> str:
    """`RankDiedError`'s message: what each dead rank was doing, then the others' failures, then
    the collective each rank was in or had last called (`collectives`, from the flight records of
    `pipelib.runtime.flight`: an unchecked collective names its shape, so a size mismatch that
    killed a rank is named)."""
    lines = [f"rank {r} died while running {name}; it was doing: {activities[r]}" for r in dead]
    lines += [f"rank {r} then failed: {short(e)}" for r, e in errors.items() if e != "died"]
    lines += [f"rank {r} {what}" for r, what in sorted((collectives or {}).items())]
    return "\n".join(lines) + "\nCall cluster.restart() to continue."


def stuck_message(stuck: list[int], name: str, timeout: float, activities: dict[int, str],
                  errors: dict, broken: bool, late: dict | None = None) -> str:
    """`RankTimeoutError`'s message: what each stuck rank was doing, the others' failures, and
    what to change (a deadlock, a dead peer, or a timeout too short for slow work). `late`: what
    stuck ranks raised once stopped (torch.distributed's own timeout, which fires with the run's)."""
    why = "after other ranks failed" if errors else f"within {timeout:g} s"
    lines = [f"rank {r} did not finish {name} {why}; it was doing: {activities[r]}" for r in stuck]
    lines += [f"rank {r} then raised {short(e)}" for r, e in sorted((late or {}).items())]
    lines += [f"rank {r} failed: {short(e)}" for r, e in sorted(errors.items())]
    hint = ("A rank waiting for a peer that never sends is a deadlock or a dead peer; "
            "raise timeout= if the work is just slow.")
    if broken:
        hint += " Call cluster.restart() to continue."
    return "\n".join(lines) + "\n" + hint
