"""The ring engine of the collectives: steps of a ring run as a pipeline of segment messages.

`pipelib.comm.collectives` describes each ring collective as a list of steps (what every rank
sends to its right neighbour and receives from its left at each step, and what it reduces);
`run_ring` runs them. On a real device the ring collectives cut each chunk into messages of at
most SEGMENT_BYTES and keep DEPTH of them in flight, so the reduction of one overlaps the
transfer of the next (``segment_bytes=`` changes it, 0 = whole chunks); a simulated device
sends whole chunks, the messages the alpha-beta model counts (`pipelib.comm.alphabeta`). The
bytes sent are the same either way.

Who sends what to whom: at every step, rank r sends to r+1 and receives from r-1 (group ranks),
each segment a message labelled ``"<name> <phase> step <s> chunk <c>"`` (`pipelib.viz.comm`
replays them).

Introduced in chapter 06.
"""
from __future__ import annotations

import torch

from pipelib.runtime.device import current

SEGMENT_BYTES = 8 << 20  # real devices: ring messages of at most 8 MiB (see num_segments)
DEPTH = 2                # ring messages in flight per direction while the previous one is reduced


def reduce_into(op: str, a, b, out) -> None:
    """out = op(a, b) elementwise, for op in sum, avg (summed here, divided once at the end),
    max, min."""
    if op in ("sum", "avg"):
        torch.add(a, b, out=out)
    elif op == "max":
        torch.maximum(a, b, out=out)
    else:
        torch.minimum(a, b, out=out)


def num_segments(c, chunk_bytes: int) -> int:
    """Messages per ring chunk of call `c`. A simulated device sends each chunk whole (the
    alpha-beta model counts one message per step) unless `segment_bytes` is given; a real one
    cuts it into messages of at most SEGMENT_BYTES, so that the reduction of one segment
    overlaps the transfer of the next and the receive buffer stays small (pipelining, as
    gloo's and NCCL's rings do). gloo cuts at 1 MiB; from Python every message costs tens of
    microseconds of bookkeeping plus a wake-up of the waiting rank, and on a laptop whose ranks
    share two cores there is no idle core to overlap with: measured on 2 cores, 1 MiB messages
    were 20-40% slower than whole chunks at 4-16 MiB, 8-16 MiB ones 5-10% faster at 64 MiB
    (bench/collectives.py). So we cut at 8 MiB."""
    segment_bytes = c.segment_bytes
    if segment_bytes is None:
        segment_bytes = 0 if c.dev.modelled else SEGMENT_BYTES
    return max(1, -(-chunk_bytes // segment_bytes)) if segment_bytes else 1


def segments(chunks, S: int) -> list[list]:
    """Each chunk cut into S segments (views, `torch.tensor_split`)."""
    return [list(torch.tensor_split(x, S)) for x in chunks]


def scratch_buffer(dtype, rows: int, cols: int, device=None):
    """A (rows, cols) receive buffer on `device` (the CPU if None), reused from call to call."""
    scratch = current().scratch  # kept on the device: a fresh big buffer costs page faults
    key = (torch.device("cpu") if device is None else torch.device(device), dtype)
    buf = scratch.get(key)
    if buf is None or buf.numel() < rows * cols:
        buf = scratch[key] = torch.empty(rows * cols, dtype=dtype, device=key[0])
    return buf[: rows * cols].view(rows, cols)


def run_ring(c, steps, S: int) -> None:
    """Run ring steps of call `c` as a pipeline of S segment messages per step.
    ``steps[t] = (phase, step, chunk, sends, recvs, reduces, divide)``: segment k of step t
    sends ``sends[k]`` to the right neighbour and receives from the left into ``recvs[k]``
    (copy phases) or into a scratch slot that is then reduced, ``reduces[k] = (local, target)``:
    target = op(local, received), divided by n if `divide` (avg). Step t+1 sends what step t
    received, segment by segment, so segment k of step t+1 is posted once segment k of step t
    is waited and reduced; DEPTH segments fly at once. With one segment this is the textbook
    loop: post, wait (receive, then send), reduce."""
    depth, total = min(DEPTH, S), len(steps) * S
    reducing = [r[0].numel() for st in steps if st[5] for r in st[5]]
    first = steps[0][3][0]
    scratch = scratch_buffer(first.dtype, depth, max(reducing), first.device) if reducing else None
    right, left = c.glob(c.peer(1)), c.glob(c.peer(-1))
    live = {}

    def post(j):
        t, k = divmod(j, S)
        phase, step, chunk, sends, recvs, reduces, _ = steps[t]
        into = scratch[j % depth, : reduces[k][0].numel()] if reduces else recvs[k]
        live[j] = c.post(phase, step, chunk, send=sends[k], dst=right, recv=into, src=left, glob=True)

    for j in range(min(depth, total)):
        post(j)
    for j in range(total):
        recv, send = live.pop(j)
        c.dev.activity.set(f"{recv.label}: recv from rank {left}, send to rank {right}, waiting")
        recv.wait(beacon=False)
        send.wait(beacon=False)
        t, k = divmod(j, S)
        reduces, divide = steps[t][5], steps[t][6]
        if reduces:
            local, target = reduces[k]
            reduce_into(c.op, local, recv.tensor, target)
            if divide:
                target.div_(c.n)
        if j + depth < total:
            post(j + depth)
