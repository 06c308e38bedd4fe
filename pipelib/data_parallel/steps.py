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

    def __init__(self, model, group=None, *, comm: str = "gloo", bucket_bytes: int = ddp.DEFAULT_BUCKET_BYTES,
                 comm_hook=None):
        from pipelib.runtime.device import current

        self.module, self.dev = model, current()
        self.ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                             bucket_cap_mb=bucket_bytes / 2**20)
        if comm_hook is not None:  # one of torch.distributed.algorithms.ddp_comm_hooks' hooks
            self.ddp.register_comm_hook(group, comm_hook)

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


def _ours(cls, bucketed: bool = True, **options):
    def wrap(model, group, *, comm="pipelib", bucket_bytes=ddp.DEFAULT_BUCKET_BYTES, ignore=frozenset()):
        return cls(model, group, comm=comm, ignore=ignore,
                   **({"bucket_bytes": bucket_bytes, **options} if bucketed else {}))
    return wrap


def torch_bf16_hook(process_group, bucket):
    """torch's `default_hooks.bf16_compress_hook`, called unchanged. torch refuses that hook by
    its name unless NCCL (>= 2.10) or XCCL is there; gloo sums bf16 too, so on CPU it is
    registered under this name."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return bf16_compress_hook(process_group, bucket)


def _torch_bf16(model, group, *, comm="gloo", bucket_bytes=ddp.DEFAULT_BUCKET_BYTES):
    return TorchDDP(model, group, comm=comm, bucket_bytes=bucket_bytes, comm_hook=torch_bf16_hook)


DDP_STEPS = MappingProxyType({s.name: s for s in (
    DDPStepKind("all_reduce", _ours(ddp.AllReduceGrads, bucketed=False), False,
            "step 1: every gradient all-reduced after backward"),
    DDPStepKind("buckets", _ours(ddp.BucketedGrads), False, "step 2: gradients in buckets of bucket_bytes"),
    DDPStepKind("overlap", _ours(ddp.OverlappedGrads), False,
            "step 3: each bucket's all-reduce started from gradient hooks, during backward"),
    DDPStepKind("no_sync", _ours(ddp.DDP), True, "step 4: no_sync() for gradient accumulation"),
    DDPStepKind("torch", TorchDDP, True, "torch.nn.parallel.DistributedDataParallel"),
    DDPStepKind("bf16", _ours(ddp.DDP, comm_hook="bf16"), True,
                "step 4 with the bf16 communication hook: buckets all-reduced in bfloat16"),
    DDPStepKind("torch_bf16", _torch_bf16, True, "torch's DDP with default_hooks.bf16_compress_hook"),
)})


def ddp_step(name: str) -> DDPStepKind:
    step = DDP_STEPS.get(name)
    if step is None:
        raise ValueError(f"unknown DDP step {name!r}; use one of {tuple(DDP_STEPS)}")
    return step


def accumulate_context(step: DDPStepKind, wrapped, last: bool):
    """`wrapped.no_sync()` for every micro-batch but the last, for steps that accumulate."""
    return wrapped.no_sync() if (step.accumulates and not last) else contextlib.nullcontext()
