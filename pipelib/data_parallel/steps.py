"""The registry of chapter 07's DDP steps, and torch's DistributedDataParallel beside them.

    DDP_STEPS["overlap"].wrap(model, group, comm="gloo", bucket_bytes=1 << 20)

One entry per step: how to wrap a model on a group, and whether it accumulates gradients with
`no_sync()`. Every wrapper answers the same four calls, `model(...)`, `backward(loss)`,
`finish_gradients()` and `close()`, torch's DDP included (`TorchDDP`), so the runner, the bench
and the trainer never branch on a step's name.

Introduced in chapter 07.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

import torch

from pipelib.data_parallel import ddp


class DDPStepKind(NamedTuple):
    name: str
    wrap: Callable          # wrap(model, group, *, comm, bucket_bytes) -> wrapper
    accumulates: bool       # has no_sync() for gradient accumulation
    doc: str


class TorchDDP:
    """torch's DistributedDataParallel behind the steps' four calls (its backward timed as one
    COMPUTE event "B"; its all-reduces run inside it, on gloo's own threads)."""

    def __init__(self, model, group=None, *, comm: str = "gloo", bucket_bytes: int = ddp.DEFAULT_BUCKET_BYTES):
        from pipelib.runtime.device import current

        self.module, self.dev = model, current()
        self.ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                             bucket_cap_mb=bucket_bytes / 2**20)

    def __call__(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def no_sync(self):
        return self.ddp.no_sync()

    def backward(self, loss) -> None:
        with self.dev.compute("B"):
            loss.backward()

    def finish_gradients(self) -> None:
        """torch's DDP has averaged the gradients by the end of backward."""

    def close(self) -> None:
        """Nothing to stop."""


def _ours(cls, bucketed: bool = True):
    def wrap(model, group, *, comm="pipelib", bucket_bytes=ddp.DEFAULT_BUCKET_BYTES):
        return cls(model, group, comm=comm, **({"bucket_bytes": bucket_bytes} if bucketed else {}))
    return wrap


DDP_STEPS = MappingProxyType({s.name: s for s in (
    DDPStepKind("all_reduce", _ours(ddp.AllReduceGrads, bucketed=False), False,
            "step 1: every gradient all-reduced after backward"),
    DDPStepKind("buckets", _ours(ddp.BucketedGrads), False, "step 2: gradients in buckets of bucket_bytes"),
    DDPStepKind("overlap", _ours(ddp.OverlappedGrads), False,
            "step 3: each bucket's all-reduce started from gradient hooks, during backward"),
    DDPStepKind("no_sync", _ours(ddp.DDP), True, "step 4: no_sync() for gradient accumulation"),
    DDPStepKind("torch", TorchDDP, True, "torch.nn.parallel.DistributedDataParallel"),
)})


def ddp_step(name: str) -> DDPStepKind:
    step = DDP_STEPS.get(name)
    if step is None:
        raise ValueError(f"unknown DDP step {name!r}; use one of {tuple(DDP_STEPS)}")
    return step


def accumulate_context(step: DDPStepKind, wrapped, last: bool):
    """`wrapped.no_sync()` for every micro-batch but the last, for steps that accumulate."""
    return wrapped.no_sync() if (step.accumulates and not last) else contextlib.nullcontext()
