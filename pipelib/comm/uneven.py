"""The uneven all-to-all: rank r sends a different number of rows to each rank (chapter 16).

    y = all_to_all_uneven(x, input_splits=[3, 0, 5, 1], group=g)   # counts exchanged first
    y = all_to_all_uneven(x, [3, 0, 5, 1], [2, 2, 0, 7], group=g)   # counts known: one pass

Rows ``x[sum(in[:j]) : sum(in[:j+1])]`` (dim 0) go to group rank j, which stores the rows from
rank i at ``sum(out[:i])``: the semantics of `torch.distributed.all_to_all_single` with
``input_split_sizes`` and ``output_split_sizes``, its twin (`pipelib.comm.twins`). Without splits
both are `tensor_split`'s chunk sizes and it is `all_to_all`. Mixture-of-experts layers need it:
each rank's tokens go to the experts their router picked, so the counts differ per pair and per
step (dropless routing, MegaBlocks; `pipelib.expert_parallel`).

Counts first: a receiver must size its buffer, so when only `input_splits` are given the counts
are exchanged by an even `all_to_all` of n integers (its own COLLECTIVE event, labelled
``"all_to_all: <label>: splits"``) before the rows move. Pairwise exchange: step s = 1..n-1 sends the
rows for rank r+s and receives those of rank r-s; on a simulated device the steps run one after
the other (the alpha-beta model's (n-1) alpha + bytes / beta; zero rows is a message of zero
bytes, which still pays alpha), on a real one step s's send then its receive are posted for
every step, all in flight at once (gloo's own order), and a pair with no rows to exchange sends
nothing (both sides know it from the splits); under NCCL's rules they are all one batch. The
MoE layer's call (counts known, ``check=False``) under gloo's rules posts its rows before any
other work, on the process group itself, and waits its sends before its receives as gloo does
(`p2p.Posted`): on 2 shared cores every microsecond of Python before a rank's receives are up
delays its peers' bytes, and with receives waited first the next call's posts stalled 3-4 ms in
28-39 % of rounds against 5-20 %. What is left is CPU: pipelib's call spends about 30 µs more
of it than the same exchange in plain torch p2p (`bench/expert_parallel.py`'s numbers are in
its docstring). Rank r sends
exactly (sum(in) - in[r]) rows (`uneven_bytes`): the bytes the trace's COLLECTIVE event holds.

The agreement check (``check=True``) compares dtype and row shape on every rank, and, when both
splits are given, that what rank i sends to j is what j expects from i: ranks that computed
different counts (a capacity each rank derived for itself) get one `CollectiveMismatchError`
naming every rank's splits instead of a hang or garbage. Raw gloo messages: no trace, no clock.

Introduced in chapter 16; one entry of `pipelib.comm.registry`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.comm import p2p as comms
from pipelib.comm.agreement import COLLECTIVE_TAG, CollectiveMismatchError, gather_rows
from pipelib.comm.collectives import _Call, all_to_all
from pipelib.comm.registry import chunk_sizes
from pipelib.runtime.device import current


def check_splits(what: str, splits, total: int | None, n: int, name: str = "all_to_all_uneven") -> list[int]:
    """`splits` as a list of n non-negative ints summing to `total` (None: to anything, as the
    rows a rank receives may); a ValueError names them."""
    out = [int(v) for v in splits]
    if len(out) != n or min(out) < 0 or (total is not None and sum(out) != total):  # n >= 1: min of a non-empty list
        raise ValueError(f"rank {dist.get_rank()}: {name}: {what}={out} on a group of {n} ranks; pass {n} "
                         f"non-negative row counts{'' if total is None else f' summing to {total}'} (the rows "
                         f"this rank {'sends' if what == 'input_splits' else 'receives'})")
    return out


def uneven_bytes(input_splits, rank: int, row_bytes: int) -> int:
    """Bytes group rank `rank` sends: every row but those it keeps, (sum(in) - in[rank]) x a row."""
    return (sum(input_splits) - input_splits[rank]) * row_bytes


def exchange_splits(input_splits, group=None, *, label: str | None = None, check: bool = True) -> list[int]:
    """Each rank's row counts for this rank, by an even all-to-all of n int64 (counts first)."""
    counts = torch.tensor(list(input_splits), dtype=torch.int64, device=current().torch_device)
    return all_to_all(counts, group, check=check, label=label).tolist()


def agree_on_splits(name: str, input_splits, output_splits, group) -> None:
    """Every rank sends its (in, out) splits to every other; all raise if some i -> j disagree."""
    n = dist.get_world_size(group)
    glob = _global_ranks(group, n)
    dev = current()
    mine = torch.tensor([list(input_splits), list(output_splits)], dtype=torch.int64, device=dev.torch_device)
    rows = gather_rows(mine, group, glob, dev.matching.by_order).cpu()
    if torch.equal(rows[:, 0], rows[:, 1].T):
        return
    bad = [f"rank {glob[i]} sends {int(rows[i, 0, j])} rows to rank {glob[j]}, which expects {int(rows[j, 1, i])}"
           for i in range(n) for j in range(n) if rows[i, 0, j] != rows[j, 1, i]]
    raise CollectiveMismatchError(
        f"{name}: ranks disagree on the counts; " + "; ".join(bad) + ". Splits per rank (in, out): "
        + ", ".join(f"rank {glob[i]} {rows[i, 0].tolist()} {rows[i, 1].tolist()}" for i in range(n))
        + ". Exchange the counts first (leave output_splits=None), or agree on one capacity with a collective.")


def all_to_all_uneven(tensor, input_splits=None, output_splits=None, group=None, *, check: bool = True,
                      label: str | None = None):
    """Uneven all-to-all from point-to-point messages (module docstring): returns the rows this
    rank receives, (sum(output_splits), *tensor.shape[1:]), in source-rank order."""
    name = "all_to_all_uneven"
    n, me = dist.get_world_size(group), dist.get_rank(group)
    even = input_splits is None
    if even:
        if output_splits is not None:
            raise ValueError(f"rank {dist.get_rank()}: {name}: output_splits={list(output_splits)} without "
                             f"input_splits; pass both, input_splits alone, or neither (even chunks)")
        input_splits = chunk_sizes(tensor.shape[0], n)
    input_splits = check_splits("input_splits", input_splits, tensor.shape[0], n)
    dev = current()
    if not (even or check or output_splits is None or dev.modelled or dev.matching.by_order or me < 0):
        return _rows_first(tensor, input_splits, output_splits, group, label, n, me)  # the MoE layer's call
    # even chunks: every rank passes the same shape, checked whole; uneven: the row shape only
    c = _Call(name, tensor if even else tensor.new_empty((0, *tensor.shape[1:])), group, check=check, label=label)
    if even:
        output_splits = [input_splits[me]] * n
    elif output_splits is None:
        # n int64 on every rank by construction, and the ranks were checked above: no second check
        output_splits = exchange_splits(input_splits, group, label=f"{label or name}: splits", check=False)
    else:
        output_splits = check_splits("output_splits", output_splits, None, n)
        if check:
            agree_on_splits(name, input_splits, output_splits, group)
    ins, out, outs = _views(tensor, input_splits, output_splits)
    if c.dev.modelled:  # the alpha-beta model's pairwise rounds, one after the other
        outs[me].copy_(ins[me])
        for s in range(1, n):
            dst, src = c.peer(s), c.peer(-s)
            c.step("all-to-all", s - 1, dst, send=ins[dst], dst=dst, recv=outs[src], src=src)
        return c.done(out)
    # a real link: every message in flight at once (`_messages`); the rows a rank keeps are
    # copied while the others travel (disjoint rows of `out`)
    items = _messages(ins, outs, input_splits, output_splits, group, n, me)
    handles = c.post_all("all-to-all", items)
    outs[me].copy_(ins[me])
    comms.wait_all(handles)
    return c.done(out)


def _views(tensor, input_splits, output_splits):
    """(ins, out, outs): the rows to each rank (views of dim 0, as torch.split's, whose Python
    wrapper costs a call), and the result with its rows from each rank (x's dtype and device)."""
    x = tensor.contiguous()
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    return x.split_with_sizes(input_splits), out, out.split_with_sizes(output_splits)


def _messages(ins, outs, input_splits, output_splits, group, n: int, me: int) -> list:
    """The messages of a real link, ``(op, tensor, global peer, step, chunk)``: step by step the
    send to r+s then the receive from r-s, gloo's own alltoallv order (in plain torch on 2 and 4
    ranks at 1-4 MiB, every receive first ran at 0.63-0.88 of gloo, this order at 0.83-1.00). A
    pair that exchanges no rows sends no message, as both sides know from the splits."""
    glob, items = _global_ranks(group, n), []
    for s in range(1, n):
        dst, src = (me + s) % n, (me - s) % n
        if input_splits[dst]:
            items.append(("send", ins[dst], glob[dst], s - 1, dst))
        if output_splits[src]:
            items.append(("recv", outs[src], glob[src], s - 1, src))
    return items


def _global_ranks(group, n: int) -> list[int]:
    """The global rank of each of the group's n ranks."""
    return list(range(n)) if group is None else [dist.get_global_rank(group, i) for i in range(n)]


def _rows_first(tensor, input_splits, output_splits, group, label, n: int, me: int):
    """`all_to_all_uneven` with the counts known and unchecked on a real link under gloo's rules:
    the rows are posted first (`p2p.Posted`), the COLLECTIVE's `_Call` and bookkeeping done while
    they travel. (A `_Call` before posting, as every other collective makes, measured 0.72-0.91 ms
    a dispatch + combine at 1 MiB on 2 ranks against 0.58-0.82 ms so.)"""
    t0 = current().clock.now()
    output_splits = check_splits("output_splits", output_splits, None, n)
    ins, out, outs = _views(tensor, input_splits, output_splits)
    posted = comms.Posted(_messages(ins, outs, input_splits, output_splits, group, n, me), group, COLLECTIVE_TAG,
                          "all_to_all_uneven all-to-all")
    c = _Call("all_to_all_uneven", tensor, group, check=False, label=label, size_rank=(n, me))  # unchecked
    c.t0 = t0
    outs[me].copy_(ins[me])
    c.sent += posted.wait()
    return c.done(out)
