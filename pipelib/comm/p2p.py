"""Point-to-point messages with an explicit process group, timed, traced and checked.

    h = isend(x, dst=1, group=g)     # returns at once; keep h until h.wait()
    recv(y, src=0, group=g)          # blocks until y holds rank 0's bytes

Every call takes the process group and a peer rank *within that group* (DESIGN.md section 10:
groups are arguments). Every call records events on this rank's trace: SEND when a message is
posted (with its bytes), RECV_WAIT while a receiver sits idle, TRANSFER for the bytes on the
link. Waiting and transfer are kept apart: a profiler that calls the wait "communication"
hides the bubble.

A message is a small header and the payload (`pipelib.comm.message`, with the `Handle` every
call returns): a checked receive is *matched when waited*, so post sends non-blocking and wait
receives before sends (`wait_all` does), never ``irecv``; blocking ``send``; ``wait``. A
message that does not fit the receive buffer raises `MessageMismatchError` naming both ranks
and both (numel, dtype). ``check=False`` posts the payload receive at once and skips the header
on real devices (the collectives validate shapes once per call instead, chapter 06).

Gloo sends are *rendezvous*: a blocking send returns only once the receiver has posted the
matching receive, whatever the size (measured: 4 bytes and 40 MB alike). Two ranks that both
send first deadlock (chapter 05).

On a simulated device a message arrives alpha + bytes / beta after it was posted (the device
profile's link).

`post_send` / `post_recv` are `isend` / `irecv` without the argument checks, for callers that
check their peers once (the collectives of chapter 06 post thousands of messages; every
microsecond of bookkeeping per message shows at small sizes). `Posted` posts a whole exchange on a
real device under gloo's rules first and does the bookkeeping while it travels (chapter 16's
uneven all-to-all).

Introduced in chapter 04; chapter 05 is about these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelib.checks import check_int, is_int_at_least
from pipelib.comm.message import (
    DTYPE_CODE,
    DTYPES,
    HEADER_DTYPE,
    HEADER_LEN,
    Handle,
    MessageMismatchError,
)
from pipelib.comm.ordered import post_ordered
from pipelib.runtime.device import current
from pipelib.trace import Kind

__all__ = ["isend", "irecv", "send", "recv", "wait_all", "P2POp", "batch_isend_irecv", "sendrecv",
           "counters", "reset_counters", "post_send", "post_recv", "post_batch", "Posted", "Handle", "DTYPES",
           "DTYPE_CODE", "MessageMismatchError"]  # the last four are defined in pipelib.comm.message


def _check_peer(peer: int, group, what: str) -> int:
    """Validate a peer rank within `group`; return its global rank."""
    size = dist.get_world_size(group)
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"rank {dist.get_rank()}: {what} on a group this rank is not part of")
    if not is_int_at_least(peer, 0) or peer >= size:
        raise ValueError(f"rank {dist.get_rank()}: {what} peer {peer!r} is outside the group "
                         f"(group ranks are 0..{size - 1})")
    if peer == me:
        raise ValueError(f"rank {dist.get_rank()}: {what} to itself (peer {peer} is this rank "
                         f"in the group); hand the tensor over locally instead")
    return dist.get_global_rank(group, peer) if group is not None else peer


def _check_tag(tag) -> None:
    check_int(tag, "tag", minimum=0, context=f"rank {dist.get_rank()}",
              hint="a send and its receive must use the same tag")


# ------------------------------------------------------------------ counters
def counters() -> dict:
    """Payload bytes and messages this rank sent and received since `reset_counters()`.

    Headers are simulation and safety machinery, not data: they are not counted."""
    return dict(current().counters())


def reset_counters() -> None:
    c = current().counters()
    c.update(dict.fromkeys(c, 0))


# ------------------------------------------------------------------ the calls
def isend(tensor: torch.Tensor, dst: int, group=None, *, tag: int = 0, label: str = "send",
          stage: int | None = None, microbatch: int | None = None, check: bool = True) -> Handle:
    """Post a send of `tensor` to group rank `dst`; returns at once. Sends numel*itemsize bytes."""
    peer = _check_peer(dst, group, "send")
    _check_tag(tag)
    return post_send(tensor, peer, group, tag, label, {"stage": stage, "microbatch": microbatch}, check)


def irecv(tensor: torch.Tensor, src: int, group=None, *, tag: int = 0, label: str = "recv",
          stage: int | None = None, microbatch: int | None = None, check: bool = True) -> Handle:
    """Post a receive into `tensor` (its numel and dtype must match the sender's) from `src`."""
    peer = _check_peer(src, group, "recv")
    _check_tag(tag)
    return post_recv(tensor, peer, group, tag, label, {"stage": stage, "microbatch": microbatch}, check)


def post_send(tensor, peer: int, group, tag: int, label: str, fields: dict, check: bool) -> Handle:
    """`isend` without the argument checks: `peer` is a *global* rank already validated (the
    collectives check their peers once per call, not once per message: chapter 06)."""
    dev = current()
    if dev.axes:
        fields = _with_axis(dev, group, fields)
    if dev.matching.by_order:  # NCCL's rules: no tag, no header on a real device
        return post_ordered(dev, (("send", tensor, peer, label, fields),), group, batched=False)[0]
    t_post = dev.clock.now()
    src = tensor.detach().contiguous()
    works, header = [], None
    if dev.modelled or check:
        header = torch.tensor([t_post, src.numel(), DTYPE_CODE.get(src.dtype, -1)], dtype=HEADER_DTYPE,
                              device="cpu")  # gloo's rules: a CPU backend (NCCL's send none)
        works.append(dist.isend(header, peer, group=group, tag=2 * tag + 1))
    works.append(dist.isend(src, peer, group=group, tag=2 * tag))
    h = Handle(dev, "send", tensor, src, peer, group, tag, works, header, None, t_post, label, fields)
    c = dev.counters()
    c["bytes_sent"] += h.nbytes
    c["messages_sent"] += 1
    dev.tracer.record(Kind.SEND, label, t_post, t_post, peer=peer, bytes=h.nbytes, **fields)
    return h


def post_recv(tensor, peer: int, group, tag: int, label: str, fields: dict, check: bool) -> Handle:
    """`irecv` without the argument checks (see `post_send`)."""
    dev = current()
    if dev.axes:
        fields = _with_axis(dev, group, fields)
    if dev.matching.by_order:
        return post_ordered(dev, (("recv", tensor, peer, label, fields),), group, batched=False)[0]
    buf = tensor if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=torch.contiguous_format)
    works, header, header_work = [], None, None
    if dev.modelled or check:
        header = torch.empty(HEADER_LEN, dtype=HEADER_DTYPE, device="cpu")
        header_work = dist.irecv(header, peer, group=group, tag=2 * tag + 1)
    if not check:
        works.append(dist.irecv(buf, peer, group=group, tag=2 * tag))
    return Handle(dev, "recv", tensor, buf, peer, group, tag, works, header, header_work,
                  dev.clock.now(), label, fields)


def post_batch(items, group, tag: int, fields: dict, check: bool) -> list[Handle]:
    """Post `items` (``(op, tensor, global peer, label)``, op "send" or "recv") as one exchange:
    under gloo's rules each in order (`post_recv` / `post_send`), under NCCL's as one torch
    batch (`pipelib.comm.ordered`). The collectives post each ring step this way."""
    dev = current()
    if dev.axes:
        fields = _with_axis(dev, group, fields)
    if dev.matching.by_order:
        return post_ordered(dev, [(op, t, peer, label, fields) for op, t, peer, label in items], group,
                            batched=True)
    return [(post_send if op == "send" else post_recv)(t, peer, group, tag, label, fields, check)
            for op, t, peer, label in items]


class Posted:
    """Messages posted at once as raw torch works on the process group itself (a real device under
    gloo's rules, no headers, sizes agreed by the caller; ``dist.isend``'s wrapper costs µs a message):
    ``items = [(op, contiguous tensor, global peer, step, chunk)]``, chunk the peer's rank in `group`,
    labelled "<name> step <step> chunk <chunk>" as the collectives' messages are. The caller does its
    bookkeeping while they travel, then `wait` records what `post_send` and a Handle's wait would
    (SEND, RECV_WAIT, counters, the beacon) and returns the bytes sent. On an error the works not
    waited yet stay with the device as Handles (gloo crashes on a dropped work). The uneven
    all-to-all of every MoE layer posts so: each µs before a rank's receives are up delays its peers."""

    __slots__ = ("dev", "items", "works", "group", "tag", "t_post", "name")

    def __init__(self, items, group, tag: int, name: str):
        pg, utag = dist.group.WORLD if group is None else group, 2 * tag
        send, recv, real = pg.send, pg.recv, torch.view_as_real  # as dist.isend does for complex
        self.works = [(send if op == "send" else recv)([real(t) if t.is_complex() else t], chunk, utag)
                      for op, t, _, _, chunk in items]
        self.dev, self.items, self.group, self.tag, self.name = current(), items, group, tag, name
        self.t_post = self.dev.clock.now()

    def wait(self) -> int:
        dev, t_post, name, group = self.dev, self.t_post, self.name, self.group
        record, now, act = dev.tracer.record, dev.clock.now, dev.activity
        axis = _with_axis(dev, group, {}) if dev.axes else {}
        sends = [(m, w) for m, w in zip(self.items, self.works) if m[0] == "send"]
        recvs = [(m, w) for m, w in zip(self.items, self.works) if m[0] == "recv"]
        sent, got, done, before = 0, 0, 0, act.text
        for (_, t, peer, step, chunk), _ in sends:
            record(Kind.SEND, f"{name} step {step} chunk {chunk}", t_post, t_post, peer=peer, bytes=t.nbytes, **axis)
            sent += t.nbytes
        act.set(f"{name}: {len(recvs)} receives, {len(sends)} sends, waiting")  # peers: the splits
        try:  # sends first, as gloo waits: the next call's posts then stall 3 ms 3x less often
            start = now()
            for _, w in sends:
                w.wait()
                done += 1
            for (_, t, peer, step, chunk), w in recvs:  # idle from the first wait on: the receive's
                w.wait()
                done, got = done + 1, got + t.nbytes
                record(Kind.RECV_WAIT, f"{name} step {step} chunk {chunk}", start, start := now(), peer=peer,
                       bytes=t.nbytes, **axis)
        except BaseException:
            for (op, t, peer, step, chunk), w in (sends + recvs)[done:]:  # kept until waited, as every Handle is
                label = f"{name} step {step} chunk {chunk}"
                Handle(dev, op, t, t, peer, group, self.tag, [w], None, None, t_post, label, axis)
            raise
        finally:
            act.set(before)
        c = dev.counters()
        c["bytes_sent"], c["messages_sent"] = c["bytes_sent"] + sent, c["messages_sent"] + len(sends)
        c["bytes_received"], c["messages_received"] = c["bytes_received"] + got, c["messages_received"] + len(recvs)
        return sent


def _with_axis(dev, group, fields: dict) -> dict:
    """The event fields plus the mesh axis of `group` (`Event.axis`), when it has one."""
    axis = dev.axis_of(group)
    return fields if axis is None else {**fields, "axis": axis}


def send(tensor: torch.Tensor, dst: int, group=None, **kw) -> None:
    """Blocking send: returns once the receiver has taken the message (modelled: once arrived)."""
    isend(tensor, dst, group, **kw).wait()


def recv(tensor: torch.Tensor, src: int, group=None, **kw) -> torch.Tensor:
    """Blocking receive into `tensor`; returns it."""
    return irecv(tensor, src, group, **kw).wait()


def wait_all(handles=None) -> None:
    """Wait for the given handles, or for every handle this rank still holds.

    Receives are waited first: on a simulated device the order does not change the clock, and
    on a real one it lets the bytes of a ring step flow before the sender is checked."""
    hs = list(current().outstanding.values()) if handles is None else list(handles)
    errors = []  # every handle is waited (gloo crashes on a dropped one), then the first error
    for h in sorted(hs, key=lambda h: h.op != "recv"):
        try:
            h.wait()
        except MessageMismatchError as e:
            errors.append(e)
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class P2POp:
    """One message of a batch: ``P2POp("send", x, 1)`` or ``P2POp("recv", y, 0)``."""

    op: str
    tensor: torch.Tensor
    peer: int
    group: object = None
    tag: int = 0
    label: str | None = None


def batch_isend_irecv(ops, *, check: bool = True) -> list[Handle]:
    """Post every send and receive of `ops` at once (like torch's batch_isend_irecv); returns
    the handles, in order. Wait for them with `wait_all(handles)`. Under NCCL's rules
    (`pipelib.runtime.matching`) they are one torch batch, one NCCL group call."""
    for p in ops:
        if p.op not in ("send", "recv", "isend", "irecv"):
            raise ValueError(f"rank {dist.get_rank()}: P2POp op must be 'send' or 'recv', got {p.op!r}")
    dev = current()
    if dev.matching.by_order:
        items = []
        for p in ops:
            send = p.op in ("send", "isend")
            peer = _check_peer(p.peer, p.group, "send" if send else "recv")
            _check_tag(p.tag)
            fields = {"stage": None, "microbatch": None}
            items.append(("send" if send else "recv", p.tensor, peer, p.label or p.op.lstrip("i"),
                          _with_axis(dev, p.group, fields) if dev.axes else fields))
        groups = {id(p.group) for p in ops}
        if len(groups) > 1:
            raise ValueError(f"rank {dist.get_rank()}: batch_isend_irecv with ops on {len(groups)} process "
                             f"groups; one batch is one group's call: post one batch per group")
        return post_ordered(dev, items, ops[0].group, batched=True) if items else []
    handles = []
    for p in ops:
        fn = isend if p.op in ("send", "isend") else irecv
        handles.append(fn(p.tensor, p.peer, p.group, tag=p.tag, check=check,
                          label=p.label or p.op.lstrip("i")))
    return handles


def sendrecv(send_tensor, dst: int, recv_tensor, src: int, group=None, *, tag: int = 0,
             check: bool = True) -> torch.Tensor:
    """Send to `dst` and receive from `src` at once (one ring step); returns `recv_tensor`."""
    wait_all(batch_isend_irecv([P2POp("send", send_tensor, dst, group, tag),
                                P2POp("recv", recv_tensor, src, group, tag)], check=check))
    return recv_tensor
