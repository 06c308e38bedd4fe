"""`%%px` cells: an engine error says which rank raised it, in one line, as `Cluster.run` does.

`%%px` (and `%px`) send a cell to every engine through ipyparallel's magics, not through
`Cluster.run`: an error comes back as ipyparallel's `CompositeError`, its tracebacks labelled by
engine id (not the rank), and a torch.distributed group that broke in the cell did not mark the
cluster unusable. `install(cluster)` gives the notebook's IPython shell a handler for those
errors: after ipyparallel's own display it prints one line per failing rank, "rank 2 raised
ValueError: ... in %%px" (`pipelib.runtime.errors.short`), and, when a rank's error says the
process group is dead (`pipelib.runtime.faults.broken_by`), marks the cluster broken and says
"call cluster.restart() to continue", so the next `cluster.run` says so too; and a `%%px` cell
on a cluster that is broken is refused with the same line, not sent to its engines.

`Cluster.start` installs it where it activates the magics (`_activate_px`); the last cluster
started is the one `%%px` runs on, and the one the handler names ranks for.

Introduced in chapter 04 (the cluster's errors).
"""
from __future__ import annotations

import weakref

from pipelib.runtime.errors import short
from pipelib.runtime.faults import broken_by

PX = "%%px"


def rank_errors(cluster, error) -> dict:
    """{rank: RemoteError} for an error a `%%px` cell raised on `cluster`'s engines (a
    `CompositeError`, one already displayed, or a single `RemoteError`); {} for any other."""
    from ipyparallel.error import AlreadyDisplayedError, CompositeError, RemoteError

    if isinstance(error, AlreadyDisplayedError):
        error = error.original_error
    if isinstance(error, CompositeError):
        found = [RemoteError(en, ev, tb, ei) for en, ev, tb, ei in error.elist]
    elif isinstance(error, RemoteError):
        found = [error]
    else:
        return {}
    ranks = {eid: r for r, eid in enumerate(getattr(cluster, "_eids", None) or [])}
    out = {}
    for e in found:
        eid = (getattr(e, "engine_info", None) or {}).get("engine_id")
        if eid in ranks:
            out[ranks[eid]] = e
    return out


def summary(cluster, errors: dict) -> str:
    """One line per failing rank; if torch.distributed broke, the cluster is marked broken and a
    last line says how to recover."""
    lines = [f"rank {r} raised {short(e)} in {PX}" for r, e in sorted(errors.items())]
    why = broken_by(errors, PX)
    if why:
        cluster._broken = why
        lines.append(f"The process group is dead ({why}): call cluster.restart() to continue.")
    return "\n".join(lines)


def install(cluster, shell=None) -> bool:
    """Give IPython's shell (the running one by default) the `%%px` error handler for `cluster`;
    False outside IPython. The handler holds the cluster weakly."""
    from ipyparallel.error import AlreadyDisplayedError, CompositeError, RemoteError

    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover
            return False
        shell = get_ipython()
    if shell is None:
        return False
    ref = weakref.ref(cluster)

    def handle(shell, etype, value, tb, tb_offset=None):
        if not isinstance(value, AlreadyDisplayedError):  # streamed errors are on screen already
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        cluster = ref()
        errors = rank_errors(cluster, value) if cluster is not None and cluster.running else {}
        if errors:
            print(summary(cluster, errors), flush=True)

    shell.set_custom_exc((CompositeError, AlreadyDisplayedError, RemoteError), handle)
    _guard_broken(shell, ref)
    return True


def refusal(lines: list, cluster) -> list:
    """A `%%px` / `%px` / `%autopx` cell's lines, or, when `cluster` is broken, one line that raises
    its one-line `ClusterError` instead of sending the cell to engines that cannot run it."""
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    if cluster is None or not cluster.running or not cluster._broken:
        return lines
    if not first.startswith(("%%px", "%px", "%autopx")):
        return lines
    from pipelib.runtime.faults import unusable_message

    return [f"raise __import__('pipelib.runtime.errors', fromlist=['ClusterError']).ClusterError("
            f"{unusable_message(cluster._broken)!r}) from None\n"]


def _guard_broken(shell, ref) -> None:
    """One input transformer per shell (a restarted cluster replaces its predecessor's): a `%%px`
    cell on a broken cluster is refused in one line, as `Cluster.run` refuses."""
    transformers = shell.input_transformers_cleanup
    old = getattr(shell, "_pipelib_px_guard", None)
    if old in transformers:
        transformers.remove(old)

    def guard(lines):
        return refusal(lines, ref())

    shell._pipelib_px_guard = guard
    transformers.append(guard)
