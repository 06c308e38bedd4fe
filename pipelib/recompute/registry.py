"""One entry per recomputation policy: how it changes the model, its formula, torch's twin.

    info = policy_info("every_k")
    info.segment_length(None, num_blocks=9)      # 3: Chen et al.'s sqrt(n)
    info.apply(model, blocks, 3, "every_k")      # pipelib.recompute.policies.rerun_segments
    info.predict(cfg, 4, 64, 3)                  # PolicyCost: kept, peak bytes, extra FLOPs
    info.twin(model, blocks, 3, "every_k")       # the same with torch.utils.checkpoint

A `PolicyInfo` holds what a policy's name decides: which k it runs with (none for ``none`` and
``selective``, 1 for ``full``, any for ``every_k``), how it changes the unaware model (`apply`,
`pipelib.recompute.policies`), its prediction of saved bytes and extra FLOPs (`predict`,
`pipelib.recompute.formulas`) and torch's own checkpoint applied the same way (`twin`,
`pipelib.recompute.against_torch`; `sac=True` gives the selective policy through torch's
selective activation checkpoint API instead). This module is the only place where a policy's
name is compared or mapped (a test greps the rest of pipelib): a new policy is its functions,
one entry below, and its tests.

Pure: `apply` and `twin` import torch when called. Chapter 14.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from types import MappingProxyType

from pipelib.checks import check_int
from pipelib.memory import check_activation_args
from pipelib.recompute import formulas


def _later(module: str, name: str) -> Callable:
    """`module.name`, imported when first called (it needs torch)."""
    def call(*args, **kw):
        return getattr(import_module(f"pipelib.recompute.{module}"), name)(*args, **kw)

    call.__name__ = call.__qualname__ = name
    call.__module__ = f"pipelib.recompute.{module}"
    return call


def chen_k(num_blocks: int) -> int:
    """Chen et al.'s segment length for n blocks: round(sqrt(n)), at least 1."""
    check_int(num_blocks, "num_blocks", context="chen_k", hint="blocks in the model or stage")
    return max(1, round(math.sqrt(num_blocks)))


@dataclass(frozen=True)
class PolicyInfo:
    """What pipelib knows about one recomputation policy (module docstring)."""

    name: str
    apply: Callable      # (model, blocks, k, name) -> None: the model changed in place
    predict: Callable    # (cfg, batch, seq, k, itemsize, mask_bytes) -> (kept, peak bytes, extra FLOPs)
    twin: Callable       # (model, blocks, k, name, sac=False) -> None: torch's checkpoint, the same way
    fixed_k: int | None = None        # the segment length it always runs with (full: 1)
    chooses_k: bool = False           # takes any k >= 1 (every_k; default Chen's sqrt(n))
    keeps_all: bool = False           # changes nothing (none): fine on a module without blocks

    def segment_length(self, k=None, num_blocks: int | None = None) -> int | None:
        """The k the policy runs with on `num_blocks` blocks; a ValueError naming a bad k."""
        if not self.chooses_k:
            if k is not None:
                raise ValueError(f"policy {self.name!r} takes no k (got k={k!r}); k is for 'every_k' "
                                 f"('full' is every_k with k=1)")
            return self.fixed_k
        if k is None:
            return chen_k(num_blocks or 1)
        return check_int(k, "k", context=f"policy {self.name!r} on {num_blocks or '?'} blocks",
                         hint="blocks per recomputed segment; k=1 is 'full', k=round(sqrt(n)) is "
                              "Chen et al.'s plan")

    def cost(self, cfg, batch: int, seq: int, k=None, itemsize: int = 4,
             mask_bytes: int | None = None) -> formulas.PolicyCost:
        """`predict` with the k the formulas need: given for every_k (no default), 1 for full,
        none (ignored) for the others."""
        k = self.fixed_k if self.fixed_k is not None else k if self.chooses_k else None
        if self.chooses_k:
            k = check_int(k, "k", context=f"policy {self.name!r}", hint="blocks per recomputed segment")
        return formulas.PolicyCost(self.name, k, *self.predict(cfg, batch, seq, k, itemsize, mask_bytes))


REGISTRY: MappingProxyType[str, PolicyInfo] = MappingProxyType({info.name: info for info in (
    PolicyInfo("none", _later("policies", "keep_all"), formulas.keep_all_cost,
               _later("against_torch", "torch_keep_all"), keeps_all=True),
    PolicyInfo("full", _later("policies", "rerun_segments"), formulas.segments_cost,
               _later("against_torch", "torch_checkpoint_segments"), fixed_k=1),
    PolicyInfo("every_k", _later("policies", "rerun_segments"), formulas.segments_cost,
               _later("against_torch", "torch_checkpoint_segments"), chooses_k=True),
    PolicyInfo("selective", _later("policies", "rerun_core"), formulas.selective_cost,
               _later("against_torch", "torch_checkpoint_core")),
)})

POLICIES: tuple[str, ...] = tuple(REGISTRY)


def policy_info(policy: str) -> PolicyInfo:
    """The registry entry for `policy`; a ValueError lists the names."""
    info = REGISTRY.get(policy) if isinstance(policy, str) else None
    if info is None:
        raise ValueError(f"unknown recomputation policy {policy!r}; choose one of {POLICIES}")
    return info


def predict_policy(cfg, batch: int, seq: int, policy: str, k: int | None = None,
                   itemsize: int = 4, mask_bytes: int | None = None) -> formulas.PolicyCost:
    """The prediction for the whole tiny GPT, forward with loss then backward (module doc):
    `policy_info(policy).cost(...)`."""
    check_activation_args("predict_policy", batch, seq, itemsize, mask_bytes)
    if getattr(cfg, "flash", False):
        raise ValueError("predict_policy counts the written-out attention; got a config with "
                         "flash=True, whose core is one fused kernel (its CPU kernel is not in "
                         "torch's FLOP counter either): use flash=False to compare")
    return policy_info(policy).cost(cfg, batch, seq, k, itemsize, mask_bytes)


def best_k(cfg, batch: int, seq: int, itemsize: int = 4, mask_bytes: int | None = None) -> int:
    """The segment length with the lowest predicted peak (Chen's sqrt(n) when I ~ L). It depends
    on L / I, so on what a block keeps: dropout's masks and matrices, fused attention."""
    peaks = {k: predict_policy(cfg, batch, seq, "every_k", k, itemsize, mask_bytes).peak_bytes
             for k in range(1, cfg.n_layer + 1)}
    return min(peaks, key=lambda k: (peaks[k], k))
