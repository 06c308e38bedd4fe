"""ZeRO's bytes: measured from the tensors a rank holds, accounted on the device as differences.

`ZeRO.memory()` measures what this rank holds now, by category, from the tensors themselves
(each storage counted once). The device's tracker (`pipelib.runtime.memtrack`) hears about it
as *changes* (`_account`): ZeRO remembers what it has added to each category and adds only the
difference when it measures again, so whatever else the tracker holds stays as it was. When
ZeRO wraps a module whose parameters the tracker already counts (a pipeline stage tracked
with `track_module`), the first measurement replaces those full parameters by ZeRO's shards
and buffers. Nothing here resets the tracker or its counters (DESIGN.md section 7): the
runner opens a `Device.measure()` scope around a run.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch

CATEGORIES = ("parameters", "gradients", "optimizer", "buffers")


def _tracked_bytes(tracker, params) -> int:
    """Bytes of `params` whose storage the tracker counts among its parameters
    (`MemoryTracker.track_module` remembers their storages)."""
    ptrs = getattr(tracker, "_param_ptrs", None) or ()
    return sum(p.numel() * p.element_size() for p in params if p.untyped_storage().data_ptr() in ptrs)


def _storage_bytes(ts) -> int:
    seen = {}
    for t in ts:
        if t is not None:
            st = t.untyped_storage()
            seen[st.data_ptr() if st.nbytes() else id(t)] = st.nbytes()
    return sum(seen.values())


class ZeROMemory:
    """The memory half of `pipelib.data_parallel.zero.ZeRO` (needs .dev, .units, .optimizer)."""

    def _start_accounting(self, model: torch.nn.Module) -> None:
        """Before the parameters move into flat buffers: what ZeRO takes over on the tracker
        (the trainable parameters, if it counts them), and the bytes ZeRO added so far (none)."""
        self._held = dict.fromkeys(CATEGORIES, 0)
        self._held["parameters"] = _tracked_bytes(self.dev.memory, [p for p in model.parameters()
                                                                    if p.requires_grad])
        self.comm_bytes_now = self.comm_peak = 0

    def _account(self, category: str, nbytes: int, what: str = "") -> None:
        """Tell the device's tracker that ZeRO holds `nbytes` more (or less) of `category`
        (an increase may raise a simulated out-of-memory error naming `what`)."""
        if nbytes:
            self.dev.memory.add(category, nbytes, what or category)
            self._held[category] += nbytes

    def _comm(self, nbytes: int) -> None:
        """Count a communication buffer allocated (+) or dropped (-)."""
        self._account("buffers", nbytes, "communication buffer")
        self.comm_bytes_now += nbytes
        self.comm_peak = max(self.comm_peak, self.comm_bytes_now)

    def memory(self) -> dict:
        """Bytes this rank holds now, by category, measured from the tensors themselves (each
        storage counted once): parameters (the units' buffers and shards; frozen parameters are
        the model's, not ZeRO's), gradients, optimizer (its state tensors, plus the fp32 master
        weights in mixed precision), comm buffers (the all-gather outputs and flattened
        gradients this wrapper allocates: now, peak) and the ring's scratch chunks kept on the
        device (`pipelib.comm.ring`, shared by every collective)."""
        units = self.units
        params = [u.flat for u in units] + [getattr(u, "mine", None) for u in units]
        grads = [getattr(u, "gflat", None) for u in units] + [getattr(u, "gshard", None) for u in units]
        grads += [p.grad for u in units for _, p in u.params] + [u.master.grad for u in units]
        state = [v for st in self.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        masters = [u.master for u in units] if self.mixed else []
        return {"parameters": _storage_bytes(params), "gradients": _storage_bytes(grads),
                "optimizer": _storage_bytes(state + masters),
                "comm buffers": self.comm_bytes_now, "comm peak": self.comm_peak,
                "ring scratch": _storage_bytes(self.dev.scratch.values())}

    def sync_memory(self) -> dict:
        """Measure (`memory`) and account the change of each category since the last time on
        the device's tracker (may raise a simulated out-of-memory error)."""
        m = self.memory()
        name = type(self.optimizer).__name__
        for category, what in (("parameters", "parameters"), ("gradients", "gradients"),
                               ("optimizer", f"optimizer state ({name})")):
            self._account(category, m[category] - self._held[category], what)
        return m
