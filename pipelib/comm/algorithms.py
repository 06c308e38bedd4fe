"""More collectives from point-to-point messages: choosing an all-reduce algorithm, and the
rooted ones (gather, scatter) and the barrier.

    all_reduce_halving_doubling(x, group=g)           # Rabenseifner: 2 log2 N steps
    all_reduce_hierarchical(x, group=g, ranks_per_node=8)
    y = gather_tree(x, dst=0, group=g)                 # on dst: every rank's x along dim 0
    scatter_tree(x, scatter_list, src=0, group=g)      # x = scatter_list[r] on rank r
    barrier(group=g)                                   # dissemination: ceil(log2 N) rounds

Same conventions as `pipelib.comm.collectives`: the group as an argument, peers are group
ranks, every call checks that all ranks agree (``check=False`` skips it), records one
COLLECTIVE event with the bytes this rank sent (``label=`` names it ``"<name>: <label>"``), and
labels its messages
``"<name> <phase> step <s> chunk <c>"``. Bytes sent per rank (exact), alpha-beta times and
torch's twin: `pipelib.comm.registry`, one entry per collective. The tensor's bytes are n and
the group's size N, as in the book.

Introduced in chapter 06 ("Choosing an algorithm").
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.comm.collectives import _Call, _row_chunks
from pipelib.comm.registry import check_power_of_two, chunk_sizes, ranks_per_node_of, tree_steps
from pipelib.comm.ring import reduce_into
from pipelib.runtime.device import current


def _flat(tensor):
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def _finish(c, tensor, flat):
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return c.done(tensor)


def all_reduce_halving_doubling(tensor, op="sum", group=None, *, check: bool = True, label: str | None = None):
    """Rabenseifner's all-reduce (Thakur, Rabenseifner & Gropp 2005), N a power of two. The
    flattened tensor is cut in N chunks (`alphabeta.chunk_sizes`). Reduce-scatter by recursive
    halving: at distance d = N/2, N/4, ..., 1 rank r swaps with r XOR d the aligned block of d
    chunks that holds the partner's chunk, and reduces the block holding its own; after log2 N
    steps it holds chunk r reduced. All-gather by recursive doubling, d = 1, 2, ..., N/2: it
    sends its block of d chunks to r XOR d and receives the partner's. 2 log2 N steps against
    the ring's 2(N-1); 2(N-1)/N n bytes per rank, like the ring. In place; returns `tensor`."""
    name = "all_reduce_halving_doubling"
    check_power_of_two(name, dist.get_world_size(group))
    c = _Call(name, tensor, group, op, check=check, reduce=True, label=label)
    if c.n == 1:
        return c.done(tensor)
    n, me, flat = c.n, c.me, _flat(tensor)
    off = [0]
    for s in chunk_sizes(flat.numel(), n):
        off.append(off[-1] + s)

    def block(r, d):
        lo = r // d * d
        return lo, flat[off[lo]:off[lo + d]]

    scratch = torch.empty_like(flat)
    ds = [1 << k for k in range(tree_steps(n))]
    for step, d in enumerate(reversed(ds)):
        first, theirs = block(me ^ d, d)
        _, mine = block(me, d)
        got = scratch[:mine.numel()]
        c.step("reduce-scatter", step, first, send=theirs, dst=me ^ d, recv=got, src=me ^ d)
        reduce_into(c.op, mine, got, mine)
    for step, d in enumerate(ds, start=len(ds)):
        first, mine = block(me, d)
        c.step("all-gather", step, first, send=mine, dst=me ^ d, recv=block(me ^ d, d)[1], src=me ^ d)
    if c.op == "avg":
        flat.div_(n)
    return _finish(c, tensor, flat)


def all_reduce_hierarchical(tensor, op="sum", group=None, *, ranks_per_node: int | None = None,
                            check: bool = True, label: str | None = None):
    """Two levels, as on nodes of P GPUs joined by a slower network: group ranks
    [kP, (k+1)P) form node k, its first rank the node's leader. (1) Binomial-tree reduce to the
    leader inside each node, ceil(log2 P) steps; (2) ring all-reduce across the N/P leaders,
    2(N/P - 1) steps of whole chunks; (3) binomial-tree broadcast back inside each node. P is
    `ranks_per_node` (None: gcd(N, 8)); it must divide N. Bytes: n once per non-leader (the
    reduce), n per child in the broadcast tree, and the leaders' ring on top. In place; returns
    `tensor`."""
    p = ranks_per_node_of(dist.get_world_size(group), ranks_per_node)
    c = _Call("all_reduce_hierarchical", tensor, group, op, check=check, reduce=True, label=label)
    if c.n == 1:
        return c.done(tensor)
    flat, (node, local), L = _flat(tensor), divmod(c.me, p), c.n // p
    step, buf = 0, torch.empty_like(flat)
    for k in range(tree_steps(p)):  # (1) reduce to the leader
        mask = 1 << k
        if local & mask:
            c.step("node reduce", step + k, c.me, send=flat, dst=c.me - mask)
            break
        if local + mask < p:
            c.step("node reduce", step + k, c.me + mask, recv=buf, src=c.me + mask)
            reduce_into(c.op, flat, buf, flat)
    step += tree_steps(p)
    if local == 0 and L > 1:  # (2) ring across the leaders: leader j ends with chunk j+1
        cs, right, left = _row_chunks(flat, L), (node + 1) % L * p, (node - 1) % L * p
        for s in range(L - 1):
            i, j = (node - s) % L, (node - s - 1) % L
            got = buf[:cs[j].numel()]
            c.step("leaders reduce-scatter", step + s, i, send=cs[i], dst=right, recv=got, src=left)
            reduce_into(c.op, cs[j], got, cs[j])
        for s in range(L - 1):
            i, j = (node + 1 - s) % L, (node - s) % L
            c.step("leaders all-gather", step + L - 1 + s, i, send=cs[i], dst=right, recv=cs[j], src=left)
    step += 2 * (L - 1)
    if local == 0 and c.op == "avg":
        flat.div_(c.n)
    for k in range(tree_steps(p)):  # (3) broadcast from the leader
        mask = 1 << k
        if local < mask and local + mask < p:
            c.step("node broadcast", step + k, node, send=flat, dst=c.me + mask)
        elif mask <= local < 2 * mask:
            c.step("node broadcast", step + k, node, recv=flat, src=c.me - mask)
    return _finish(c, tensor, flat)


def _blocks(t, n):
    """A buffer of n blocks shaped like t along dim 0, and its blocks as views."""
    t = t.reshape(1) if t.dim() == 0 else t
    buf = torch.empty((n * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    return t, buf, (lambda lo, hi: buf[lo * t.shape[0]:hi * t.shape[0]])


def gather_tree(tensor, dst: int = 0, group=None, *, check: bool = True, label: str | None = None):
    """Binomial-tree gather (like `dist.gather`): returns, on `dst`, every rank's `tensor`
    concatenated along dim 0 in group-rank order (None on the other ranks). With v the rank
    relative to dst, at step k a rank with bit k of v set sends the blocks it holds,
    [v, min(v + 2^k, N)), to v - 2^k and stops; the others receive the next ones from v + 2^k.
    ceil(log2 N) steps; rank v sends n min(2^k, N - v) bytes once, k its lowest set bit."""
    c = _Call("gather_tree", tensor, group, root=dst, check=check, label=label)
    t, buf, blocks = _blocks(tensor, c.n)
    v = (c.me - dst) % c.n
    blocks(v, v + 1).copy_(t)
    for k in range(tree_steps(c.n)):
        mask = 1 << k
        if v & mask:
            c.step("gather", k, v, send=blocks(v, min(v + mask, c.n)), dst=(c.me - mask) % c.n)
            return c.done(None)
        if v + mask < c.n:
            c.step("gather", k, v + mask, recv=blocks(v + mask, min(v + 2 * mask, c.n)), src=(c.me + mask) % c.n)
    return c.done(buf.roll(dst * t.shape[0], 0) if c.n > 1 else buf)


def scatter_tree(tensor, scatter_list=None, src: int = 0, group=None, *, check: bool = True,
                 label: str | None = None):
    """Binomial-tree scatter (like `dist.scatter`): rank r's `tensor` becomes `scatter_list[r]`
    of rank `src` (a list of N tensors shaped like `tensor`, given on src only). With v the rank
    relative to src, from the top step down, a rank holding blocks [v, v + 2^(k+1)) sends
    [v + 2^k, min(v + 2^(k+1), N)) to v + 2^k. ceil(log2 N) steps; src sends (N-1) n bytes in
    all. In place; returns `tensor`."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if me == src and (scatter_list is None or len(scatter_list) != n or any(
            x.shape != tensor.shape or x.dtype != tensor.dtype for x in scatter_list)):
        raise ValueError(f"rank {dist.get_rank()}: scatter_tree on src {src} needs scatter_list, {n} tensors "
                         f"of shape {tuple(tensor.shape)} and dtype {tensor.dtype} (one per group rank)")
    c = _Call("scatter_tree", tensor, group, root=src, check=check, label=label)
    t, buf, blocks = _blocks(tensor, c.n)
    v = (c.me - src) % c.n
    if v == 0:
        for u in range(c.n):
            blocks(u, u + 1).copy_(scatter_list[(u + src) % c.n].reshape(t.shape))
    low = v & -v if v else 1 << tree_steps(c.n)
    for k in reversed(range(tree_steps(c.n))):
        mask = 1 << k
        if mask < low and v + mask < c.n:
            c.step("scatter", k, v + mask, send=blocks(v + mask, min(v + 2 * mask, c.n)), dst=(c.me + mask) % c.n)
        elif mask == low:
            c.step("scatter", k, v, recv=blocks(v, min(v + mask, c.n)), src=(c.me - mask) % c.n)
    t.copy_(blocks(v, v + 1))
    return c.done(tensor)


def barrier(group=None, *, check: bool = True, label: str | None = None):
    """Dissemination barrier (Hensgen, Finkel & Manber 1988): in round k every rank sends a
    one-byte token to r + 2^k and waits for the one from r - 2^k. After ceil(log2 N) rounds
    every rank has heard, directly or not, from every other: no rank leaves before all have
    arrived (`dist.barrier`). ceil(log2 N) bytes per rank."""
    token = torch.zeros(1, dtype=torch.uint8, device=current().torch_device)
    c = _Call("barrier", token, group, check=check, label=label)
    got = torch.empty_like(token)
    for k in range(tree_steps(c.n)):
        c.step("barrier", k, c.me, send=token, dst=c.peer(1 << k), recv=got, src=c.peer(-(1 << k)))
    return c.done(None)
