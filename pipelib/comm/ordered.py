"""Point-to-point messages under NCCL's rules: matched by order, exchanges batched.

`pipelib.comm.p2p` posts through here when the device follows NCCL's matching rules
(`pipelib.runtime.matching`: always on cuda; on gloo when asked, so a laptop meets the hangs a
GPU would). Three differences from the tag-matched path:

- no tags: a send and a receive between two ranks are matched in the order each rank posts
  them, so every receiver must post its receives from a peer in the order that peer sends;
- a message's header, when one travels (a simulated device's send time), is posted together with
  its payload, both at once: a receive cannot read a header before its payload is posted, since
  the next message from that peer would take the payload's place. A real device sends no header
  (the collectives' agreement check and the pipeline's shape handshake fixed every buffer); a
  simulated one checks the header once the message is in and raises `MessageMismatchError`;
- `post_ordered(..., batched=True)` posts its messages as one torch `batch_isend_irecv` (one NCCL
  group call: its sends and receives progress together). An unbatched send to a peer while a
  receive from that peer is still outstanding is refused with `MatchingRuleError`: on NCCL the
  send would wait behind the receive on their shared stream, and a peer doing the same would
  wait for ever.

Introduced with issue 26 (CUDA and NCCL).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.comm.message import DTYPE_CODE, HEADER_DTYPE, HEADER_LEN, Handle
from pipelib.runtime.matching import MatchingRuleError
from pipelib.trace import Kind

EXCHANGE = "exchange"  # `Handle.batch` of a receive whose batch also sends to its peer


def refuse_send_after_recv(dev, peer: int, group, label: str) -> None:
    """Raise `MatchingRuleError` if a receive from `peer` on `group`, posted earlier in a batch
    (or alone) that sends nothing to `peer`, is still outstanding: the receive-before-send pair
    NCCL hangs on. A receive whose batch also sends to its peer (an exchange, a ring step) holds
    nothing back: the peer's matching batch completes it."""
    for h in dev.outstanding.values():
        if h.op == "recv" and h.peer == peer and h.group is group and h.batch is not EXCHANGE:
            raise MatchingRuleError(
                f"rank {dev.rank}: {label}: a send to rank {peer} posted while the receive {h.label!r} from "
                f"rank {peer} is not waited yet. Under NCCL's rules ({dev.matching.text}) the send waits "
                f"behind that receive, so if rank {peer} does the same the two ranks wait for each other "
                f"forever. Post the receive and the send as one batch (pipelib.comm.p2p.batch_isend_irecv "
                f"or sendrecv), or wait the receive before sending.")


def post_ordered(dev, items, group, *, batched: bool) -> list[Handle]:
    """Post `items`, each ``(op, tensor, peer, label, fields)`` with `peer` a global rank and op
    "send" or "recv", in order; one batch if `batched`. Returns their handles, in order."""
    batch = object()  # this post's own mark
    exchanges = {it[2] for it in items if it[0] == "send"} if batched else set()
    ops, made = [], []  # (isend or irecv, tensor, peer) in posting order; what each handle needs
    for op, tensor, peer, label, fields in items:
        header = None
        if op == "send":
            refuse_send_after_recv(dev, peer, group, label)
            t_post = dev.clock.now()
            buf = tensor.detach().contiguous()
            if dev.modelled:  # the send time, which the receiver's virtual clock needs
                header = torch.tensor([t_post, buf.numel(), DTYPE_CODE.get(buf.dtype, -1)], dtype=HEADER_DTYPE,
                                      device="cpu")  # simulated devices: the CPU
                ops.append((dist.isend, header, peer))
            ops.append((dist.isend, buf, peer))
        else:
            t_post = dev.clock.now()
            buf = tensor if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=torch.contiguous_format)
            if dev.modelled:
                header = torch.empty(HEADER_LEN, dtype=HEADER_DTYPE, device="cpu")
                ops.append((dist.irecv, header, peer))
            ops.append((dist.irecv, buf, peer))
        made.append((op, tensor, buf, peer, header, t_post, label, fields))
    if batched and ops:
        works = dist.batch_isend_irecv([dist.P2POp(fn, t, p, group) for fn, t, p in ops])
    else:
        works = [fn(t, p, group=group) for fn, t, p in ops]
    shared = len(works) != len(ops)  # NCCL coalesces a batch into one work: every handle waits it
    handles, i = [], 0
    for op, tensor, buf, peer, header, t_post, label, fields in made:
        k = 2 if header is not None else 1
        mine = list(works) if shared else works[i:i + k]
        i += k
        header_work = mine[0] if header is not None and op == "recv" and not shared else None
        payload = mine if shared else mine[-1:] if op == "recv" else mine
        h = Handle(dev, op, tensor, buf, peer, group, 0, payload, header, header_work, t_post, label, fields)
        h.batch = EXCHANGE if op == "recv" and peer in exchanges else batch
        if op == "send":
            c = dev.counters()
            c["bytes_sent"] += h.nbytes
            c["messages_sent"] += 1
            dev.tracer.record(Kind.SEND, label, t_post, t_post, peer=peer, bytes=h.nbytes, **fields)
        handles.append(h)
    return handles
