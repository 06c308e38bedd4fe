"""The shape handshake before a pipeline step: each rank learns the shapes of what it receives.

The receiver of a message must allocate its buffer, so it must know the shape and dtype. Once
per step (or once per `shapes` cache, `execute(shapes=...)`), before any timing, the rank of
stage s tells the rank of stage s+1 the shape of stage s's output: one small int64 message of
`SPEC_LEN` numbers (dtype code, ndim, sizes), untimed and untraced, as
torch.distributed.pipelining infers shapes on its first step. Chapter 10.

The same message carries the sender's schedule: its stages, microbatches, stages per rank and a
checksum of its actions (`FINGERPRINT`). A rank built with another schedule, p, m or v than its
neighbour raises a ValueError naming both, before the step's first message, instead of a
microbatch that mismatches its targets seconds later.
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from pipelib.comm import p2p as comms
from pipelib.pipeline.schedules import Schedule
from pipelib.runtime.device import current

__all__ = ["exchange_shapes", "cached_shapes"]

_DTYPES = comms.DTYPES          # one dtype table: the codes of p2p's message headers
SPEC_LEN = 10                   # dtype code, ndim, up to 8 sizes
FINGERPRINT = 4                 # then the schedule: stages, microbatches, stages per rank, checksum
SHAPE_TAG = 1 << 20             # tags of the shape handshake, apart from the step's messages


def fingerprint(s: Schedule) -> list[int]:
    """(p stages, m microbatches, v stages per rank, a checksum of the actions and placement)."""
    ranks = len(set(s.stage_to_rank)) or 1
    text = repr((s.name, s.actions, s.stage_to_rank))
    return [s.num_stages, s.num_microbatches, s.num_stages // ranks, zlib.crc32(text.encode())]


def _check_fingerprint(s: Schedule, got: list[int], rank: int, src: int) -> None:
    mine = fingerprint(s)
    if got != mine:
        def say(f):
            return f"{f[0]} stages, m={f[1]} microbatches, v={f[2]} stages per rank"
        raise ValueError(f"execute: rank {rank} runs schedule {s.name!r} with {say(mine)}, but rank {src}, "
                         f"which sends it its stage input, runs " + (
                             say(got) if got[:3] != mine[:3] else "another schedule of the same sizes")
                         + ": pass the same schedule, p, m and num_chunks on every rank")


def _encode(t: torch.Tensor, s: Schedule) -> torch.Tensor:
    if t.dim() > SPEC_LEN - 2 or t.dtype not in _DTYPES:
        raise ValueError(f"stage outputs must be tensors of at most {SPEC_LEN - 2} dims and dtype "
                         f"in {_DTYPES}, got {tuple(t.shape)} {t.dtype}")
    spec = [_DTYPES.index(t.dtype), t.dim(), *t.shape]
    spec += [0] * (SPEC_LEN - len(spec)) + fingerprint(s)
    return torch.tensor(spec, dtype=torch.int64, device=current().torch_device)


def _decode(spec: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, list[int]]:
    code, ndim, *sizes = spec.tolist()
    return tuple(sizes[:ndim]), _DTYPES[code], sizes[SPEC_LEN - 2:]


def _device_of(module, default) -> torch.device:
    """Where a stage's dry run happens: its parameters' device (a stage without any: `default`)."""
    p = next(module.parameters(), None)
    return default if p is None else p.device


def exchange_shapes(s: Schedule, mine: dict, rank: int, group, first_input):
    """(in_spec, out_spec): {stage: (shape, dtype)} of my stages' inputs and outputs.

    Stages are visited in increasing order: stage s learns its input shape from stage s-1's rank
    (or from stage s-1 on this rank, or from `first_input` for stage 0), runs a forward on
    zeros without autograd and tells stage s+1's rank. `mine` maps stage -> `Stage`.
    """
    out, in_spec, handles = {}, {}, []
    comm_device = current().torch_device  # where the backend sends from: the GPU under NCCL
    for stage_id in sorted(mine):
        device = _device_of(mine[stage_id].module, comm_device)
        prev = s.stage_to_rank[stage_id - 1] if stage_id > 0 else None
        if stage_id == 0:
            x = first_input
        elif prev == rank:
            shape, dtype = out[stage_id - 1]
            x = torch.zeros(shape, dtype=dtype, device=device)
        else:
            spec = torch.empty(SPEC_LEN + FINGERPRINT, dtype=torch.int64, device=comm_device)
            src = prev if group is None else dist.get_global_rank(group, prev)
            with current().activity.doing(f"recv the shape of stage {stage_id - 1}'s output "
                                          f"from rank {src} (before the step)"):
                dist.recv(spec, src, group=group, tag=SHAPE_TAG + stage_id)
            shape, dtype, theirs = _decode(spec)
            _check_fingerprint(s, theirs, rank, src)
            x = torch.zeros(shape, dtype=dtype, device=device)
        in_spec[stage_id] = (tuple(x.shape), x.dtype)
        if stage_id == s.num_stages - 1:
            continue
        with torch.no_grad(), current().off_record():  # a tensor-parallel stage's collectives too
            y = mine[stage_id].module(x)
        out[stage_id] = (tuple(y.shape), y.dtype)
        nxt = s.stage_to_rank[stage_id + 1]
        if nxt != rank:
            dst = nxt if group is None else dist.get_global_rank(group, nxt)
            handles.append(dist.isend(_encode(y, s), dst, group=group, tag=SHAPE_TAG + stage_id + 1))
    for work in handles:
        work.wait()
    return in_spec, out


def cached_shapes(s: Schedule, mine: dict, rank: int, group, first_input, cache: dict | None):
    """`exchange_shapes`, or its result kept in `cache` from an earlier step of the same stages.

    The rank of stage 0 checks that its microbatch shape is the one the cache was filled with.
    """
    if cache is None:
        return exchange_shapes(s, mine, rank, group, first_input)
    first = None if first_input is None else (tuple(first_input.shape), first_input.dtype)
    key = (s, rank)
    if key not in cache:
        cache[key] = (first, *exchange_shapes(s, mine, rank, group, first_input))
    elif cache[key][0] != first:
        raise ValueError(f"execute: rank {rank}: microbatches of {first} but the shapes kept in "
                         f"`shapes` are for {cache[key][0]}; pass a fresh dict when the batch shape changes")
    return cache[key][1:]
