"""Point-to-point messages with an explicit process group, timed, traced and checked.

    h = isend(x, dst=1, group=g)     # returns at once; keep h until h.wait()
    recv(y, src=0, group=g)          # blocks until y holds rank 0's bytes

Every call takes the process group and a peer rank *within that group* (DESIGN.md section 10:
groups are arguments). Every call records events on this rank's trace: SEND when a message is
posted (with its bytes), RECV_WAIT while a receiver sits idle, TRANSFER for the bytes on the
link. Waiting and transfer are kept apart: a profiler that calls the wait "communication"
hides the bubble.

A message is a small header (sender's clock, numel, dtype) and the payload, on two tags. The
receiver reads the header first and posts the payload receive only once shape and dtype
match: gloo *aborts the receiving process* when more bytes arrive than the buffer holds, and
silently fills part of a bigger one. A mismatch is drained and raised as `MessageMismatchError`
naming both ranks and both (numel, dtype); the cluster stays usable. So a checked receive is
*matched when waited*: post sends non-blocking and wait receives before sends (`wait_all` does),
never ``irecv``; blocking ``send``; ``wait``. ``check=False`` posts the payload receive at once
and skips the header on real devices (the collectives validate shapes once per call instead,
chapter 06); a simulated device always sends the header, since it carries the timestamp.

Gloo sends are *rendezvous*: a blocking send returns only once the receiver has posted the
matching receive, whatever the size (measured: 4 bytes and 40 MB alike). Two ranks that both
send first deadlock (chapter 05).

On a simulated device a message arrives alpha + bytes / beta after it was posted (the device
profile's link). Under the virtual clock the receiver's clock jumps to the arrival time; under
the wall clock the receiver sleeps until it.

Handles are kept until waited: a gloo send whose handle is garbage-collected crashes the
process ("Cannot lock pointer to unbound buffer"), so every `Handle` registers itself with the
device until `wait()`.

`post_send` / `post_recv` are `isend` / `irecv` without the argument checks, for callers that
check their peers once (the collectives of chapter 06 post thousands of messages; every
microsecond of bookkeeping per message shows at small sizes).

Introduced in chapter 04; chapter 05 is about these functions.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelib.runtime.device import Device, current
from pipelib.trace import Kind

_HEADER_DTYPE = torch.float64
HEADER_LEN = 3  # sender's clock at posting, numel, dtype code
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}


class MessageMismatchError(ValueError):
    """A received message does not fit the receive buffer (numel or dtype differ)."""


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _dtype_name(code: int) -> str:
    return str(DTYPES[code]).replace("torch.", "") if 0 <= code < len(DTYPES) else f"dtype#{code}"


def _check_peer(peer: int, group, what: str) -> int:
    """Validate a peer rank within `group`; return its global rank."""
    size = dist.get_world_size(group)
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"rank {dist.get_rank()}: {what} on a group this rank is not part of")
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < size:
        raise ValueError(f"rank {dist.get_rank()}: {what} peer {peer!r} is outside the group "
                         f"(group ranks are 0..{size - 1})")
    if peer == me:
        raise ValueError(f"rank {dist.get_rank()}: {what} to itself (peer {peer} is this rank "
                         f"in the group); hand the tensor over locally instead")
    return dist.get_global_rank(group, peer) if group is not None else peer


def _check_tag(tag) -> None:
    if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
        raise ValueError(f"rank {dist.get_rank()}: tag must be an int >= 0, got {tag!r}")


# ------------------------------------------------------------------ counters
def _counts(dev: Device) -> dict:
    """This rank's counters; `Device.reset()` (and so `Cluster.reset()`) empties them."""
    if not dev.comm_counts:
        dev.comm_counts.update(dict.fromkeys(("bytes_sent", "bytes_received", "messages_sent",
                                              "messages_received"), 0))
    return dev.comm_counts


def counters() -> dict:
    """Payload bytes and messages this rank sent and received since `reset_counters()`.

    Headers are simulation and safety machinery, not data: they are not counted."""
    return dict(_counts(current()))


def reset_counters() -> None:
    _counts(current()).update(dict.fromkeys(_counts(current()), 0))


# ------------------------------------------------------------------ handles
class Handle:
    """A posted send or receive. Call `wait()` once (more calls return at once).

    A checked receive posts its payload receive when waited (after reading the header), and
    first does so for every earlier checked receive from the same peer and tag, so messages
    match in the order they were sent. (gloo's works report completion only through `wait`,
    and a work waited twice blocks: the handle waits each one exactly once.)"""

    __slots__ = ("dev", "op", "tensor", "buf", "peer", "group", "tag", "works", "header",
                 "header_work", "t_post", "label", "fields", "done", "error", "header_read",
                 "nbytes")

    def __init__(self, dev: Device, op: str, tensor, buf, peer: int, group, tag: int,
                 works, header, header_work, t_post: float, label: str, fields: dict):
        self.dev, self.op, self.tensor, self.buf, self.peer = dev, op, tensor, buf, peer
        self.group, self.tag = group, tag
        self.works, self.header, self.header_work = works, header, header_work
        self.t_post, self.label, self.fields = t_post, label, fields
        self.done, self.error, self.header_read = False, None, header_work is None
        self.nbytes = tensor.numel() * tensor.element_size()
        dev.outstanding[id(self)] = self

    @property
    def _unposted(self) -> bool:  # a checked receive whose payload is not posted yet
        return self.op == "recv" and not self.works

    def is_completed(self) -> bool:
        return self.done

    def _read_header(self) -> None:
        if not self.header_read:
            self.header_work.wait()
            self.header_read = True

    def _post_payload(self) -> None:
        """Read the header, then post the payload receive, or drain a mismatched message."""
        self._read_header()
        numel, code = int(self.header[1]), int(self.header[2])
        want = (self.tensor.numel(), DTYPE_CODE.get(self.tensor.dtype, -1))
        if (numel, code) != want:
            self.error = MessageMismatchError(
                f"rank {dist.get_rank()}: {self.label}: receive from rank {self.peer} expected "
                f"{want[0]} elements of {_dtype_name(want[1])} {tuple(self.tensor.shape)}, but rank "
                f"{self.peer} sent {numel} elements of {_dtype_name(code)}. Give the receive "
                f"buffer the sender's shape and dtype (the message was discarded).")
            self.buf = torch.empty(numel, dtype=DTYPES[code] if 0 <= code < len(DTYPES) else torch.uint8)
        self.works = [dist.irecv(self.buf, self.peer, group=self.group, tag=2 * self.tag)]

    def _block(self) -> None:
        """Post what is still unposted, then wait for every work of this message."""
        if self._unposted:
            for h in list(self.dev.outstanding.values()):  # earlier receives on this channel first
                if h._unposted and (h.peer, h.group, h.tag) == (self.peer, self.group, self.tag):
                    h._post_payload()
                if h is self:
                    break
        else:
            self._read_header()
        for w in self.works:
            w.wait()

    def wait(self, *, beacon: bool = True):
        """Wait until the message is through; returns the tensor. ``beacon=False`` leaves the
        activity beacon alone (a caller that waits many messages sets it once for all)."""
        if self.done:
            return self.tensor
        dev, clock = self.dev, self.dev.clock
        start = clock.now()
        if not beacon or (self.header_read and self.works and all(w.is_completed() for w in self.works)):
            self._block()  # already there: no need to tell the activity beacon
        else:
            with dev.activity.doing(_waiting(self.label, self.op, self.peer, self.nbytes)):
                self._block()
        self.done = True
        dev.outstanding.pop(id(self), None)
        if self.error is not None:
            raise self.error
        if self.buf is not self.tensor and self.op == "recv":
            self.tensor.copy_(self.buf.view_as(self.tensor))
        if self.op == "recv":
            c = _counts(dev)
            c["bytes_received"] += self.nbytes
            c["messages_received"] += 1
        if dev.modelled:
            t_sent = float(self.header[0]) if self.op == "recv" else self.t_post
            arrival = t_sent + dev.profile.message_time(self.nbytes)
            _, end = clock.wait_until(arrival)
            if self.op == "recv":
                if end > start:
                    dev.tracer.record(Kind.RECV_WAIT, self.label, start, end, peer=self.peer,
                                      bytes=self.nbytes, **self.fields)
                dev.tracer.record(Kind.TRANSFER, self.label, t_sent, arrival, peer=self.peer,
                                  bytes=self.nbytes, **self.fields)
        elif self.op == "recv":
            dev.tracer.record(Kind.RECV_WAIT, self.label, start, clock.now(), peer=self.peer,
                              bytes=self.nbytes, **self.fields)
        return self.tensor


@functools.lru_cache(maxsize=4096)
def _waiting(label: str, op: str, peer: int, nbytes: int) -> str:
    """The beacon while a message is waited: "act for 2F3: recv from rank 1 (64.0 KiB), waiting"
    (kept: a pipeline step waits for the same messages at every step)."""
    return f"{label}: {'send to' if op == 'send' else 'recv from'} rank {peer} ({_fmt_bytes(nbytes)}), waiting"


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
    t_post = dev.clock.now()
    src = tensor.detach().contiguous()
    works, header = [], None
    if dev.modelled or check:
        header = torch.tensor([t_post, src.numel(), DTYPE_CODE.get(src.dtype, -1)], dtype=_HEADER_DTYPE)
        works.append(dist.isend(header, peer, group=group, tag=2 * tag + 1))
    works.append(dist.isend(src, peer, group=group, tag=2 * tag))
    h = Handle(dev, "send", tensor, src, peer, group, tag, works, header, None, t_post, label, fields)
    c = _counts(dev)
    c["bytes_sent"] += h.nbytes
    c["messages_sent"] += 1
    dev.tracer.record(Kind.SEND, label, t_post, t_post, peer=peer, bytes=h.nbytes, **fields)
    return h


def post_recv(tensor, peer: int, group, tag: int, label: str, fields: dict, check: bool) -> Handle:
    """`irecv` without the argument checks (see `post_send`)."""
    dev = current()
    buf = tensor if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=torch.contiguous_format)
    works, header, header_work = [], None, None
    if dev.modelled or check:
        header = torch.empty(HEADER_LEN, dtype=_HEADER_DTYPE)
        header_work = dist.irecv(header, peer, group=group, tag=2 * tag + 1)
    if not check:
        works.append(dist.irecv(buf, peer, group=group, tag=2 * tag))
    return Handle(dev, "recv", tensor, buf, peer, group, tag, works, header, header_work,
                  dev.clock.now(), label, fields)


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
    the handles, in order. Wait for them with `wait_all(handles)`."""
    handles = []
    for p in ops:
        if p.op not in ("send", "recv", "isend", "irecv"):
            raise ValueError(f"rank {dist.get_rank()}: P2POp op must be 'send' or 'recv', got {p.op!r}")
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
