"""GShard's padded dispatch: every expert gets a buffer of C rows, so one even all-to-all moves
them, and why every rank must use the same C.

    C = agreed_capacity(routing.counts, group)          # one all-reduce (max) over the ep group
    buffers = padded_dispatch(rows, counts, C, group)   # (P, E/P, C, D): from each rank, per expert

Before uneven all-to-alls, GShard and Switch Transformer sent fixed-size buffers: E experts x C
slots x D values per rank, padded with zeros where an expert got fewer tokens, so that an even
all-to-all (same shape on every rank) moves them. The price is the padding (bytes for empty
slots), and a trap: if C depends on the counts (a dropless layer padding to its busiest
expert, or a capacity computed from a rank's own token count), ranks compute different C, send
buffers of different sizes, and the all-to-all hangs or mixes rows. The fix is one collective
that makes every rank use the same C (`agreed_capacity`: the largest count anywhere). pipelib's
all-to-all checks the shapes first, so the mistake is a `CollectiveMismatchError` naming each
rank's shape instead of a hang (chapter 16 shows it).

A strategy core: plain torch.distributed, the group an argument. Chapter 16.
"""
from __future__ import annotations

import torch

from pipelib.comm.registry import collective_info


def agreed_capacity(counts: torch.Tensor, group) -> int:
    """The largest count of any expert on any rank of `group` (one all-reduce with max)."""
    top = (counts.max().reshape(1).to(torch.int64) if counts.numel()
           else torch.zeros(1, dtype=torch.int64, device=counts.device))
    collective_info("all_reduce").run(top, group, op="max", label="moe capacity")
    return int(top)


def pad_by_expert(rows: torch.Tensor, counts, capacity: int) -> torch.Tensor:
    """(E, C, D): expert e's rows (a run of the expert-sorted `rows`) in its first counts[e]
    slots, zeros after; a ValueError if an expert has more rows than slots."""
    counts = [int(c) for c in counts]
    if max(counts, default=0) > capacity:
        raise ValueError(f"pad_by_expert: an expert has {max(counts)} rows for capacity={capacity} slots; "
                         f"route with this capacity (tokens beyond it are dropped) or agree on a larger one")
    out = rows.new_zeros((len(counts), capacity, *rows.shape[1:]))
    for e, part in enumerate(torch.split(rows, counts, dim=0)):
        out[e, :part.shape[0]] = part
    return out


def padded_dispatch(rows: torch.Tensor, counts, capacity: int, group) -> torch.Tensor:
    """The (P, E/P, C, D) buffers this rank's experts receive from each of the P ranks, by one
    even all-to-all of the padded (E, C, D) buffer (E C D values per rank, padding included)."""
    n = torch.distributed.get_world_size(group)
    buf = pad_by_expert(rows, counts, capacity)  # (E, C, D)
    got = collective_info("all_to_all").run(buf, group, label="moe padded dispatch")  # (E, C, D) by source
    return got.view(n, buf.shape[0] // n, *buf.shape[1:])
