"""How a rank's backend matches point-to-point messages: by tag (gloo) or by order (NCCL).

gloo pairs a receive with the send of the same (peer, tag), and its non-blocking sends and
receives between two ranks are independent: a receive posted before a send to the same peer
waits for nothing. NCCL differs in three ways that gloo hides (../shared/reviews, C8, C9):

- it ignores tags: messages between two ranks are matched in the order they are posted;
- its unbatched sends and receives between two ranks run one after another on one stream, in
  posting order: a receive posted before a send to the same peer holds that send back, so two
  ranks that both do so wait for each other forever; an exchange must be posted as one batch
  (torch's `batch_isend_irecv`, which NCCL runs as one group call);
- a receive cannot look at a header before its payload is posted (both are just messages).

`MATCHING` is the registry of both rule sets. A `Device` follows one (`Device.matching`): "nccl"
on cuda always; on cpu and sim, "gloo" unless `DeviceSpec(matching="nccl")` or the environment
variable PIPELIB_P2P_MATCHING=nccl asks for NCCL's. Under "nccl" pipelib's point-to-point layer
(`pipelib.comm.p2p`) sends no tags, posts every exchange as one batch, and raises
`MatchingRuleError` for a receive-before-send pair on gloo too, so the hangs NCCL would give on a
GPU are errors on a laptop (CI runs the comm, pipeline, data-, tensor- and context-parallel tests
that way).

Introduced with issue 26 (CUDA and NCCL); chapter 05 names the rules.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

MATCHING_ENV = "PIPELIB_P2P_MATCHING"


@dataclass(frozen=True)
class Matching:
    """One backend's rules for point-to-point messages."""

    name: str
    by_order: bool  # True: no tags, exchanges batched, receive-before-send pairs refused
    text: str


MATCHING = MappingProxyType({
    "gloo": Matching("gloo", False, "by tag; a send and a receive to one peer are independent"),
    "nccl": Matching("nccl", True, "by posting order per pair of ranks, no tags; unbatched "
                                   "sends and receives to one peer run in posting order"),
})


def matching_for(kind: str, requested: str | None = None) -> str:
    """The rule set a device of `kind` follows: NCCL's on cuda; else `requested`, else the
    environment's PIPELIB_P2P_MATCHING, else gloo's. A ValueError names an unknown one."""
    name = requested if requested is not None else os.environ.get(MATCHING_ENV) or None
    if name is not None and name not in MATCHING:
        source = "matching" if requested is not None else MATCHING_ENV
        raise ValueError(f"{source}={name!r}: unknown point-to-point rules; use one of {tuple(MATCHING)}")
    if kind == "cuda":
        if name == "gloo" and requested is not None:
            raise ValueError("matching='gloo' on a cuda device: NCCL matches messages by order and "
                             "ignores tags; leave matching=None (NCCL's rules on cuda)")
        return "nccl"
    return name or "gloo"


class MatchingRuleError(RuntimeError):
    """A message pattern that NCCL would hang on (a receive-before-send pair to one peer)."""
