"""A stalled rank, caught: `monitored_barrier` names the rank that did not arrive.

    out = stall_probe(stalled_rank=1, stall_s=3.0, timeout_s=1.0)   # on every rank

A rank that hangs (a deadlock, a slow disk, a swapped-out process) is worse than one that dies:
a dead peer closes its sockets and the others fail within milliseconds, a stalled one leaves
them waiting in a collective until the process group's timeout, and an ordinary barrier's
error says only that *something* timed out. gloo's `monitored_barrier` makes rank 0 wait for
each rank in turn and name the ones missing after `timeout`; torchelastic and NCCL's watchdog
do the same at larger scale (a heartbeat per rank). After such an error the group may hold
messages half exchanged: restart the ranks before training on.

Runs on every rank under gloo (the book's cluster, or spawned processes). Introduced in chapter 18.
"""
from __future__ import annotations

import datetime
import time

import torch.distributed as dist


def stall_probe(stalled_rank: int, stall_s: float, timeout_s: float) -> dict:
    """Every rank enters a `monitored_barrier` with `timeout_s`; `stalled_rank` first sleeps
    `stall_s`. Returns this rank's {"rank", "error" (its message, or None), "seconds"}."""
    rank = dist.get_rank()
    t0 = time.perf_counter()
    if rank == stalled_rank:
        time.sleep(stall_s)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
        error = None
    except RuntimeError as e:
        error = str(e)
    return {"rank": rank, "error": error, "seconds": time.perf_counter() - t0}
