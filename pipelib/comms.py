"""Point-to-point messages with an explicit process group, timed and traced.

    h = isend(x, dst=1, group=g)     # returns at once; keep h until h.wait()
    recv(y, src=0, group=g)          # blocks until y holds rank 0's bytes

Every call takes the process group and a peer rank *within that group* (DESIGN.md section 10:
groups are arguments). Every call records events on this rank's trace: SEND when a message is
posted (with its bytes), RECV_WAIT while a receiver sits idle, TRANSFER for the bytes on the
link. Waiting and transfer are kept apart: a profiler that calls the wait "communication"
hides the bubble.

On a simulated device each message carries its sender's timestamp in a small header, and
arrives alpha + bytes / beta later (the link of the device profile). Under the virtual clock the
receiver's clock jumps to the arrival time; under the wall clock the receiver sleeps until it.

Handles are kept until waited: a gloo send whose handle is garbage-collected crashes the
process ("Cannot lock pointer to unbound buffer"), so `Handle` also registers itself with the
device until `wait()`.

Introduced in chapter 04; chapter 05 is about these functions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .device import Device, current
from .trace import Kind

_HEADER_DTYPE = torch.float64


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _check_peer(peer: int, group, what: str) -> int:
    """Validate a peer rank within `group`; return its global rank."""
    size = dist.get_world_size(group)
    me = dist.get_rank(group)
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < size:
        raise ValueError(f"rank {dist.get_rank()}: {what} peer {peer!r} is outside the group "
                         f"(group ranks are 0..{size - 1})")
    if peer == me:
        raise ValueError(f"rank {dist.get_rank()}: {what} to itself (peer {peer} is this rank "
                         f"in the group); hand the tensor over locally instead")
    return dist.get_global_rank(group, peer) if group is not None else peer


class Handle:
    """A posted send or receive. Call `wait()` exactly once; it records the events."""

    def __init__(self, dev: Device, op: str, tensor, peer: int, works, header, t_post: float,
                 label: str, fields: dict):
        self.dev, self.op, self.tensor, self.peer = dev, op, tensor, peer
        self.works, self.header, self.t_post = works, header, t_post
        self.label, self.fields, self.done = label, fields, False
        _outstanding(dev).add(self)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def is_completed(self) -> bool:
        return self.done or all(w.is_completed() for w in self.works)

    def wait(self):
        if self.done:
            return self.tensor
        dev, clock = self.dev, self.dev.clock
        start = clock.now()
        verb = "send to" if self.op == "send" else "recv from"
        with dev.activity.doing(f"{self.label}: {verb} rank {self.peer} ({_fmt_bytes(self.nbytes)}), waiting"):
            for w in self.works:
                w.wait()
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
        self.done = True
        _outstanding(dev).discard(self)
        return self.tensor


def _outstanding(dev: Device) -> set:
    if not hasattr(dev, "_outstanding"):
        dev._outstanding = set()
    return dev._outstanding


def isend(tensor: torch.Tensor, dst: int, group=None, *, tag: int = 0, label: str = "send",
          stage: int | None = None, microbatch: int | None = None) -> Handle:
    """Post a send of `tensor` to group rank `dst`; returns at once. Sends numel*itemsize bytes."""
    dev = current()
    peer = _check_peer(dst, group, "send")
    t_post = dev.clock.now()
    works, header = [], None
    if dev.modelled:
        header = torch.tensor([t_post], dtype=_HEADER_DTYPE)
        works.append(dist.isend(header, peer, group=None if group is None else group, tag=tag))
    works.append(dist.isend(tensor.contiguous(), peer, group=group, tag=tag))
    fields = {"stage": stage, "microbatch": microbatch}
    h = Handle(dev, "send", tensor, peer, works, header, t_post, label, fields)
    dev.tracer.record(Kind.SEND, label, t_post, t_post, peer=peer, bytes=h.nbytes, **fields)
    return h


def irecv(tensor: torch.Tensor, src: int, group=None, *, tag: int = 0, label: str = "recv",
          stage: int | None = None, microbatch: int | None = None) -> Handle:
    """Post a receive into `tensor` (its shape and dtype must match the sender's) from `src`."""
    dev = current()
    peer = _check_peer(src, group, "recv")
    works, header = [], None
    if dev.modelled:
        header = torch.empty(1, dtype=_HEADER_DTYPE)
        works.append(dist.irecv(header, peer, group=group, tag=tag))
    works.append(dist.irecv(tensor, peer, group=group, tag=tag))
    return Handle(dev, "recv", tensor, peer, works, header, dev.clock.now(), label,
                  {"stage": stage, "microbatch": microbatch})


def send(tensor: torch.Tensor, dst: int, group=None, **kw) -> None:
    """Blocking send: returns once the message has left (modelled: once it has arrived)."""
    isend(tensor, dst, group, **kw).wait()


def recv(tensor: torch.Tensor, src: int, group=None, **kw) -> torch.Tensor:
    """Blocking receive into `tensor`; returns it."""
    return irecv(tensor, src, group, **kw).wait()


def wait_all(handles=None) -> None:
    """Wait for the given handles, or for every handle this rank still holds."""
    hs = list(_outstanding(current())) if handles is None else list(handles)
    for h in hs:
        h.wait()
