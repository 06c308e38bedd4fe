"""Memory is measured, not assumed: the bytes one rank holds, by category, against a capacity.

Every rank's `Device` holds a `MemoryTracker`. Parameters, gradients, optimizer state and
buffers are registered with it (`track_module`, `update_gradients`, `update_optimizer`); saved
activations are counted as autograd saves them, through
`torch.autograd.graph.saved_tensors_hooks`, and uncounted when their graph dies. A simulated
device has a capacity (its `DeviceProfile`'s memory) and raises `SimulatedOutOfMemoryError`
naming the rank, the need and the capacity; every compute op records the total in its trace
event, so a timeline can show memory rising during warm-up and falling in cool-down.

Introduced with the device in chapter 04; the pipeline chapters (10-13) read it to compare
GPipe's, 1F1B's and zero-bubble's activation memory with `pipelib.memory`'s prediction.
"""
from __future__ import annotations

import contextlib
import functools


class SimulatedOutOfMemoryError(RuntimeError):
    """A rank needed more memory than its simulated device has."""

    def __init__(self, rank: int, what: str, need: int, capacity: int, breakdown: dict):
        self.rank, self.need, self.capacity, self.breakdown = rank, need, capacity, dict(breakdown)
        parts = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in breakdown.items() if v)
        digits = 2  # enough to tell the need from the capacity (a need just over it would read the same)
        while round(need / 2**20, digits) == round(capacity / 2**20, digits) and digits < 6:
            digits += 1
        super().__init__(
            f"rank {rank}: simulated out of memory while allocating {what}: needs "
            f"{need / 2**20:.{digits}f} MiB but the device holds {capacity / 2**20:.{digits}f} MiB ({parts}). "
            f"Use a smaller batch or more microbatches, shard with ZeRO, recompute activations, "
            f"or choose a profile with more memory."
        )


class MemoryTracker:
    """Bytes held on one rank by category; checks a capacity on every increase."""

    CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")

    def __init__(self, rank: int = 0, capacity: int | None = None, track_activations: bool = True):
        self.rank, self.capacity, self.track_activations = rank, capacity, track_activations
        self.bytes = dict.fromkeys(self.CATEGORIES, 0)
        self.peak = 0
        self._storages: dict[int, list] = {}  # storage ptr -> [refcount, nbytes]
        self._param_ptrs: set[int] = set()
        self._param_storages: set[int] = set()  # parameters' storages by identity (kept across resize_)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def add(self, category: str, nbytes: int, what: str = "") -> None:
        if category not in self.bytes:
            raise ValueError(f"unknown memory category {category!r}; use one of {self.CATEGORIES}")
        new_total = self.total + nbytes
        if nbytes > 0 and self.capacity is not None and new_total > self.capacity:
            after = {**self.bytes, category: self.bytes[category] + nbytes}
            raise SimulatedOutOfMemoryError(self.rank, what or category, new_total, self.capacity, after)
        self.bytes[category] += nbytes
        self.peak = max(self.peak, self.total)

    def set(self, category: str, nbytes: int, what: str = "") -> None:
        self.add(category, nbytes - self.bytes[category], what)

    def reset_peak(self) -> None:
        self.peak = self.total

    # -- parameters, gradients, optimizer state
    def track_module(self, *modules) -> None:
        """Count the parameters and buffers of `modules` (replacing what was tracked before).

        Their storages are remembered so that a saved view of a weight or of a buffer (a causal
        mask, say) is not counted again as an activation.
        """
        params = [p for m in modules for p in m.parameters()]
        buffers = [b for m in modules for b in m.buffers()]
        self._param_ptrs = {t.untyped_storage().data_ptr() for t in [*params, *buffers]}
        self._param_storages = {t.untyped_storage()._cdata for t in [*params, *buffers]}
        self.set("parameters", sum(p.numel() * p.element_size() for p in params), "parameters")
        self.set("buffers", sum(b.numel() * b.element_size() for b in buffers), "buffers")

    def parameters_moved(self, *modules) -> None:
        """The parameters of `modules` now live in other storages (ZeRO's flat unit buffers, which
        the weights are views of): learn those, forget the old ones (freed, their addresses may
        come back as activations), so that a weight autograd saves is never counted as an
        activation. Bytes are unchanged: whoever moved them counts them. Storages are known by
        identity, which survives a resize (ZeRO-3's gathers), as well as by address."""
        tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
        self._param_ptrs = {t.untyped_storage().data_ptr() for t in tensors}
        self._param_storages = {t.untyped_storage()._cdata for t in tensors}

    def update_gradients(self, module) -> None:
        self.set("gradients", sum(p.grad.numel() * p.grad.element_size() for p in module.parameters()
                                  if p.grad is not None), "gradients")

    def update_optimizer(self, optimizer) -> None:
        import torch

        n = sum(v.numel() * v.element_size() for st in optimizer.state.values()
                for v in st.values() if isinstance(v, torch.Tensor))
        self.set("optimizer", n, "optimizer state")

    # -- saved activations
    def saved_activations(self):
        """Count tensors autograd saves for backward (unique storages, parameters excluded).

        A context manager: every tensor autograd saves inside it is packed into a `_Saved`,
        which adds its storage's bytes when the first saved tensor of that storage appears and
        takes them off when the last one is freed (when its graph dies). With
        track_activations=False (real devices unless asked: `DeviceSpec.track_memory`) it does
        nothing: the hooks cost a Python call per saved tensor, 4% of a CPU pipeline step."""
        import torch

        if not self.track_activations:
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(functools.partial(_Saved, self), _Saved.unpack)


class _Saved:
    """One tensor saved for backward, counted on a `MemoryTracker` while it lives.

    It runs once per saved tensor (a dozen per stage forward): one class for every tracker,
    not a class made per forward."""

    __slots__ = ("t", "key", "tracker")

    def __init__(self, tracker: MemoryTracker, t):
        # Keep a detached alias: same storage, no grad_fn. Keeping `t` itself makes a cycle
        # when autograd saves a node's own output (t -> grad_fn -> this -> t), and with
        # retain_graph (zero-bubble I/W) the activation would outlive its graph until the
        # garbage collector ran.
        self.t, self.key, self.tracker = t.detach(), None, tracker
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or ptr in tracker._param_ptrs or st._cdata in tracker._param_storages:
            return
        entry = tracker._storages.get(ptr)
        if entry is None:
            tracker.add("activations", nbytes, f"saved activation {tuple(t.shape)}")
            tracker._storages[ptr] = [1, nbytes]
        else:
            entry[0] += 1
        self.key = ptr

    def unpack(self):
        return self.t

    def __del__(self):
        if self.key is not None:
            storages = self.tracker._storages
            entry = storages.get(self.key)
            if entry is not None:
                entry[0] -= 1
                if entry[0] == 0:
                    del storages[self.key]
                    self.tracker.bytes["activations"] -= entry[1]
