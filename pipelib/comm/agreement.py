"""Before a collective: do all ranks agree on what they are calling?

Every call of `pipelib.comm.collectives` first checks that all ranks agree (`check_same`: each
rank sends a 14-integer header with the collective, dtype, numel, shape, op, root and a checksum
of its settings to every other rank, one message latency), so a mismatch becomes one
`CollectiveMismatchError` on every rank naming each rank's value, instead of a hang or an
aborted engine (``check=False`` skips it; chapter 06 measures its cost). The check does not
advance a simulated clock.

The same header agrees on the arguments a strategy's ranks must share (`agree`: the bucket plan
and frozen parameters of DDP, the ZeRO stage, the schedule and its (p, m, v), ring attention's
layout and causality): once at wrap or step time, never per message. A disagreement raises
`ArgumentMismatchError` on every rank naming the argument and each rank's value. Only then,
when every rank already knows the check failed, do the ranks exchange the names and settings
themselves (an object all-gather), so the message shows them in words, not as checksums.

With ``check=False`` nothing is agreed: on a simulated device the ring's messages still carry a
header (the send time), so a message that does not fit its receive buffer is caught and raised
as `CollectiveMismatchError` naming this rank's shape (`unchecked_sizes`); on a real device no
header travels, gloo aborts the receiving process, and the `RankDiedError` names each rank's
collective with its shape (the flight record of an unchecked call carries it).

The header codes the collective as its index in `pipelib.comm.alphabeta.NAMES`, the op as its
index in `OPS`, and the dtype as its code in `pipelib.comm.message.DTYPES`: one table each.

Introduced in chapter 06.
"""
from __future__ import annotations

import contextlib
import zlib

import torch
import torch.distributed as dist

from pipelib.comm.alphabeta import NAMES, OPS
from pipelib.comm.message import DTYPE_CODE, MessageMismatchError, dtype_name

HEADER_INTS = 14  # dtype, numel, dim, shape (7), collective, op, root, settings checksum
COLLECTIVE_TAG = 9000  # the collectives' messages never match a user's point-to-point ones
CHECK_TAG = 2 * COLLECTIVE_TAG + 2  # the headers' raw gloo tag: p2p sends on 2 tag and 2 tag + 1


class CollectiveMismatchError(ValueError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


class ArgumentMismatchError(CollectiveMismatchError):
    """Ranks passed different values for an argument that must be the same on every rank."""


def _meta(name: str, tensor, op: str, root: int, settings=None) -> torch.Tensor:
    """This rank's header: dtype code, numel, dim, the first 7 sizes (-1 padded), collective, op,
    root, and a checksum of `settings` (0 for none)."""
    shape = list(tensor.shape)[:7]
    m = [DTYPE_CODE.get(tensor.dtype, -1), tensor.numel(), tensor.dim(), *shape]
    m += [-1] * (HEADER_INTS - 4 - len(m)) + [_name_code(name), OPS.index(op) if op in OPS else -1, root,
                                              _settings_code(settings)]
    return torch.tensor(m, dtype=torch.int64, device="cpu")  # moved to the backend's device to travel


def _settings_code(settings) -> int:
    return 0 if not settings else zlib.crc32(repr(sorted(settings.items())).encode()) + 1


def _name_code(name: str) -> int:
    return NAMES.index(name) if name in NAMES else zlib.crc32(name.encode()) + len(NAMES)


def _code_name(code: int) -> str:
    return NAMES[code] if 0 <= code < len(NAMES) else f"collective #{code}"


def _exchange_headers(mine: torch.Tensor, group, what: str):
    """Every rank's header, exchanged all at once on the check's own tag; the beacon says who is
    awaited (a rank that never calls leaves the others here until the cluster's timeout)."""
    from pipelib.runtime.device import current

    n, me = dist.get_world_size(group), dist.get_rank(group)
    if me < 0:
        raise ValueError(f"rank {dist.get_rank()}: {what} on a group this rank is not part of; "
                         f"call it only on the group's ranks")
    glob = [dist.get_global_rank(group, i) if group is not None else i for i in range(n)]
    dev = current()
    others = [g for i, g in enumerate(glob) if i != me]
    with dev.activity.doing(f"agreement check of {what}: waiting for ranks {others} to call it too"):
        if dev.activity.flight.depth == 0:  # a check of its own (`agree`), not a collective's first step
            dev.activity.flight.enter(f"agreement check of {what}", group)  # closed by the `doing`
        rows = gather_rows(mine.to(dev.torch_device), group, glob, dev.matching.by_order)
    return rows, glob


def gather_rows(mine: torch.Tensor, group, glob, by_order: bool) -> torch.Tensor:
    """Every rank's `mine` stacked in group-rank order: one message to every other rank, all at
    once on the check's own tag (one latency, whatever n), or under NCCL's rules, which have no
    tags and would hang on receives posted before sends (`pipelib.runtime.matching`), one
    all-gather on the backend's device."""
    n, me = len(glob), dist.get_rank(group)
    if by_order:
        flat = torch.empty(n * mine.numel(), dtype=mine.dtype, device=mine.device)
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(flat, mine.reshape(-1), group=group)
        return flat.view(n, *mine.shape)
    rows = torch.empty((n, *mine.shape), dtype=mine.dtype, device=mine.device)
    rows[me] = mine
    works = [dist.irecv(rows[p], glob[p], group=group, tag=CHECK_TAG) for p in range(n) if p != me]
    works += [dist.isend(mine, glob[p], group=group, tag=CHECK_TAG) for p in range(n) if p != me]
    for w in works:
        w.wait()
    return rows


def _gather_words(words, group) -> list:
    """Every rank's `words` (names and settings in clear), once all ranks know a check failed."""
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, words, group=group)
    return out


def agree(what: str, group=None, **values) -> None:
    """Raise `ArgumentMismatchError` on every rank of `group` unless every rank passed the same
    `values` (ints, bools, strings, tuples: anything with a stable repr), naming each argument
    that differs and every rank's value. One header message to every other rank (the same
    14 integers as `check_same`), at wrap or step time; no trace event, no clock advance."""
    if dist.get_world_size(group) == 1:
        return
    rows, glob = _exchange_headers(_meta(what, _EMPTY, "sum", 0, values), group, what)
    if bool((rows == rows[0]).all()):  # on the backend's device: one comparison, no copy
        return
    words = _gather_words((what, values), group)
    _raise_disagreement(what, words, glob)


_EMPTY = torch.empty(0, dtype=torch.int64, device="cpu")  # a shape, never sent


def _raise_disagreement(what: str, words, glob) -> None:
    """The message for ranks whose (name, settings) differ: the call, then each argument."""
    names = [w[0] for w in words]
    if len(set(names)) > 1:
        raise ArgumentMismatchError(
            f"{what}: ranks are at different calls: " + ", ".join(f"rank {g} {n}" for g, n in zip(glob, names))
            + ". Every rank of the group must make the same calls in the same order.")
    keys = sorted({k for w in words for k in (w[1] or {})})
    parts = [f"{k} differs: " + ", ".join(f"rank {g} {(w[1] or {}).get(k)!r}" for g, w in zip(glob, words))
             for k in keys if len({repr((w[1] or {}).get(k)) for w in words}) > 1]
    differ = ", ".join(k.split(" ")[0] for k in keys if any(p.startswith(k + " differs") for p in parts))
    raise ArgumentMismatchError(f"{what}: ranks disagree; " + "; ".join(parts)
                                + f". Pass the same {differ} on every rank of the group.")


def _shape_and_dtype(row) -> str:
    r = [int(v) for v in row]
    shape = tuple(r[3:3 + min(r[2], 7)])
    return f"{shape} {dtype_name(r[0])}"


def check_same(name: str, tensor, group=None, *, op: str = "sum", root: int = 0, settings=None) -> None:
    """Raise `CollectiveMismatchError` on every rank if ranks disagree on the collective, shape,
    dtype, op, root or `settings` (a dict of the call's own arguments that must match, e.g. ring
    attention's layout and causality). Every rank sends a header of 14 integers to every other
    rank, all at once: one message latency whatever n (a gloo all-gather would take n-1 in a
    ring, plus a hand-over to gloo's worker thread), so the check costs about one small message
    (chapter 06 measures it). Raw gloo messages on their own tag: no trace events, no clock advance."""
    mine = _meta(name, tensor, op, root, settings)
    rows, glob = _exchange_headers(mine, group, name)
    rows = rows.cpu()
    if bool((rows == mine).all()):
        return
    words = _gather_words((name, settings), group)  # names and settings in clear, not checksums
    names = [w[0] for w in words]
    H, parts = HEADER_INTS, []
    if len(set(names)) == 1 and bool((rows[:, :H - 1] == rows[0, :H - 1]).all()):
        _raise_disagreement(name, words, glob)  # only the settings differ
    for field, cols, fmt in (
            ("collective", slice(H - 4, H - 3), lambda i, r: names[i]),
            ("shape/dtype", slice(0, H - 4), lambda i, r: _shape_and_dtype(r)),
            ("op", slice(H - 3, H - 2), lambda i, r: OPS[int(r[-3])] if 0 <= r[-3] < len(OPS) else "?"),
            ("root", slice(H - 2, H - 1), lambda i, r: str(int(r[-2]))),
            ("settings", slice(H - 1, H), lambda i, r: repr(words[i][1]))):
        if not bool((rows[:, cols] == rows[0, cols]).all()):
            parts.append(f"{field} differs: " + ", ".join(f"rank {g} {fmt(i, rows[i])}" for i, g in enumerate(glob)))
    raise CollectiveMismatchError(f"{name}: ranks disagree; " + "; ".join(parts) + ". Every rank of the "
                                  "group must call the same collective with the same shape, dtype, op and root.")


@contextlib.contextmanager
def unchecked_sizes(name: str, shape: str | None):
    """Around the messages of an unchecked collective (`check=False`): a message that did not fit
    (`MessageMismatchError`) becomes a `CollectiveMismatchError` naming the collective, this
    rank's `shape` ("(4,) float32") and the check that would have named every rank's."""
    try:
        yield
    except MessageMismatchError as e:
        raise CollectiveMismatchError(
            f"rank {dist.get_rank()}: {name} with check=False: the ranks passed different shapes (this rank "
            f"{shape}); check=False skips the agreement check that names every rank's shape and dtype: call it "
            f"with check=True (the default) to see them. The message that did not fit: {e}") from e
