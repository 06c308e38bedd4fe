"""Before a collective: do all ranks agree on what they are calling?

Every call of `pipelib.comm.collectives` first checks that all ranks agree (`check_same`: each
rank sends a 13-integer header with the collective, dtype, numel, shape, op and root to every
other rank, one message latency), so a mismatch becomes one `CollectiveMismatchError` on every
rank naming each rank's value, instead of a hang or an aborted engine (``check=False`` skips
it; chapter 06 measures its cost). The check does not advance a simulated clock.

The header codes the collective as its index in `pipelib.comm.alphabeta.NAMES`, the op as its
index in `OPS`, and the dtype as its code in `pipelib.comm.message.DTYPES`: one table each.

Introduced in chapter 06.
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from pipelib.comm.alphabeta import NAMES, OPS
from pipelib.comm.message import DTYPE_CODE, dtype_name

HEADER_INTS = 13  # dtype, numel, dim, shape (7), collective, op, root
COLLECTIVE_TAG = 9000  # the collectives' messages never match a user's point-to-point ones
CHECK_TAG = 2 * COLLECTIVE_TAG + 2  # the headers' raw gloo tag: p2p sends on 2 tag and 2 tag + 1


class CollectiveMismatchError(ValueError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


def _meta(name: str, tensor, op: str, root: int) -> torch.Tensor:
    """This rank's header: dtype code, numel, dim, the first 7 sizes (-1 padded), collective, op, root."""
    shape = list(tensor.shape)[:7]
    m = [DTYPE_CODE.get(tensor.dtype, -1), tensor.numel(), tensor.dim(), *shape]
    m += [-1] * (HEADER_INTS - 3 - len(m)) + [_name_code(name), OPS.index(op) if op in OPS else -1, root]
    return torch.tensor(m, dtype=torch.int64)


def _name_code(name: str) -> int:
    return NAMES.index(name) if name in NAMES else zlib.crc32(name.encode()) + len(NAMES)


def _code_name(code: int) -> str:
    return NAMES[code] if 0 <= code < len(NAMES) else f"collective #{code}"


def _shape_and_dtype(row) -> str:
    r = [int(v) for v in row]
    shape = tuple(r[3:3 + min(r[2], 7)])
    return f"{shape} {dtype_name(r[0])}"


def check_same(name: str, tensor, group=None, *, op: str = "sum", root: int = 0) -> None:
    """Raise `CollectiveMismatchError` on every rank if ranks disagree on the collective, shape,
    dtype, op or root. Every rank sends a header of 13 integers to every other rank, all at
    once: one message latency whatever n (a gloo all-gather would take n-1 in a ring, plus a
    hand-over to gloo's worker thread), so the check costs about one small message (chapter 06
    measures it). Raw gloo messages on their own tag: no trace events, no clock advance."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    glob = [dist.get_global_rank(group, i) if group is not None else i for i in range(n)]
    rows = torch.empty((n, HEADER_INTS), dtype=torch.int64)
    rows[me] = mine = _meta(name, tensor, op, root)
    works = [dist.irecv(rows[p], glob[p], group=group, tag=CHECK_TAG) for p in range(n) if p != me]
    works += [dist.isend(mine, glob[p], group=group, tag=CHECK_TAG) for p in range(n) if p != me]
    for w in works:
        w.wait()
    if bool((rows == mine).all()):
        return
    H, parts = HEADER_INTS, []
    for field, cols, fmt in (
            ("collective", slice(H - 3, H - 2), lambda r: _code_name(int(r[-3]))),
            ("shape/dtype", slice(0, H - 3), _shape_and_dtype),
            ("op", slice(H - 2, H - 1), lambda r: OPS[int(r[-2])] if 0 <= r[-2] < len(OPS) else "?"),
            ("root", slice(H - 1, H), lambda r: str(int(r[-1])))):
        if not bool((rows[:, cols] == rows[0, cols]).all()):
            parts.append(f"{field} differs: " + ", ".join(f"rank {g} {fmt(rows[i])}" for i, g in enumerate(glob)))
    raise CollectiveMismatchError(f"{name}: ranks disagree; " + "; ".join(parts) + ". Every rank of the "
                                  "group must call the same collective with the same shape, dtype, op and root.")
