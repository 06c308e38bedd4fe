"""Collectives written from point-to-point messages (`pipelib.comms`), checked against gloo's.

    all_reduce(x, op="sum", group=g)       # in place, bandwidth-optimal ring
    y = all_gather(x, group=g)             # concatenated along dim 0

n is the size of `group` (the world when None); peers are *group* ranks; N is the tensor's
bytes. Chunked collectives split dim 0 with `torch.tensor_split` semantics (the first
``len % n`` chunks are one row longer), so any size works. Bytes sent per rank (exact; the
tests check them): see each docstring and `expected_bytes`. Time in the alpha-beta model
(Hockney 1994; Thakur, Rabenseifner & Gropp 2005), without the reduction's compute:

=====================  =============================  ==========================================
collective             bytes sent by one rank         time (divisible sizes)
=====================  =============================  ==========================================
broadcast (tree)       N x children in the tree       ceil(log2 n) (alpha + N/beta)
reduce (tree)          N (0 on the root)              ceil(log2 n) (alpha + N/beta)
all_reduce_naive       (n-1) N                        (n-1) (alpha + N/beta)
all_reduce (ring)      2 (n-1)/n N                    2(n-1) alpha + 2(n-1)/n N/beta
reduce_scatter (ring)  (n-1)/n N                      (n-1) alpha + (n-1)/n N/beta
all_gather (ring)      (n-1) N   (N = one input)      (n-1) (alpha + N/beta)
all_to_all (pairwise)  (n-1)/n N                      (n-1) alpha + (n-1)/n N/beta
=====================  =============================  ==========================================

Every call first all-gathers a 12-integer header (dtype, numel, shape, op, root) with gloo's
own collective, so a mismatch across ranks becomes one `CollectiveMismatchError` on every rank
naming each rank's value, instead of a hang or an aborted engine (``check=False`` skips it;
chapter 06 measures its cost). The check does not advance a simulated clock.

Every call records one COLLECTIVE event (bytes = what this rank sent) and, inside it, the
point-to-point events, labelled ``"<name> <phase> step <s> chunk <c>"`` so a figure can replay
which chunk went where at each step (`pipelib.viz_comms`).

Introduced in chapter 06.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import comms
from .device import current
from .trace import Kind

OPS = ("sum", "avg", "max", "min")
_TAG = 9000  # collectives' messages never match a user's point-to-point ones
_META = 12


class CollectiveMismatchError(ValueError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


# ------------------------------------------------------------------ checks and bookkeeping
def _op_name(op) -> str:
    name = op.lower() if isinstance(op, str) else {
        dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.AVG: "avg"}.get(op, repr(op))
    if name not in OPS:
        raise ValueError(f"rank {dist.get_rank()}: unknown op {op!r}; use one of {OPS}")
    return name


def _meta(tensor, op: str, root: int) -> torch.Tensor:
    shape = list(tensor.shape)[:7]
    m = [comms.DTYPE_CODE.get(tensor.dtype, -1), tensor.numel(), tensor.dim(), *shape]
    m += [-1] * (_META - 2 - len(m)) + [OPS.index(op) if op in OPS else -1, root]
    return torch.tensor(m, dtype=torch.int64)


def _describe(row) -> str:
    r = [int(v) for v in row]
    shape = tuple(r[3:3 + min(r[2], 7)])
    return f"{shape} {comms._dtype_name(r[0])}"


def check_same(name: str, tensor, group=None, *, op: str = "sum", root: int = 0) -> None:
    """Raise `CollectiveMismatchError` on every rank if ranks disagree on shape, dtype, op or
    root. One gloo all-gather of 12 integers per rank."""
    n = dist.get_world_size(group)
    out = torch.empty(n * _META, dtype=torch.int64)
    dist.all_gather_into_tensor(out, _meta(tensor, op, root), group=group)
    rows = out.view(n, _META)
    if bool((rows == rows[0]).all()):
        return
    glob = [dist.get_global_rank(group, i) if group is not None else i for i in range(n)]
    parts = []
    for field, cols, fmt in (("shape/dtype", slice(0, _META - 2), _describe),
                             ("op", slice(_META - 2, _META - 1), lambda r: OPS[int(r[-2])]),
                             ("root", slice(_META - 1, _META), lambda r: str(int(r[-1])))):
        if not bool((rows[:, cols] == rows[0, cols]).all()):
            parts.append(f"{field} differs: " + ", ".join(f"rank {g} {fmt(rows[i])}" for i, g in enumerate(glob)))
    raise CollectiveMismatchError(f"{name}: ranks disagree; " + "; ".join(parts)
                                  + ". Every rank of the group must pass the same shape, dtype, op and root.")


class _Call:
    """One collective call on this rank: group facts, the COLLECTIVE event, bytes sent."""

    def __init__(self, name, tensor, group, op="sum", root=0, check=True, reduce=False):
        self.dev, self.name, self.group = current(), name, group
        self.n, self.me = dist.get_world_size(group), dist.get_rank(group)
        if self.me < 0:
            raise ValueError(f"rank {dist.get_rank()}: {name} on a group this rank is not part of")
        self.op = _op_name(op)
        if not (isinstance(root, int) and 0 <= root < self.n):
            raise ValueError(f"rank {dist.get_rank()}: {name} root {root!r} is outside the group "
                             f"(group ranks are 0..{self.n - 1})")
        if reduce and self.op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ValueError(f"rank {dist.get_rank()}: {name} op 'avg' on {tensor.dtype}: an integer "
                             f"average is not exact; use op='sum' and divide, or a float tensor")
        if check:
            check_same(name, tensor, group, op=self.op, root=root)
        self.sent, self.t0 = 0, self.dev.clock.now()

    def peer(self, offset: int) -> int:
        return (self.me + offset) % self.n

    def post(self, phase: str, step: int, chunk: int, send=None, dst=None, recv=None, src=None):
        label = f"{self.name} {phase} step {step} chunk {chunk}"
        hs = []
        if recv is not None:
            hs.append(comms.irecv(recv, src, self.group, tag=_TAG, label=label, check=False))
        if send is not None:
            hs.append(comms.isend(send, dst, self.group, tag=_TAG, label=label, check=False))
            self.sent += send.numel() * send.element_size()
        return hs

    def step(self, *args, **kw) -> None:
        comms.wait_all(self.post(*args, **kw))

    def done(self, result):
        self.dev.tracer.record(Kind.COLLECTIVE, self.name, self.t0, self.dev.clock.now(), bytes=self.sent)
        return result


def _reduce_into(op: str, a, b, out) -> None:
    if op in ("sum", "avg"):
        torch.add(a, b, out=out)
    elif op == "max":
        torch.maximum(a, b, out=out)
    else:
        torch.minimum(a, b, out=out)


def _chunks(t, n):
    return list(torch.tensor_split(t, n, dim=0))


def _tree_steps(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


# ------------------------------------------------------------------ trees
def broadcast(tensor, src: int = 0, group=None, *, check: bool = True):
    """Binomial tree: at step k, every rank that has the data (relative rank v < 2^k) sends it
    to v + 2^k. ceil(log2 n) steps; rank v sends N bytes to each of its children
    #{k : v < 2^k, v + 2^k < n}; the root sends N ceil(log2 n). In place; returns `tensor`."""
    c = _Call("broadcast", tensor, group, root=src, check=check)
    v = (c.me - src) % c.n
    for k in range(_tree_steps(c.n)):
        mask = 1 << k
        if v < mask and v + mask < c.n:
            c.step("broadcast", k, src, send=tensor, dst=(c.me + mask) % c.n)
        elif mask <= v < 2 * mask:
            c.step("broadcast", k, src, recv=tensor, src=(c.me - mask) % c.n)
    return c.done(tensor)


def reduce(tensor, dst: int = 0, op="sum", group=None, *, check: bool = True):
    """Binomial tree towards `dst`: at step k, a rank whose relative rank has bit k set sends its
    partial result to v - 2^k and stops; the others add what v + 2^k sends. Every rank but the
    root sends N bytes once; ceil(log2 n) steps. Only `dst`'s tensor holds the result (the
    others are left untouched); returns `tensor`."""
    c = _Call("reduce", tensor, group, op, root=dst, check=check, reduce=True)
    v = (c.me - dst) % c.n
    acc = tensor if v == 0 else tensor.clone()
    buf = torch.empty_like(acc)
    for k in range(_tree_steps(c.n)):
        mask = 1 << k
        if v & mask:
            c.step("reduce", k, c.me, send=acc, dst=(c.me - mask) % c.n)
            break
        if v + mask < c.n:
            c.step("reduce", k, (c.me + mask) % c.n, recv=buf, src=(c.me + mask) % c.n)
            _reduce_into(c.op, acc, buf, acc)
    if v == 0 and c.op == "avg":
        acc.div_(c.n)
    return c.done(tensor)


# ------------------------------------------------------------------ rings
def all_reduce_naive(tensor, op="sum", group=None, *, check: bool = True):
    """Whole tensor around the ring: at step s each rank forwards to its right neighbour the
    tensor it received at step s-1 (its own at step 0), i.e. rank (r - s)'s input, and adds
    what comes from its left. n-1 steps, (n-1) N bytes per rank. Simple, latency-bound: the
    right choice for small tensors, the wrong one for gradients. In place; returns `tensor`."""
    c = _Call("all_reduce_naive", tensor, group, op, check=check, reduce=True)
    if c.n == 1:
        return c.done(tensor)
    fwd, buf = tensor.clone(), torch.empty_like(tensor)
    for s in range(c.n - 1):
        c.step("forward", s, (c.me - s) % c.n, send=fwd, dst=c.peer(1), recv=buf, src=c.peer(-1))
        _reduce_into(c.op, tensor, buf, tensor)
        fwd, buf = buf, fwd
    if c.op == "avg":
        tensor.div_(c.n)
    return c.done(tensor)


def _ring_reduce_scatter(c, cs, out, step0=0):
    """Step s: rank r sends chunk (r-s-1) to r+1 (at s=0 its own, later the partial sum it just
    made) and reduces chunk (r-s-2) from r-1. After n-1 steps rank r holds chunk r reduced, in
    `out` (or in place in cs[r] when out is None). Sends every chunk but its own."""
    n, me = c.n, c.me
    rows = max(x.shape[0] for x in cs)
    rbuf = torch.empty((rows, *cs[0].shape[1:]), dtype=cs[0].dtype)
    sbuf = None if out is None else torch.empty_like(rbuf)
    send = cs[(me - 1) % n]
    for s in range(n - 1):
        ri = (me - s - 2) % n
        recv = rbuf[: cs[ri].shape[0]]
        c.step("reduce-scatter", step0 + s, (me - s - 1) % n, send=send, dst=c.peer(1), recv=recv, src=c.peer(-1))
        if out is None:
            target = cs[ri]
        else:
            target = out if s == n - 2 else sbuf[: cs[ri].shape[0]]
        _reduce_into(c.op, cs[ri], recv, target)
        send = target
    return cs[me] if out is None else out


def _ring_all_gather(c, cs, step0=0):
    """Step s: rank r sends chunk (r-s) to r+1 and receives chunk (r-s-1) from r-1, straight
    into its place. n-1 steps; sends every chunk but chunk r+1."""
    n, me = c.n, c.me
    for s in range(n - 1):
        si, ri = (me - s) % n, (me - s - 1) % n
        c.step("all-gather", step0 + s, si, send=cs[si], dst=c.peer(1), recv=cs[ri], src=c.peer(-1))


def all_reduce(tensor, op="sum", group=None, *, check: bool = True):
    """Bandwidth-optimal ring (Patarasuk & Yuan 2009; Baidu 2017): reduce-scatter, then
    all-gather, over the n chunks of the flattened tensor. 2(n-1) steps; rank r sends
    2N - |chunk r| - |chunk r+1| bytes, that is 2(n-1)/n N when n divides the size: every rank
    sends about 2N whatever n. In place; returns `tensor`."""
    c = _Call("all_reduce", tensor, group, op, check=check, reduce=True)
    if c.n == 1:
        return c.done(tensor)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    cs = _chunks(flat, c.n)
    mine = _ring_reduce_scatter(c, cs, None)
    if c.op == "avg":
        mine.div_(c.n)
    _ring_all_gather(c, cs, step0=c.n - 1)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return c.done(tensor)


def reduce_scatter(tensor, op="sum", group=None, *, check: bool = True):
    """Ring reduce-scatter: returns chunk r (`torch.tensor_split(tensor, n)[r]`, dim 0) of the
    reduction, on rank r. n-1 steps; rank r sends N - |chunk r| bytes ((n-1)/n N when n
    divides dim 0). `tensor` is left untouched."""
    c = _Call("reduce_scatter", tensor, group, op, check=check, reduce=True)
    cs = _chunks(tensor.contiguous(), c.n)
    if c.n == 1:
        return c.done(tensor.clone())
    out = torch.empty_like(cs[c.me])
    _ring_reduce_scatter(c, cs, out)
    if c.op == "avg":
        out.div_(c.n)
    return c.done(out)


def all_gather(tensor, group=None, *, check: bool = True):
    """Ring all-gather: every rank's `tensor` concatenated along dim 0, in rank order (like
    `dist.all_gather_into_tensor`). n-1 steps; every rank sends (n-1) N bytes, N its input."""
    c = _Call("all_gather", tensor, group, check=check)
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    out = torch.empty((c.n * t.shape[0], *t.shape[1:]), dtype=t.dtype)
    cs = list(out.chunk(c.n, dim=0)) if t.shape[0] else [out[:0]] * c.n
    cs[c.me].copy_(t)
    _ring_all_gather(c, cs)
    return c.done(out)


def all_to_all(tensor, group=None, *, check: bool = True):
    """Pairwise exchange: chunk j of rank r (`tensor_split(tensor, n)[j]`, dim 0) goes to rank j,
    which stores it at position r. Step s = 1..n-1: send chunk r+s to rank r+s, receive from
    rank r-s. Rank r sends N - |chunk r| bytes ((n-1)/n N when n divides dim 0)."""
    c = _Call("all_to_all", tensor, group, check=check)
    ins = _chunks(tensor.contiguous(), c.n)
    mine = ins[c.me]
    out = torch.empty((c.n * mine.shape[0], *mine.shape[1:]), dtype=tensor.dtype)
    outs = list(out.chunk(c.n, dim=0)) if mine.shape[0] else [out[:0]] * c.n
    outs[c.me].copy_(mine)
    for s in range(1, c.n):
        dst, src = c.peer(s), c.peer(-s)
        c.step("all-to-all", s - 1, dst, send=ins[dst], dst=dst, recv=outs[src], src=src)
    return c.done(out)


# ------------------------------------------------------------------ exact byte counts
def chunk_sizes(length: int, n: int) -> list[int]:
    """Rows per chunk under torch.tensor_split: the first length % n chunks get one more."""
    q, r = divmod(length, n)
    return [q + 1 if i < r else q for i in range(n)]


def expected_bytes(name: str, shape, itemsize: int, n: int, rank: int, root: int = 0) -> int:
    """Bytes group rank `rank` sends in collective `name` (the formulas above, exactly)."""
    shape = tuple(shape) or (1,)
    numel = math.prod(shape)
    N = numel * itemsize
    if n == 1:
        return 0
    if name == "broadcast":
        v = (rank - root) % n
        return N * sum(1 for k in range(_tree_steps(n)) if v < (1 << k) and v + (1 << k) < n)
    if name == "reduce":
        return 0 if rank == root else N
    if name == "all_reduce_naive":
        return (n - 1) * N
    if name == "all_gather":
        return (n - 1) * N
    if name == "all_reduce":
        sz = chunk_sizes(numel, n)
        return (2 * numel - sz[rank] - sz[(rank + 1) % n]) * itemsize
    row = numel // shape[0] * itemsize if shape[0] else 0
    sz = chunk_sizes(shape[0], n)
    if name in ("reduce_scatter", "all_to_all"):
        return (shape[0] - sz[rank]) * row
    raise ValueError(f"unknown collective {name!r}")


def predicted_time(name: str, nbytes: int, n: int, alpha: float, beta: float) -> float:
    """Alpha-beta time of collective `name` on n ranks for an N-byte tensor (divisible sizes;
    all_gather: N is one rank's input). Ignores the reduction's compute."""
    if n == 1:
        return 0.0
    steps = _tree_steps(n)
    return {
        "broadcast": steps * (alpha + nbytes / beta),
        "reduce": steps * (alpha + nbytes / beta),
        "all_reduce_naive": (n - 1) * (alpha + nbytes / beta),
        "all_reduce": 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / beta,
        "reduce_scatter": (n - 1) * alpha + (n - 1) / n * nbytes / beta,
        "all_gather": (n - 1) * (alpha + nbytes / beta),
        "all_to_all": (n - 1) * alpha + (n - 1) / n * nbytes / beta,
    }[name]
