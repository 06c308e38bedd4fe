"""Communication hooks: what a DDP bucket becomes on the wire, and back (chapter 07).

torch's DDP lets a *communication hook* replace its all-reduce of a bucket
(`DistributedDataParallel.register_comm_hook`; `torch.distributed.algorithms.ddp_comm_hooks`).
pipelib's bucketed steps take one by name (`comm_hook="bf16"`) or as a `CommHook`:

- ``"allreduce"`` (the default): the bucket as it is, divided by N *before* the sum, as torch's
  `default_hooks.allreduce_hook` does ("to avoid overflow, especially for FP16"): N gradients of
  fp16 magnitude near 65,504 overflow when summed, their N-th parts do not;
- ``"bf16"``: torch's `default_hooks.bf16_compress_hook`: the fp32 bucket cast to bfloat16,
  divided by N, all-reduced in bf16 (half the bytes on the wire), cast back into the fp32
  bucket. Each element is rounded to bf16's 8 significant bits once in the cast and once per
  ring addition, up to N roundings of 2^-8 each: the averaged gradient differs from the fp32
  one by at most about N 2^-8 of the ranks' mean |g| (chapter 07 derives and checks the bound);
- ``"fp16"``: the same with float16 (`fp16_compress_hook`): more bits, less range.

Not built here, named for the reader: PowerSGD (Vogels et al. 2019, `powerSGD_hook`: each
gradient matrix sent as a rank-r product, with error feedback) and post-local SGD
(`post_localSGD_hook`: all-reduce for a warm-up, then only within subgroups, the models averaged
every few steps by `PostLocalSGDOptimizer`).

Introduced in chapter 07.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch


@dataclass(frozen=True)
class CommHook:
    """A bucket's trip over the wire: `encode` before the all-reduce (sum), `decode` after."""

    name: str
    wire_dtype: torch.dtype | None  # None: the gradients' own dtype
    doc: str

    def encode(self, flat: torch.Tensor, n: int) -> torch.Tensor:
        """The tensor to all-reduce: `flat` (in place) or a copy in `wire_dtype`, divided by n."""
        wire = flat if self.wire_dtype in (None, flat.dtype) else flat.to(self.wire_dtype)
        return wire.div_(n)

    def decode(self, wire: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """The all-reduced `wire` back into `flat` (in place; returns `flat`)."""
        if wire.data_ptr() != flat.data_ptr():
            flat.copy_(wire)
        return flat


COMM_HOOKS = MappingProxyType({h.name: h for h in (
    CommHook("allreduce", None, "the bucket divided by N, then summed: torch's default allreduce_hook"),
    CommHook("bf16", torch.bfloat16, "cast to bfloat16 and divided by N, summed, cast back: bf16_compress_hook"),
    CommHook("fp16", torch.float16, "cast to float16 and divided by N, summed, cast back: fp16_compress_hook"),
)})


def comm_hook(hook) -> CommHook:
    """`hook` if it is a CommHook, else the registered hook of that name (a ValueError lists them)."""
    if isinstance(hook, CommHook):
        return hook
    found = COMM_HOOKS.get(hook) if isinstance(hook, str) else None
    if found is None:
        raise ValueError(f"comm_hook={hook!r}; use one of {tuple(COMM_HOOKS)} or a pipelib CommHook")
    return found
