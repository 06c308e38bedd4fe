"""Collectives written from point-to-point messages (`pipelib.comm.p2p`), checked against gloo's.

    all_reduce(x, op="sum", group=g)       # in place, bandwidth-optimal ring
    y = all_gather(x, group=g)             # concatenated along dim 0

n is the size of `group` (the world when None); peers are *group* ranks; N is the tensor's
bytes. Chunked collectives split dim 0 with `torch.tensor_split` semantics (the first
``len % n`` chunks are one row longer), so any size works. Bytes sent per rank (exact; the
tests check them): see each docstring, and the table of bytes and alpha-beta times (Hockney
1994; Thakur, Rabenseifner & Gropp 2005) in `pipelib.comm.alphabeta` (`expected_bytes`,
`predicted_time`): trees take ceil(log2 n) steps, the rings n-1 or 2(n-1), and the ring
all-reduce sends about 2N per rank whatever n.

Every call first checks that all ranks agree on the collective, shape, dtype, op and root
(`pipelib.comm.agreement.check_same`: one small message latency), so a mismatch becomes one
`CollectiveMismatchError` on every rank naming each rank's value, instead of a hang or an
aborted engine (``check=False`` skips it; chapter 06 measures its cost; what a mismatch then
does: `pipelib.comm.agreement`). Every call is also recorded in the rank's flight recorder
(`pipelib.runtime.flight`): a rank that never calls it, or calls it on another group, is an
error within seconds naming that rank. Each step's receive and send go as one batch under
NCCL's rules (`pipelib.runtime.matching`). The rings run on `pipelib.comm.ring`: on a real
device each chunk travels as messages of at most SEGMENT_BYTES, DEPTH in flight, so the
reduction of one overlaps the transfer of the next; a simulated device sends whole chunks, the
messages the alpha-beta model counts. The bytes sent are the same either way.

Every call records one COLLECTIVE event (bytes = what this rank sent; its axis that of the
group, `Device.axis_of`; its label the collective's name, or ``"<name>: <label>"`` with
``label=``, as tensor parallelism names each layer's operator) and, inside it, the
point-to-point events, labelled ``"<name> <phase> step <s> chunk <c>"`` so a figure can replay
which chunk went where at each step (`pipelib.viz.comm`).

More all-reduces to choose from (recursive halving/doubling, hierarchical), the tree gather and
scatter, and the barrier: `pipelib.comm.algorithms`, built on `_Call` below.

Introduced in chapter 06.
"""
from __future__ import annotations

import functools
from types import MappingProxyType

import torch
import torch.distributed as dist

from pipelib.checks import check_int
from pipelib.comm import p2p as comms
from pipelib.comm.agreement import COLLECTIVE_TAG, check_same, unchecked_sizes
from pipelib.comm.alphabeta import OPS, tree_steps
from pipelib.comm.ring import num_segments, reduce_into, run_ring, segments
from pipelib.runtime.device import current
from pipelib.trace import Kind

_NO_FIELDS = MappingProxyType({"stage": None, "microbatch": None})


def _op_name(op) -> str:
    name = op if op in OPS else op.lower() if isinstance(op, str) else {  # op="sum": at once
        dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.AVG: "avg"}.get(op, repr(op))
    if name not in OPS:
        raise ValueError(f"rank {dist.get_rank()}: unknown op {op!r}; use one of {OPS}")
    return name


class _Call:
    """One collective call on this rank: group facts, the COLLECTIVE event, bytes sent."""

    def __init__(self, name, tensor, group, op="sum", root=0, check=True, reduce=False, segment_bytes=None,
                 label=None, size_rank=None):  # size_rank: (n, me) when the caller has them
        self.dev, self.name, self.group = current(), name, group
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"rank {dist.get_rank()}: {name} takes a torch.Tensor, got {type(tensor).__name__} "
                            f"{tensor!r:.60}; wrap it, e.g. torch.tensor(...)")
        self.label = name if label is None else f"{name}: {label}"  # the COLLECTIVE event's
        if segment_bytes is not None:
            check_int(segment_bytes, "segment_bytes", minimum=0, context=f"rank {dist.get_rank()}: {name}",
                      hint="bytes per ring message; 0 = one message per chunk, None = the device's default")
        self.segment_bytes = segment_bytes
        self.n, self.me = size_rank or (dist.get_world_size(group), dist.get_rank(group))
        if self.me < 0:
            raise ValueError(f"rank {dist.get_rank()}: {name} on a group this rank is not part of")
        self.op = _op_name(op)
        if not (isinstance(root, int) and 0 <= root < self.n):
            raise ValueError(f"rank {dist.get_rank()}: {name} root {root!r} is outside the group "
                             f"(group ranks are 0..{self.n - 1})")
        if reduce and self.op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ValueError(f"rank {dist.get_rank()}: {name} op 'avg' on {tensor.dtype}: an integer "
                             f"average is not exact; use op='sum' and divide, or a float tensor")
        self.flight = self.dev.activity.flight  # which collective this rank is in, readable while it waits
        self.depth, self.check, self.tensor = self.flight.depth, check, tensor
        if self.n > 1 and self.flight.map is not None:  # no file (outside a cluster): nothing to write
            self.flight.enter(name if check else f"{name} of {self.shape}, unchecked", group)
        if check:
            try:
                check_same(name, tensor, group, op=self.op, root=root)
            except BaseException:
                self.flight.unwind(self.depth)
                raise
        self.sent, self.t0, self.activity = 0, self.dev.clock.now(), self.dev.activity.text

    @functools.cached_property
    def shape(self) -> str | None:  # unchecked: this rank's shape, for the error a mismatch ends in
        return None if self.check else f"{tuple(self.tensor.shape)} {str(self.tensor.dtype)[6:]}"

    def peer(self, offset: int) -> int:
        return (self.me + offset) % self.n

    def glob(self, p: int) -> int:
        """Global rank of group rank p (peers are checked once per call, not per message)."""
        return p if self.group is None else dist.get_global_rank(self.group, p)

    def post(self, phase: str, step: int, chunk: int, send=None, dst=None, recv=None, src=None, glob=False):
        """Post a receive from `src`, then a send to `dst` (group ranks; global if `glob`)."""
        items = [] if recv is None else [("recv", recv, src if glob else self.glob(src), step, chunk)]
        return self.post_all(phase, items if send is None else
                             [*items, ("send", send, dst if glob else self.glob(dst), step, chunk)])

    def post_all(self, phase: str, items) -> list:
        """Post ``items = [(op, tensor, global peer, step, chunk)]`` (op "recv" or "send") in order,
        or under NCCL's rules (`pipelib.runtime.matching`) as one batch; their handles."""
        self.sent += sum(t.numel() * t.element_size() for op, t, *_ in items if op == "send")
        name, group = self.name, self.group
        if self.dev.matching.by_order:
            return comms.post_batch([(op, t, peer, f"{name} {phase} step {step} chunk {chunk}")
                                     for op, t, peer, step, chunk in items], group, COLLECTIVE_TAG, _NO_FIELDS, False)
        # unchecked on a simulated device: its headers (the send time) still check sizes when waited
        matched, post = self.dev.modelled and not self.check, {"recv": comms.post_recv, "send": comms.post_send}
        return [post[op](t, peer, group, COLLECTIVE_TAG, f"{name} {phase} step {step} chunk {chunk}", _NO_FIELDS,
                         matched and op == "recv") for op, t, peer, step, chunk in items]

    def step(self, *args, **kw) -> None:
        with unchecked_sizes(self.name, self.shape):
            comms.wait_all(self.post(*args, **kw))

    def ring(self, steps, S: int) -> None:
        """`pipelib.comm.ring.run_ring` for this call."""
        with unchecked_sizes(self.name, self.shape):
            run_ring(self, steps, S)

    def done(self, result):
        self.dev.activity.set(self.activity)
        self.flight.unwind(self.depth)
        self.dev.tracer.record(Kind.COLLECTIVE, self.label, self.t0, self.dev.clock.now(), bytes=self.sent,
                               axis=self.dev.axis_of(self.group))
        return result


def _row_chunks(t, n):  # the n chunks of dim 0, views, the first len % n one row longer (`chunk_sizes`)
    return list(torch.tensor_split(t, n, dim=0))


# ------------------------------------------------------------------ trees
def broadcast(tensor, src: int = 0, group=None, *, check: bool = True, label: str | None = None):
    """Binomial tree: at step k, every rank that has the data (relative rank v < 2^k) sends it
    to v + 2^k. ceil(log2 n) steps; rank v sends N bytes to each of its children
    #{k : v < 2^k, v + 2^k < n}; the root sends N ceil(log2 n). In place; returns `tensor`."""
    c = _Call("broadcast", tensor, group, root=src, check=check, label=label)
    v = (c.me - src) % c.n
    for k in range(tree_steps(c.n)):
        mask = 1 << k
        if v < mask and v + mask < c.n:
            c.step("broadcast", k, src, send=tensor, dst=(c.me + mask) % c.n)
        elif mask <= v < 2 * mask:
            c.step("broadcast", k, src, recv=tensor, src=(c.me - mask) % c.n)
    return c.done(tensor)


def reduce(tensor, dst: int = 0, op="sum", group=None, *, check: bool = True, label: str | None = None):
    """Binomial tree towards `dst`: at step k, a rank whose relative rank has bit k set sends its
    partial result to v - 2^k and stops; the others add what v + 2^k sends. Every rank but the
    root sends N bytes once; ceil(log2 n) steps. Only `dst`'s tensor holds the result (the
    others are left untouched); returns `tensor`."""
    c = _Call("reduce", tensor, group, op, root=dst, check=check, reduce=True, label=label)
    v = (c.me - dst) % c.n
    acc = tensor if v == 0 else tensor.clone()
    buf = torch.empty_like(acc)
    for k in range(tree_steps(c.n)):
        mask = 1 << k
        if v & mask:
            c.step("reduce", k, c.me, send=acc, dst=(c.me - mask) % c.n)
            break
        if v + mask < c.n:
            c.step("reduce", k, (c.me + mask) % c.n, recv=buf, src=(c.me + mask) % c.n)
            reduce_into(c.op, acc, buf, acc)
    if v == 0 and c.op == "avg":
        acc.div_(c.n)
    return c.done(tensor)


# ------------------------------------------------------------------ rings
def all_reduce_naive(tensor, op="sum", group=None, *, check: bool = True, label: str | None = None):
    """Whole tensor around the ring: at step s each rank forwards to its right neighbour the
    tensor it received at step s-1 (its own at step 0), i.e. rank (r - s)'s input, and adds
    what comes from its left. n-1 steps, (n-1) N bytes per rank. Simple, latency-bound: the
    right choice for small tensors, the wrong one for gradients. In place; returns `tensor`."""
    c = _Call("all_reduce_naive", tensor, group, op, check=check, reduce=True, label=label)
    if c.n == 1:
        return c.done(tensor)
    fwd, buf = tensor.clone(), torch.empty_like(tensor)
    for s in range(c.n - 1):
        c.step("forward", s, (c.me - s) % c.n, send=fwd, dst=c.peer(1), recv=buf, src=c.peer(-1))
        reduce_into(c.op, tensor, buf, tensor)
        fwd, buf = buf, fwd
    if c.op == "avg":
        tensor.div_(c.n)
    return c.done(tensor)


def all_reduce(tensor, op="sum", group=None, *, check: bool = True, segment_bytes: int | None = None,
               label: str | None = None):
    """Bandwidth-optimal ring (Patarasuk & Yuan 2009; Baidu 2017): reduce-scatter, then
    all-gather, over the n chunks of the flattened tensor. Reduce-scatter step s: rank r sends
    chunk r-s-1 to r+1 (its own at s=0, later the partial sum it just made) and adds chunk
    r-s-2 from r-1; after n-1 steps it holds chunk r fully reduced. All-gather step s: it sends
    chunk r-s and receives chunk r-s-1 in place. 2(n-1) steps; rank r sends
    2N - |chunk r| - |chunk r+1| bytes, that is 2(n-1)/n N when n divides the size: every rank
    sends about 2N whatever n. On a real device each chunk travels as messages of at most
    `segment_bytes` (default SEGMENT_BYTES), pipelined; the bytes are the same. In place;
    returns `tensor`."""
    c = _Call("all_reduce", tensor, group, op, check=check, reduce=True, segment_bytes=segment_bytes, label=label)
    if c.n == 1:
        return c.done(tensor)
    n, me = c.n, c.me
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    cs = _row_chunks(flat, n)
    S = num_segments(c, cs[0].numel() * flat.element_size())
    seg = segments(cs, S)
    steps = [("reduce-scatter", s, (me - s - 1) % n, seg[(me - s - 1) % n], None,
              list(zip(seg[(me - s - 2) % n], seg[(me - s - 2) % n])), c.op == "avg" and s == n - 2)
             for s in range(n - 1)]
    steps += [("all-gather", n - 1 + s, (me - s) % n, seg[(me - s) % n], seg[(me - s - 1) % n], None, False)
              for s in range(n - 1)]
    c.ring(steps, S)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return c.done(tensor)


def reduce_scatter(tensor, op="sum", group=None, *, check: bool = True, segment_bytes: int | None = None,
                   label: str | None = None):
    """Ring reduce-scatter: returns chunk r (`torch.tensor_split(tensor, n)[r]`, dim 0) of the
    reduction, on rank r. Step s: rank r sends chunk r-s-1 to r+1 (its own input at s=0, then
    the partial sum it made at step s-1) and reduces chunk r-s-2 from r-1 into a partial sum
    (two scratch chunks, used in turn). n-1 steps; rank r sends N - |chunk r| bytes
    ((n-1)/n N when n divides dim 0). `tensor` is left untouched."""
    c = _Call("reduce_scatter", tensor, group, op, check=check, reduce=True, segment_bytes=segment_bytes, label=label)
    cs = _row_chunks(tensor.contiguous(), c.n)
    if c.n == 1:
        return c.done(tensor.clone())
    n, me = c.n, c.me
    out = torch.empty_like(cs[me])
    flat = [x.reshape(-1) for x in cs]  # chunks of a contiguous tensor along dim 0: views
    S = num_segments(c, flat[0].numel() * tensor.element_size())
    partial = [torch.empty_like(flat[0]) for _ in range(min(2, n - 2))]
    seg_in = segments(flat, S)
    # target of step s: `out` at the last step, else partial[s % 2] cut like chunk r-s-2
    tgt = [segments([out.view(-1) if s == n - 2 else partial[s % 2][: flat[(me - s - 2) % n].numel()]], S)[0]
           for s in range(n - 1)]
    steps = [("reduce-scatter", s, (me - s - 1) % n, seg_in[(me - 1) % n] if s == 0 else tgt[s - 1], None,
              list(zip(seg_in[(me - s - 2) % n], tgt[s])), c.op == "avg" and s == n - 2)
             for s in range(n - 1)]
    c.ring(steps, S)
    return c.done(out)


def all_gather(tensor, group=None, *, check: bool = True, segment_bytes: int | None = None,
               label: str | None = None):
    """Ring all-gather: every rank's `tensor` concatenated along dim 0, in rank order (like
    `dist.all_gather_into_tensor`). Step s: rank r sends block r-s to r+1 and receives block
    r-s-1 from r-1 straight into its place. n-1 steps; every rank sends (n-1) N bytes, N its
    input."""
    c = _Call("all_gather", tensor, group, check=check, segment_bytes=segment_bytes, label=label)
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    out = torch.empty((c.n * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    cs = list(out.chunk(c.n, dim=0)) if t.shape[0] else [out[:0]] * c.n
    cs[c.me].copy_(t)
    if c.n > 1:
        n, me = c.n, c.me
        S = num_segments(c, t.numel() * t.element_size())
        seg = segments([x.reshape(-1) for x in cs], S)
        c.ring([("all-gather", s, (me - s) % n, seg[(me - s) % n], seg[(me - s - 1) % n], None, False)
                      for s in range(n - 1)], S)
    return c.done(out)


def all_to_all(tensor, group=None, *, check: bool = True, label: str | None = None):
    """Pairwise exchange: chunk j of rank r (`tensor_split(tensor, n)[j]`, dim 0) goes to rank j,
    which stores it at position r. Step s = 1..n-1: send chunk r+s to rank r+s, receive from
    rank r-s. Rank r sends N - |chunk r| bytes ((n-1)/n N when n divides dim 0)."""
    c = _Call("all_to_all", tensor, group, check=check, label=label)
    ins = _row_chunks(tensor.contiguous(), c.n)
    mine = ins[c.me]
    out = torch.empty((c.n * mine.shape[0], *mine.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    outs = list(out.chunk(c.n, dim=0)) if mine.shape[0] else [out[:0]] * c.n
    outs[c.me].copy_(mine)
    for s in range(1, c.n):
        dst, src = c.peer(s), c.peer(-s)
        c.step("all-to-all", s - 1, dst, send=ins[dst], dst=dst, recv=outs[src], src=src)
    return c.done(out)
