"""Collectives written from point-to-point messages (`pipelib.comm.p2p`), checked against gloo's.

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

Every call first checks that all ranks agree (`check_same`: each rank sends a 13-integer
header with the collective, dtype, numel, shape, op and root to every other rank, one message
latency), so a mismatch becomes one `CollectiveMismatchError` on every rank naming each rank's
value, instead of a hang or an aborted engine (``check=False`` skips it; chapter 06 measures
its cost). The check does not advance a simulated clock.

On a real device the ring collectives cut each chunk into messages of at most SEGMENT_BYTES and
keep DEPTH of them in flight, so the reduction of one overlaps the transfer of the next
(``segment_bytes=`` changes it, 0 = whole chunks); a simulated device sends whole chunks, the
messages the alpha-beta model counts. The bytes sent are the same either way.

Every call records one COLLECTIVE event (bytes = what this rank sent) and, inside it, the
point-to-point events, labelled ``"<name> <phase> step <s> chunk <c>"`` so a figure can replay
which chunk went where at each step (`pipelib.viz.comm`).

Introduced in chapter 06.
"""
from __future__ import annotations

import math
import zlib

import torch
import torch.distributed as dist

from pipelib.comm import p2p as comms
from pipelib.runtime.device import current
from pipelib.trace import Kind

OPS = ("sum", "avg", "max", "min")
_TAG = 9000  # collectives' messages never match a user's point-to-point ones
_META = 13  # dtype, numel, dim, shape (7), collective, op, root
_CHECK_TAG = 2 * _TAG + 2  # check_same's headers: apart from the collectives' own messages
NAMES = ("broadcast", "reduce", "all_reduce_naive", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")
_NO_FIELDS = {"stage": None, "microbatch": None}
SEGMENT_BYTES = 8 << 20  # real devices: ring messages of at most 8 MiB (see _num_segments)
DEPTH = 2                # ring messages in flight per direction while the previous one is reduced


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


def _meta(name: str, tensor, op: str, root: int) -> torch.Tensor:
    shape = list(tensor.shape)[:7]
    m = [comms.DTYPE_CODE.get(tensor.dtype, -1), tensor.numel(), tensor.dim(), *shape]
    m += [-1] * (_META - 3 - len(m)) + [_name_code(name), OPS.index(op) if op in OPS else -1, root]
    return torch.tensor(m, dtype=torch.int64)


def _name_code(name: str) -> int:
    return NAMES.index(name) if name in NAMES else zlib.crc32(name.encode()) + len(NAMES)


def _describe(row) -> str:
    r = [int(v) for v in row]
    shape = tuple(r[3:3 + min(r[2], 7)])
    return f"{shape} {comms._dtype_name(r[0])}"


def check_same(name: str, tensor, group=None, *, op: str = "sum", root: int = 0) -> None:
    """Raise `CollectiveMismatchError` on every rank if ranks disagree on the collective, shape,
    dtype, op or root. Every rank sends a header of 13 integers to every other rank, all at
    once: one message latency whatever n (a gloo all-gather would take n-1 in a ring, plus a
    hand-over to gloo's worker thread), so the check costs about one small message (chapter 06
    measures it). Raw gloo messages on their own tag: no trace events, no clock advance."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    glob = [dist.get_global_rank(group, i) if group is not None else i for i in range(n)]
    rows = torch.empty((n, _META), dtype=torch.int64)
    rows[me] = mine = _meta(name, tensor, op, root)
    works = [dist.irecv(rows[p], glob[p], group=group, tag=_CHECK_TAG) for p in range(n) if p != me]
    works += [dist.isend(mine, glob[p], group=group, tag=_CHECK_TAG) for p in range(n) if p != me]
    for w in works:
        w.wait()
    if bool((rows == mine).all()):
        return
    parts = []
    for field, cols, fmt in (
            ("collective", slice(_META - 3, _META - 2), lambda r: _code_name(int(r[-3]))),
            ("shape/dtype", slice(0, _META - 3), _describe),
            ("op", slice(_META - 2, _META - 1), lambda r: OPS[int(r[-2])] if 0 <= r[-2] < len(OPS) else "?"),
            ("root", slice(_META - 1, _META), lambda r: str(int(r[-1])))):
        if not bool((rows[:, cols] == rows[0, cols]).all()):
            parts.append(f"{field} differs: " + ", ".join(f"rank {g} {fmt(rows[i])}" for i, g in enumerate(glob)))
    raise CollectiveMismatchError(f"{name}: ranks disagree; " + "; ".join(parts) + ". Every rank of the "
                                  "group must call the same collective with the same shape, dtype, op and root.")


def _code_name(code: int) -> str:
    return NAMES[code] if 0 <= code < len(NAMES) else f"collective #{code}"


class _Call:
    """One collective call on this rank: group facts, the COLLECTIVE event, bytes sent."""

    def __init__(self, name, tensor, group, op="sum", root=0, check=True, reduce=False, segment_bytes=None):
        self.dev, self.name, self.group = current(), name, group
        if segment_bytes is not None and (isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int)
                                          or segment_bytes < 0):
            raise ValueError(f"rank {dist.get_rank()}: {name} segment_bytes must be an int >= 0 "
                             f"(0 = one message per chunk) or None, got {segment_bytes!r}")
        self.segment_bytes = segment_bytes
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
        self.sent, self.t0, self.activity = 0, self.dev.clock.now(), self.dev.activity.text

    def peer(self, offset: int) -> int:
        return (self.me + offset) % self.n

    def glob(self, p: int) -> int:
        """Global rank of group rank p (peers are checked once per call, not per message)."""
        return p if self.group is None else dist.get_global_rank(self.group, p)

    def post(self, phase: str, step: int, chunk: int, send=None, dst=None, recv=None, src=None, glob=False):
        """Post a receive from `src`, then a send to `dst` (group ranks; global if `glob`)."""
        label = f"{self.name} {phase} step {step} chunk {chunk}"
        hs = []
        if recv is not None:
            src = src if glob else self.glob(src)
            hs.append(comms.post_recv(recv, src, self.group, _TAG, label, _NO_FIELDS, False))
        if send is not None:
            dst = dst if glob else self.glob(dst)
            hs.append(comms.post_send(send, dst, self.group, _TAG, label, _NO_FIELDS, False))
            self.sent += send.numel() * send.element_size()
        return hs

    def step(self, *args, **kw) -> None:
        comms.wait_all(self.post(*args, **kw))

    def done(self, result):
        self.dev.activity.set(self.activity)
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


def _num_segments(c, chunk_bytes: int) -> int:
    """Messages per ring chunk. A simulated device sends each chunk whole (the alpha-beta model
    counts one message per step) unless `segment_bytes` is given; a real one cuts it into
    messages of at most SEGMENT_BYTES, so that the reduction of one segment overlaps the
    transfer of the next and the receive buffer stays small (pipelining, as gloo's and NCCL's
    rings do). gloo cuts at 1 MiB; from Python every message costs tens of microseconds of
    bookkeeping plus a wake-up of the waiting rank, and on a laptop whose ranks share two
    cores there is no idle core to overlap with: measured on 2 cores, 1 MiB messages were
    20-40% slower than whole chunks at 4-16 MiB, 8-16 MiB ones 5-10% faster at 64 MiB
    (bench/collectives.py). So we cut at 8 MiB."""
    segment_bytes = c.segment_bytes
    if segment_bytes is None:
        segment_bytes = 0 if c.dev.modelled else SEGMENT_BYTES
    return max(1, -(-chunk_bytes // segment_bytes)) if segment_bytes else 1


def _scratch(dtype, rows: int, cols: int):
    """A (rows, cols) receive buffer, reused from call to call."""
    scratch = current().scratch  # kept on the device: a fresh big buffer costs page faults
    buf = scratch.get(dtype)
    if buf is None or buf.numel() < rows * cols:
        buf = scratch[dtype] = torch.empty(rows * cols, dtype=dtype)
    return buf[: rows * cols].view(rows, cols)


def _run_ring(c, steps, num_segments: int) -> None:
    """Run ring steps as a pipeline of segment messages. ``steps[t] = (phase, step, chunk, sends,
    recvs, reduces, divide)``: segment k of step t sends ``sends[k]`` to the right neighbour and
    receives from the left into ``recvs[k]`` (copy phases) or into a scratch slot that is then
    reduced, ``reduces[k] = (local, target)``: target = op(local, received), divided by n if
    `divide` (avg). Step t+1 sends what step t received, segment by segment, so segment k of
    step t+1 is posted once segment k of step t is waited and reduced; DEPTH segments fly at
    once. With one segment this is the textbook loop: post, wait (receive, then send), reduce."""
    S = num_segments
    depth, total = min(DEPTH, S), len(steps) * S
    reducing = [r[0].numel() for st in steps if st[5] for r in st[5]]
    scratch = _scratch(steps[0][3][0].dtype, depth, max(reducing)) if reducing else None
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
            _reduce_into(c.op, local, recv.tensor, target)
            if divide:
                target.div_(c.n)
        if j + depth < total:
            post(j + depth)


def _split(chunks, S):
    return [list(torch.tensor_split(x, S)) for x in chunks]


def all_reduce(tensor, op="sum", group=None, *, check: bool = True, segment_bytes: int | None = None):
    """Bandwidth-optimal ring (Patarasuk & Yuan 2009; Baidu 2017): reduce-scatter, then
    all-gather, over the n chunks of the flattened tensor. Reduce-scatter step s: rank r sends
    chunk r-s-1 to r+1 (its own at s=0, later the partial sum it just made) and adds chunk
    r-s-2 from r-1; after n-1 steps it holds chunk r fully reduced. All-gather step s: it sends
    chunk r-s and receives chunk r-s-1 in place. 2(n-1) steps; rank r sends
    2N - |chunk r| - |chunk r+1| bytes, that is 2(n-1)/n N when n divides the size: every rank
    sends about 2N whatever n. On a real device each chunk travels as messages of at most
    `segment_bytes` (default SEGMENT_BYTES), pipelined; the bytes are the same. In place;
    returns `tensor`."""
    c = _Call("all_reduce", tensor, group, op, check=check, reduce=True, segment_bytes=segment_bytes)
    if c.n == 1:
        return c.done(tensor)
    n, me = c.n, c.me
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    cs = _chunks(flat, n)
    S = _num_segments(c, cs[0].numel() * flat.element_size(), )
    seg = _split(cs, S)
    steps = [("reduce-scatter", s, (me - s - 1) % n, seg[(me - s - 1) % n], None,
              list(zip(seg[(me - s - 2) % n], seg[(me - s - 2) % n])), c.op == "avg" and s == n - 2)
             for s in range(n - 1)]
    steps += [("all-gather", n - 1 + s, (me - s) % n, seg[(me - s) % n], seg[(me - s - 1) % n], None, False)
              for s in range(n - 1)]
    _run_ring(c, steps, S)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return c.done(tensor)


def reduce_scatter(tensor, op="sum", group=None, *, check: bool = True, segment_bytes: int | None = None):
    """Ring reduce-scatter: returns chunk r (`torch.tensor_split(tensor, n)[r]`, dim 0) of the
    reduction, on rank r. Step s: rank r sends chunk r-s-1 to r+1 (its own input at s=0, then
    the partial sum it made at step s-1) and reduces chunk r-s-2 from r-1 into a partial sum
    (two scratch chunks, used in turn). n-1 steps; rank r sends N - |chunk r| bytes
    ((n-1)/n N when n divides dim 0). `tensor` is left untouched."""
    c = _Call("reduce_scatter", tensor, group, op, check=check, reduce=True, segment_bytes=segment_bytes)
    cs = _chunks(tensor.contiguous(), c.n)
    if c.n == 1:
        return c.done(tensor.clone())
    n, me = c.n, c.me
    out = torch.empty_like(cs[me])
    flat = [x.reshape(-1) for x in cs]  # chunks of a contiguous tensor along dim 0: views
    S = _num_segments(c, flat[0].numel() * tensor.element_size())
    partial = [torch.empty_like(flat[0]) for _ in range(min(2, n - 2))]
    seg_in = _split(flat, S)
    # target of step s: `out` at the last step, else partial[s % 2] cut like chunk r-s-2
    tgt = [_split([out.view(-1) if s == n - 2 else partial[s % 2][: flat[(me - s - 2) % n].numel()]], S)[0]
           for s in range(n - 1)]
    steps = [("reduce-scatter", s, (me - s - 1) % n, seg_in[(me - 1) % n] if s == 0 else tgt[s - 1], None,
              list(zip(seg_in[(me - s - 2) % n], tgt[s])), c.op == "avg" and s == n - 2)
             for s in range(n - 1)]
    _run_ring(c, steps, S)
    return c.done(out)


def all_gather(tensor, group=None, *, check: bool = True, segment_bytes: int | None = None):
    """Ring all-gather: every rank's `tensor` concatenated along dim 0, in rank order (like
    `dist.all_gather_into_tensor`). Step s: rank r sends block r-s to r+1 and receives block
    r-s-1 from r-1 straight into its place. n-1 steps; every rank sends (n-1) N bytes, N its
    input."""
    c = _Call("all_gather", tensor, group, check=check, segment_bytes=segment_bytes)
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    out = torch.empty((c.n * t.shape[0], *t.shape[1:]), dtype=t.dtype)
    cs = list(out.chunk(c.n, dim=0)) if t.shape[0] else [out[:0]] * c.n
    cs[c.me].copy_(t)
    if c.n > 1:
        n, me = c.n, c.me
        S = _num_segments(c, t.numel() * t.element_size())
        seg = _split([x.reshape(-1) for x in cs], S)
        _run_ring(c, [("all-gather", s, (me - s) % n, seg[(me - s) % n], seg[(me - s - 1) % n], None, False)
                      for s in range(n - 1)], S)
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


def predicted_time(name: str, nbytes: int, n: int, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Alpha-beta time of collective `name` on n ranks for an N-byte tensor (divisible sizes;
    all_gather: N is one rank's input). `gamma` (seconds per byte reduced, default 0: the
    textbook model ignores the reduction's compute) adds the local reductions on the critical
    path: (n-1)/n N for the rings, (n-1) N for the naive ring, ceil(log2 n) N for the tree
    (Thakur, Rabenseifner & Gropp 2005). A simulated device does not model it: gamma = 0."""
    if n == 1:
        return 0.0
    steps = _tree_steps(n)
    return {
        "broadcast": steps * (alpha + nbytes / beta),
        "reduce": steps * (alpha + nbytes / beta + nbytes * gamma),
        "all_reduce_naive": (n - 1) * (alpha + nbytes / beta + nbytes * gamma),
        "all_reduce": 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / beta + (n - 1) / n * nbytes * gamma,
        "reduce_scatter": (n - 1) * alpha + (n - 1) / n * nbytes / beta + (n - 1) / n * nbytes * gamma,
        "all_gather": (n - 1) * (alpha + nbytes / beta),
        "all_to_all": (n - 1) * alpha + (n - 1) / n * nbytes / beta,
    }[name]
