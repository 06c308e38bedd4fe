"""One message on the wire: its header, the dtype table, and the `Handle` that completes it.

A message is a small header (sender's clock, numel, dtype code) and the payload, on two tags
(2 tag + 1 and 2 tag). The receiver reads the header first and posts the payload receive only
once shape and dtype match: gloo *aborts the receiving process* when more bytes arrive than the
buffer holds, and silently fills part of a bigger one. A mismatch is drained and raised as
`MessageMismatchError` naming both ranks and both (numel, dtype); the cluster stays usable. So a
checked receive is *matched when waited*. ``check=False`` posts the payload receive at once and
skips the header on real devices; a simulated device always sends the header, since it carries
the timestamp.

`DTYPES` is the one table of dtype codes: the header, the collectives' agreement check and the
pipeline executor's shape handshake all code a dtype as its index here.

Handles are kept until waited: a gloo send whose handle is garbage-collected crashes the
process ("Cannot lock pointer to unbound buffer"), so every `Handle` registers itself with the
device until `wait()`. On a simulated device a message arrives alpha + bytes / beta after it was
posted, on the link its sender and receiver share (`DeviceProfile.link_between`: one link, or
on a profile with nodes a fast one inside a node and a slow one between, chapter 15): under
the virtual clock the receiver's clock jumps to the arrival time; under the wall clock the
receiver sleeps until it.

The calls that post messages are in `pipelib.comm.p2p`. Introduced in chapter 04; chapter 05 is
about these messages.
"""
from __future__ import annotations

import functools
from types import MappingProxyType

import torch
import torch.distributed as dist

from pipelib.runtime.device import Device
from pipelib.runtime.measured import stream_synchronize
from pipelib.trace import Kind

HEADER_DTYPE = torch.float64
HEADER_LEN = 3  # sender's clock at posting, numel, dtype code
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
DTYPE_CODE = MappingProxyType({d: i for i, d in enumerate(DTYPES)})


class MessageMismatchError(ValueError):
    """A received message does not fit the receive buffer (numel or dtype differ)."""


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def dtype_name(code: int) -> str:
    """The name of dtype code `code` ("float32"), or "dtype#99" for a code not in `DTYPES`."""
    return str(DTYPES[code]).replace("torch.", "") if 0 <= code < len(DTYPES) else f"dtype#{code}"


class Handle:
    """A posted send or receive. Call `wait()` once (more calls return at once).

    A checked receive posts its payload receive when waited (after reading the header), and
    first does so for every earlier checked receive from the same peer and tag, so messages
    match in the order they were sent. (gloo's works report completion only through `wait`,
    and a work waited twice blocks: the handle waits each one exactly once.)"""

    __slots__ = ("dev", "op", "tensor", "buf", "peer", "group", "tag", "works", "header",
                 "header_work", "t_post", "label", "fields", "done", "error", "header_read",
                 "nbytes", "batch")

    def __init__(self, dev: Device, op: str, tensor, buf, peer: int, group, tag: int,
                 works, header, header_work, t_post: float, label: str, fields: dict):
        self.dev, self.op, self.tensor, self.buf, self.peer = dev, op, tensor, buf, peer
        self.group, self.tag = group, tag
        self.works, self.header, self.header_work = works, header, header_work
        self.t_post, self.label, self.fields = t_post, label, fields
        self.done, self.error, self.header_read = False, None, header_work is None
        self.nbytes = tensor.nbytes
        self.batch = None  # NCCL's rules: the batch it was posted in (`pipelib.comm.ordered`)
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

    def _mismatch(self) -> bool:
        """Whether the header names another (numel, dtype) than the receive buffer's; if so,
        `error` is set to the `MessageMismatchError` naming both."""
        numel, code = int(self.header[1]), int(self.header[2])
        want = (self.tensor.numel(), DTYPE_CODE.get(self.tensor.dtype, -1))
        if (numel, code) != want:
            self.error = MessageMismatchError(
                f"rank {dist.get_rank()}: {self.label}: receive from rank {self.peer} expected "
                f"{want[0]} elements of {dtype_name(want[1])} {tuple(self.tensor.shape)}, but rank "
                f"{self.peer} sent {numel} elements of {dtype_name(code)}. Give the receive "
                f"buffer the sender's shape and dtype (the message was discarded).")
        return self.error is not None

    def _post_payload(self) -> None:
        """Read the header, then post the payload receive, or drain a mismatched message."""
        self._read_header()
        if self._mismatch():
            numel, code = int(self.header[1]), int(self.header[2])
            self.buf = torch.empty(numel, dtype=DTYPES[code] if 0 <= code < len(DTYPES) else torch.uint8,
                                   device=self.buf.device)  # drained
        self.works = [dist.irecv(self.buf, self.peer, group=self.group, tag=2 * self.tag)]

    def _block(self) -> None:
        """Post what is still unposted, then wait for every work of this message."""
        if self.op == "recv" and not self.works:  # unposted: earlier receives on this channel first
            for h in list(self.dev.outstanding.values()):
                if h._unposted and (h.peer, h.group, h.tag) == (self.peer, self.group, self.tag):
                    h._post_payload()
                if h is self:
                    break
        elif not self.header_read:
            self._read_header()
        for w in self.works:
            w.wait()
        stream_synchronize(self.dev)  # NCCL's wait only orders streams: block until the bytes are in
        if self.batch is not None and self.header is not None and self.op == "recv":
            self._mismatch()  # NCCL's rules: header and payload were posted at once (`comm.ordered`)

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
        if self.op == "recv":
            if self.buf is not self.tensor:
                self.tensor.copy_(self.buf.view_as(self.tensor))
            c = dev.counters()
            c["bytes_received"] += self.nbytes
            c["messages_received"] += 1
        if dev.modelled:
            t_sent = float(self.header[0]) if self.op == "recv" else self.t_post
            src, dst = (self.peer, dev.rank) if self.op == "recv" else (dev.rank, self.peer)
            arrival = t_sent + dev.profile.message_time(self.nbytes, src, dst)  # the pair's link
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
