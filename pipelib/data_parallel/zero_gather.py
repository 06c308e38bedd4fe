"""ZeRO-3's gathering: parameters all-gathered before use, freed after, and prefetched.

Stage 3 keeps only a shard of every unit's parameters. A forward pre-hook gathers the unit(s) a
module uses, a forward hook frees them (unless `reshard_after_forward=False`) and puts a hook on
the module's output, which gathers them again when the output's gradient arrives in backward;
`ZeRO._reduce_unit` frees them once their gradients are reduce-scattered.

**Prefetch** (``prefetch=True``), as FSDP2 and DeepSpeed do: when module i starts (forward) the
all-gather of module i+1's units is issued at once, so it runs while module i computes; in
backward, when module i's output gradient arrives, module i-1's gather is issued. The order is
the forward order of the modules, relearned at every forward (the registration order before the
first one; FSDP1 records it at the first iteration too; FSDP2 asks for it explicitly with
`set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`). A prefetched unit is
held beside the current one: the working set is two units, not one.

On a simulated device with the virtual clock the prefetched all-gather runs on a second lane
(`Device.lane`, chapter 07's communication stream): it starts at max(lane free, now), its ring
messages are timed on that lane, and the compute clock waits for its end only where the unit is
used (a RECV_WAIT event, "wait all-gather", where it sits idle); a collective of the compute lane
(a reduce-scatter) waits for the lane's gather in flight, since both would share one link. On
a real device the prefetch is the same all-gather issued early, on the compute thread (nothing
overlaps there).

`PassTimer` times a forward or a backward in laps, as chapter 07's `BackwardTimer`: each hook
first charges the compute done since the last lap (the roofline time of the FLOPs counted,
one COMPUTE event), then communicates on the compute lane, so that a layer's gather and its
compute are drawn in the order they happen and a prefetch knows when compute got there.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch

from pipelib.comm import collectives as C
from pipelib.runtime.clocks import VirtualClock
from pipelib.runtime.measured import stream_synchronize
from pipelib.trace import Kind


class PassTimer:
    """One forward or backward of a ZeRO model, timed in laps (`ZeRO.timed`)."""

    def __init__(self, zero, label: str):
        self.zero, self.dev, self.label = zero, zero.dev, label
        self.counter, self.done = None, 0

    def __enter__(self):
        if self.dev.modelled:
            from torch.utils.flop_counter import FlopCounterMode

            self.counter = FlopCounterMode(display=False)
            self.counter.__enter__()
        self.mark = self.dev.clock.now()
        self.zero.timer = self
        return self

    def lap(self) -> None:
        """Charge the compute since the last lap (simulated: its roofline time) as one event."""
        dev = self.dev
        if self.counter is not None:
            flops = self.counter.get_total_flops()
            dev.clock.advance(dev.profile.compute_time(flops - self.done))
            self.done = flops
        stream_synchronize(dev)  # on cuda: this pass's kernels so far done, not only queued
        now = dev.clock.now()
        if now > self.mark:
            dev.tracer.record(Kind.COMPUTE, self.label, self.mark, now, memory=dev.memory_now())
        self.mark = now

    def resume(self) -> None:
        """Compute starts again now (after communication on the compute lane)."""
        self.mark = self.dev.clock.now()

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.lap()
        finally:
            self.zero.timer = None
            if self.counter is not None:
                self.counter.__exit__(exc_type, exc, tb)
        return False


class ZeROGather:
    """The stage-3 half of `pipelib.data_parallel.zero.ZeRO` (needs .units, .uses, .dev, .group)."""

    def _setup_gather(self, prefetch: bool, reshard_after_forward: bool) -> None:
        self.prefetch, self.reshard_after_forward = bool(prefetch), bool(reshard_after_forward)
        self.timer = None
        self._order = list(self.uses)   # modules in forward order (relearned every forward)
        self._seen = []
        self._lane_free = 0.0           # simulated: when the prefetch lane's last gather ends
        self._ready_at = {}             # id(unit) -> simulated end of its prefetched gather
        # bytes of unsharded units held now (stage 3 frees them all next) and the most held at once
        self.gathered_now, self.gathered_peak = sum(u.nbytes for u in self.units if u.gathered), 0

    def timed(self, label: str) -> PassTimer:
        """``with zero.timed("F"): loss = ...``: time the pass in laps around ZeRO's own
        communication (what `zero_train` does); without it nothing is timed by ZeRO."""
        return PassTimer(self, label)

    def _lap(self) -> None:
        if self.timer is not None:
            self.timer.lap()

    def _resume(self) -> None:
        if self.timer is not None:
            self.timer.resume()

    @property
    def _simulated(self) -> bool:
        return self.dev.modelled and self.dev.clock.virtual

    def _gather(self, u, prefetch: bool = False) -> None:
        if u.gathered:
            return
        self._account("parameters", u.nbytes, f"parameters of {u.name}")
        self.gathered_now += u.nbytes
        self.gathered_peak = max(self.gathered_peak, self.gathered_now)
        self._comm(u.nbytes)
        label = f"{'prefetch' if prefetch else 'all_gather'} {u.name}"
        if prefetch and self._simulated:
            lane = VirtualClock(max(self._lane_free, self.dev.clock.now()))
            with self.dev.lane(lane):  # the ring's messages and events timed on the second lane
                full = C.all_gather(u.mine, group=self.group, label=label)
            self._lane_free = self._ready_at[id(u)] = lane.now()
        else:
            self._link_free()
            full = C.all_gather(u.mine, group=self.group, label=label)
        u.restore(full)
        self._comm(-u.nbytes)

    def _wait(self, u) -> None:
        """The compute lane waits for `u`'s prefetched gather (idle time: a RECV_WAIT event)."""
        end = self._ready_at.pop(id(u), None)
        if end is None:
            return
        start = self.dev.clock.now()
        self.dev.clock.wait_until(end)
        if self.dev.clock.now() > start:
            self.dev.tracer.record(Kind.RECV_WAIT, "wait all-gather", start, self.dev.clock.now())

    def _link_free(self) -> None:
        """One link: a collective on the compute lane starts after the prefetch lane's gather in
        flight (the simulated link has no contention model, so two lanes must not share it)."""
        if self.prefetch and self._simulated and self._lane_free > self.dev.clock.now():
            start = self.dev.clock.now()
            self.dev.clock.wait_until(self._lane_free)
            self.dev.tracer.record(Kind.RECV_WAIT, "wait link", start, self.dev.clock.now())

    def _free(self, u) -> None:
        self._ready_at.pop(id(u), None)
        freed = u.release()
        self.gathered_now -= freed
        self._account("parameters", -freed)

    def _use(self, mod, step: int) -> None:
        """Gather what `mod` uses (waiting for a prefetch), then prefetch the next module's units
        (`step` +1 in forward, -1 in backward), all between two laps of the pass's timer."""
        self._lap()
        for u in self.uses[mod]:
            self._wait(u)
            self._gather(u)
        if self.prefetch:
            order = self._order
            i = order.index(mod) + step if mod in order else -1
            if 0 <= i < len(order):
                for u in self.uses[order[i]]:
                    self._gather(u, prefetch=True)
        self._resume()

    def _pre_forward(self, mod, args):
        self._seen.append(mod)
        self._use(mod, +1)

    def _post_forward(self, mod, args, out):
        if self.reshard_after_forward:
            for u in self.uses[mod]:
                self._free(u)
        outs = [out] if torch.is_tensor(out) else [o for o in out if torch.is_tensor(o)] \
            if isinstance(out, (tuple, list)) else []
        t = next((o for o in outs if o.requires_grad), None)
        if t is not None:  # its gradient arrives just before this module's backward runs
            t.register_hook(lambda g, mod=mod: self._use(mod, -1))

    def _forward_done(self) -> None:
        """The forward order just seen becomes the prefetch order."""
        if self._seen:
            self._order = list(dict.fromkeys(self._seen))
        self._seen = []
