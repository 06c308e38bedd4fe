"""When a cluster can no longer be used: a process group that timed out or lost a connection.

gloo gives every operation the cluster's timeout (`Cluster(timeout=...)`). A rank that waits in
a torch.distributed operation for a peer that never comes (a collective one rank skipped, a rank
on another group) gets gloo's own timeout error at about the moment `Cluster.run` gives up on it,
and gloo closes that connection for good: every later collective on any rank then fails with
"Application timeout caused pair closure" or "Connection closed by peer", each looking like a
bug of its own. So a rank that timed out inside torch.distributed (or raised one of gloo's
connection errors) marks the cluster broken, and every later call raises one `ClusterError` in
one line naming `cluster.restart()`. A rank interrupted in plain Python (a `time.sleep`, a loop
of the reader's) leaves the cluster usable, as before; one interrupted while it waited inside
pipelib's or torch's communication code may have left a receive posted that would swallow the
next message, so it breaks the cluster too.

Introduced in chapter 04 (faults are errors, never hangs).
"""
from __future__ import annotations

import re

# What gloo (and torch.distributed around it) says when a process group is no longer usable.
DEAD_GROUP = re.compile(
    r"pair closure|Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"Timed out waiting \d+ ?ms|timed out after \d+ ?ms|DistBackendError|DistNetworkError|"
    r"gloo/transport", re.IGNORECASE)
# Frames of a traceback that show a rank was inside communication code when it stopped.
IN_COMMUNICATION = re.compile(r"torch/distributed/|pipelib/comm/|pipelib/runtime/alternate")


def _text(err) -> str:
    if err == "died" or err is None:
        return ""
    return " ".join(str(getattr(err, a, "") or "") for a in ("ename", "evalue", "traceback")) or str(err)


def group_failed(err) -> bool:
    """True when a rank's error (an ipyparallel RemoteError) says torch.distributed's group broke."""
    return bool(DEAD_GROUP.search(_text(err)))


def stopped_in_communication(err) -> bool:
    """True when a rank interrupted at a timeout was inside torch.distributed or pipelib.comm."""
    return group_failed(err) or bool(IN_COMMUNICATION.search(_text(err)))


def broken_by(errors: dict, name: str) -> str | None:
    """Why the cluster is unusable after these per-rank errors of `name`, or None if it is not."""
    bad = sorted(r for r, e in errors.items() if group_failed(e))
    if not bad:
        return None
    return f"torch.distributed failed on rank(s) {bad} in {name} (its connections are closed)"


def unusable_message(why: str) -> str:
    """`Cluster.run`'s one line once the cluster is broken."""
    return (f"the cluster is unusable after {why}: call cluster.restart() to continue "
            f"(it stops every engine and starts fresh ones)")
