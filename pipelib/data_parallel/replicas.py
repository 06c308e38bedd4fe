"""Replicas must start equal: one broadcast-and-compare before any training step.

Data parallelism keeps a full copy of the model on every rank of the group and averages the
gradients: the copies stay equal only if they *start* equal. A rank that built its model from a
different seed trains a different model, and nothing crashes: the all-reduced gradient is
simply applied to different weights. So every wrapper of chapters 07-08 (DDP, ZeRO) calls
`check_same_parameters` at wrap time, as torch's DistributedDataParallel verifies parameter
shapes across ranks (and then broadcasts rank 0's weights; here the broadcast is `broadcast_parameters`,
a separate, explicit step the reader chooses).

Who sends what (n ranks in the group, psi bytes of parameters): first every rank sends a small
signature (number of parameters, elements, a checksum of names, shapes and dtypes) to every other
rank, so a structural mismatch is an error, not a gloo abort on a wrong-sized buffer; then group
rank 0 broadcasts all its parameter bytes (one flat uint8 tensor, any dtypes), every rank
compares bit for bit, and all ranks exchange the index of their first differing parameter, so
every rank raises the same `ValueError`. These are raw torch.distributed collectives: a check, not training
traffic, so they record no events and leave a simulated clock alone.

Introduced in chapter 07; chapter 08's ZeRO wrappers call it too.
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from pipelib.runtime.device import current

_SIGNATURE = 5  # parameters, elements, trainable ones, checksum of (name, shape, dtype, requires_grad), settings


def _group_facts(group, what: str):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if me < 0:
        raise ValueError(f"rank {dist.get_rank()}: {what} on a group this rank is not part of; "
                         f"call it only on the group's ranks")
    glob = [dist.get_global_rank(group, i) if group is not None else i for i in range(n)]
    return n, me, glob


def _all_gather_ints(row: torch.Tensor, group, n: int) -> torch.Tensor:
    rows = [torch.empty_like(row) for _ in range(n)]
    dist.all_gather(rows, row, group=group)
    return torch.stack(rows)


def _signature(params, device, settings: dict) -> torch.Tensor:
    """A frozen parameter is part of the structure: a rank that freezes another set all-reduces
    other gradients than its peers (or fewer), a silent mix or a hang. `settings`: the wrapper's
    arguments that must match too (its `comm`), agreed in the same message."""
    text = ";".join(f"{name}:{tuple(p.shape)}:{p.dtype}:{p.requires_grad}" for name, p in params)
    return torch.tensor([len(params), sum(p.numel() for _, p in params), sum(p.requires_grad for _, p in params),
                         zlib.crc32(text.encode()), zlib.crc32(repr(sorted(settings.items())).encode())],
                        dtype=torch.int64, device=device)


def _flat_bytes(params, device) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """All parameters as one uint8 tensor (any dtypes) on `device`, and each one's (offset, length)."""
    pieces, spans, off = [], [], 0
    for _, p in params:
        b = p.detach().to(device).contiguous().view(-1).view(torch.uint8)
        pieces.append(b)
        spans.append((off, b.numel()))
        off += b.numel()
    return (torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.uint8, device=device)), spans


def check_same_parameters(module: torch.nn.Module, group=None, *, ignore=frozenset(), **settings) -> int:
    """Raise a ValueError on every rank of `group` unless all ranks hold bit-for-bit the same
    parameters as group rank 0; return the number of parameter elements checked.

    The error names the first differing parameter and the ranks whose copy differs, and says
    what to change: build the model from the same seed on every rank, or copy rank 0's weights
    with `broadcast_parameters(module, group)` before wrapping. Runs on every rank of the group
    (a collective); costs one broadcast of the parameters' bytes, before any training. The
    keyword `settings` (a wrapper's arguments, e.g. comm="gloo") must be equal on every rank too:
    else `pipelib.comm.agreement.ArgumentMismatchError` names each rank's value. `ignore`: names
    of parameters each rank holds its own of (experts split over ep), left out of the check."""
    n, me, glob = _group_facts(group, "check_same_parameters")
    params = [(name, p) for name, p in module.named_parameters() if name not in ignore]
    if n == 1:
        return sum(p.numel() for _, p in params)
    device = current().torch_device  # where the backend's collectives run: the GPU under NCCL
    sigs = _all_gather_ints(_signature(params, device, settings), group, n)
    if bool((sigs[:, :-1] == sigs[0, :-1]).all()) and not bool((sigs[:, -1] == sigs[0, -1]).all()):
        from pipelib.comm.agreement import agree

        agree(type(module).__name__ + " wrapper", group, **settings)  # every rank is here: names the values
    if not bool((sigs == sigs[0]).all()):
        rows = ", ".join(f"rank {g}: {int(s[0])} parameters ({int(s[2])} trainable), {int(s[1])} elements"
                         for g, s in zip(glob, sigs))
        frozen = [name for name, p in params if not p.requires_grad]
        raise ValueError(f"check_same_parameters: the ranks' models differ in structure (parameter names, "
                         f"shapes, dtypes or which are frozen): {rows}; frozen on rank {dist.get_rank()}: "
                         f"{frozen[:6]}{' ...' if len(frozen) > 6 else ''}. Build the same model (same config) "
                         f"and freeze the same parameters (requires_grad=False) on every rank of the group "
                         f"before wrapping it.")
    flat, spans = _flat_bytes(params, device)
    theirs = flat.clone()
    dist.broadcast(theirs, glob[0], group=group)
    first = len(params)
    if not torch.equal(theirs, flat):
        first = next(i for i, (o, k) in enumerate(spans) if not torch.equal(theirs[o:o + k], flat[o:o + k]))
    firsts = _all_gather_ints(torch.tensor([first], dtype=torch.int64, device=device), group, n).view(-1)
    if bool((firsts < len(params)).any()):
        i = int(firsts.min())
        name, p = params[i]
        bad = [glob[r] for r in range(n) if int(firsts[r]) <= i]
        more = [params[int(f)][0] for f in firsts if i < int(f) < len(params)]
        also = f" (other ranks first differ at {sorted(set(more))})" if more else ""
        raise ValueError(
            f"check_same_parameters: parameter {name!r} {tuple(p.shape)} differs between rank {glob[0]} "
            f"(group rank 0) and rank(s) {bad}{also}. Data parallelism needs identical replicas at "
            f"the start: build the model from the same seed on every rank (e.g. GPT(config, seed=0)), "
            f"or copy rank {glob[0]}'s weights with broadcast_parameters(module, group) before wrapping.")
    return sum(p.numel() for _, p in params)


@torch.no_grad()
def broadcast_parameters(module: torch.nn.Module, group=None) -> torch.nn.Module:
    """Copy group rank 0's parameters and buffers into every rank's `module` (in place; returns
    it): what torch's DistributedDataParallel does when it wraps a model. One raw torch.distributed broadcast
    per tensor, before training; not traced."""
    n, _, glob = _group_facts(group, "broadcast_parameters")
    if n > 1:
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, glob[0], group=group)
    return module
