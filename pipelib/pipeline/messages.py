"""One pipeline step's messages: which receives each rank's actions wait for, and `StepMessages`,
which posts them, takes them and sends (`pipelib.pipeline.executor` builds one per step).

Under gloo's rules messages carry a tag per (kind, sending stage): activations and gradients
travel in separate queues, so V schedules (ZB-V, DualPipeV), whose activations and gradients
between two ranks are interleaved differently on the two sides, need no reordering
(validate(order="kind")), and receives are posted `ahead` of the action that needs them.

Under NCCL's rules (`pipelib.runtime.matching`: on cuda, or asked for on gloo) there are no tags:
messages from a peer are matched in the order that peer sends them. So a rank takes its
messages from each peer in the peer's send order (`send_order`, worked out from the schedule):
to get the one an action needs it receives, and keeps, any that peer sent before it. And it posts
each receive just before the compute that needs it and waits it at once (as torch's pipelining
does): a receive left outstanding would hold back this rank's next send to that peer on NCCL's
stream, the receive-before-send pair that deadlocks.

Introduced in chapter 10; the orders of V schedules in chapter 13.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.distributed as dist

from pipelib.comm import p2p as comms
from pipelib.pipeline.schedules import Op, Schedule
from pipelib.runtime.device import current


def message_tag(kind: str, from_stage: int) -> int:
    """One message queue per (kind, sending stage): act from s -> 2s, grad from s -> 2s+1."""
    return 2 * from_stage + (1 if kind == "grad" else 0)


class Receive(NamedTuple):
    """A message one action waits for: its index in the rank's actions, what, from where."""

    index: int
    kind: str           # "act" or "grad"
    from_stage: int
    src: int            # the sending rank (in the schedule's group)
    tag: int
    label: str          # e.g. "act for 2F3", on the trace and the activity beacon


@functools.lru_cache(maxsize=64)
def receives_of(s: Schedule, rank: int) -> tuple[Receive, ...]:
    """Every remote receive of `rank`'s actions, in action order: worked out once per schedule,
    not at every step (a training loop runs the same schedule thousands of times)."""
    out = []
    for i, a in enumerate(s.actions[rank]):
        need = remote_input(s, rank, a)
        if need:
            kind, from_stage = need
            out.append(Receive(i, kind, from_stage, s.stage_to_rank[from_stage],
                             message_tag(kind, from_stage), f"{kind} for {a}"))
    return tuple(out)


def remote_input(s: Schedule, rank: int, a) -> tuple[str, int] | None:
    """(kind, from_stage) of the message action `a` waits for, or None (no input, or local)."""
    if a.op is Op.F and a.stage > 0 and s.stage_to_rank[a.stage - 1] != rank:
        return "act", a.stage - 1
    if a.op in (Op.B, Op.I) and a.stage < s.num_stages - 1 and s.stage_to_rank[a.stage + 1] != rank:
        return "grad", a.stage + 1
    return None


@functools.lru_cache(maxsize=64)
def send_order(s: Schedule, src: int, dst: int) -> tuple[tuple, ...]:
    """The messages rank `src` sends to rank `dst` in one step, in the order it sends them: each
    (kind, sending stage, microbatch). NCCL matches messages between two ranks in this order."""
    out = []
    for a in s.actions[src]:
        if a.op is Op.F and a.stage < s.num_stages - 1 and s.stage_to_rank[a.stage + 1] == dst:
            out.append(("act", a.stage, a.microbatch))
        elif a.op in (Op.B, Op.I) and a.stage > 0 and s.stage_to_rank[a.stage - 1] == dst:
            out.append(("grad", a.stage, a.microbatch))
    return tuple(out)


# ----------------------------------------------------------------------------- one step's messages
class StepMessages:
    """This rank's messages during one step (`execute` builds one per step).

    Receives are posted in action order, `ahead` beyond the one an action needs, so their bytes
    flow while this rank computes; `take` blocks just before the compute that needs its input;
    `give` sends without blocking (handles kept in `sends` until the step ends) or hands the
    tensor to a neighbouring stage on this rank (`local`).
    """

    __slots__ = ("s", "rank", "group", "peer", "in_spec", "out_spec", "bufs", "ahead", "check",
                 "acts", "remote", "posted", "done", "local", "sends", "ordered", "by_key", "next", "early")

    def __init__(self, s: Schedule, rank: int, group, in_spec, out_spec, bufs: dict,
                 ahead: int, check: bool):
        self.s, self.rank, self.group, self.ahead, self.check = s, rank, group, ahead, check
        # group ranks -> global ranks once per step; comms' per-message peer checks are then
        # skipped (post_send/post_recv): the schedule was validated and the group size checked
        self.peer = {r: r if group is None else dist.get_global_rank(group, r)
                     for r in range(s.num_ranks) if r != rank}
        self.in_spec, self.out_spec, self.bufs = in_spec, out_spec, bufs
        self.acts, self.remote = s.actions[rank], receives_of(s, rank)
        self.posted: dict[tuple, comms.Handle] = {}  # (kind, from_stage, microbatch) -> receive posted
        self.done = 0                                # entries of `remote` whose receive was taken
        self.local: dict[tuple, torch.Tensor] = {}   # (kind, from_stage, microbatch) -> handed over here
        self.sends: list[comms.Handle] = []
        self.ordered = current().matching.by_order   # NCCL's rules: in each sender's order, no tags
        if self.ordered:
            self.by_key = {self._key(r): r for r in self.remote}
            self.next = dict.fromkeys(self.peer, 0)  # per sending rank: messages taken so far
            self.early: dict[tuple, torch.Tensor] = {}  # sent before the one an action needed

    def _key(self, r: Receive) -> tuple:
        return r.kind, r.from_stage, self.acts[r.index].microbatch

    def _buffer(self, r: Receive) -> torch.Tensor:
        """Receive `r`'s buffer, made once and kept between steps."""
        key = self._key(r)
        buf = self.bufs.get(key)
        if buf is None:
            a = self.acts[r.index]
            shape, dtype = self.in_spec[a.stage] if r.kind == "act" else self.out_spec[a.stage]
            buf = self.bufs[key] = torch.empty(shape, dtype=dtype, device=current().torch_device)
        return buf

    def post(self, extra: int) -> None:
        """Post the receives of `remote` up to `extra` beyond those taken (each once, in order);
        under NCCL's rules none ahead (module docstring)."""
        n = 0 if self.ordered else min(self.done + extra, len(self.remote))
        while len(self.posted) + self.done < n:
            r = self.remote[len(self.posted) + self.done]
            self.posted[self._key(r)] = comms.post_recv(
                self._buffer(r), self.peer[r.src], self.group, r.tag, r.label,
                {"stage": r.from_stage, "microbatch": self.acts[r.index].microbatch}, self.check)

    def take(self, kind: str, from_stage: int, a) -> torch.Tensor:
        """The input `a` needs: handed over locally, or received (blocking here, just before a)."""
        key = (kind, from_stage, a.microbatch)
        if self.s.stage_to_rank[from_stage] == self.rank:
            return self.local.pop(key)
        if self.ordered:
            return self._in_send_order(key)
        self.post(1 + self.ahead)  # this receive, and the next ones while we compute
        self.done += 1  # the beacon reads e.g. "act for 2F3: recv from rank 1 (...), waiting"
        return self.posted.pop(key).wait()

    def _in_send_order(self, key: tuple) -> torch.Tensor:
        """Message `key`, received after every message its sender sent before it (kept for the
        actions that need them), each posted and waited in turn."""
        got = self.early.pop(key, None)
        if got is not None:
            return got
        src = self.s.stage_to_rank[key[1]]
        order, i = send_order(self.s, src, self.rank), self.next[src]
        while True:
            k, r = order[i], self.by_key[order[i]]
            i += 1
            got = comms.post_recv(self._buffer(r), self.peer[src], self.group, 0, r.label,
                                  {"stage": r.from_stage, "microbatch": k[2]}, self.check).wait()
            if k == key:
                self.next[src] = i
                return got
            self.early[k] = got

    def give(self, kind: str, from_stage: int, microbatch: int, tensor: torch.Tensor) -> None:
        """Send `tensor` to the stage it is for (s+1 for "act", s-1 for "grad"), or hand it over."""
        dst = self.s.stage_to_rank[from_stage + (1 if kind == "act" else -1)]
        if dst == self.rank:
            self.local[kind, from_stage, microbatch] = tensor
        else:
            self.sends.append(comms.post_send(
                tensor, self.peer[dst], self.group, message_tag(kind, from_stage), kind,
                {"stage": from_stage, "microbatch": microbatch}, self.check))
