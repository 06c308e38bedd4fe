"""Measuring a recomputation policy on the tiny GPT: bytes kept, peak, FLOPs, memory over time.

    m = measure_policy(GPTConfig(n_layer=4), "selective", batch=4)
    m.kept_bytes, m.peak_bytes, m.forward_flops, m.backward_flops, m.grads, m.samples

One forward (with the loss) and one backward of a freshly built GPT under `apply_recompute`,
with the saved activations counted by a `pipelib.runtime.memtrack.MemoryTracker` (the device's
meter: unique storages, parameters and buffers excluded, freed when their graph dies) and the
matmul FLOPs by torch's own formulas (`torch.utils.flop_counter`). A dispatch mode, `OpClock`,
notes after every op the FLOPs so far and the bytes held: memory over "time", where time is
compute done, so a policy's rerun shows as a longer backward with a bump in memory.

Chapter 14.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from pipelib.batches import global_batch
from pipelib.checks import check_int
from pipelib.model import GPT
from pipelib.recompute.policies import apply_recompute
from pipelib.runtime.memtrack import MemoryTracker
from pipelib.runtime.place import rng_devices


class OpClock(TorchDispatchMode):
    """After each aten op: (matmul FLOPs so far, saved-activation bytes held, phase)."""

    def __init__(self, tracker: MemoryTracker):
        super().__init__()
        self.tracker, self.flops, self.phase = tracker, 0, "forward"
        self.samples: list[tuple[int, int, str]] = [(0, 0, "forward")]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.flops += int(count(*args, **kwargs, out_val=out))
        self.samples.append((self.flops, self.tracker.bytes["activations"], self.phase))
        return out


@dataclass
class PolicyRun:
    """What one step under a policy did (bytes are saved activations only)."""

    policy: str
    k: int | None
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    kept_bytes: int          # held at the end of the forward
    peak_bytes: int          # the most held at any moment of forward and backward
    forward_flops: int
    backward_flops: int      # the rerun forwards happen here
    samples: list = field(repr=False, default_factory=list)

    @property
    def flops(self) -> int:
        return self.forward_flops + self.backward_flops


def measure_policy(cfg, policy: str = "none", k: int | None = None, batch: int = 4,
                   seq: int | None = None, *, model_seed: int = 0, batch_seed: int = 0,
                   dropout_seed: int = 0, dtype=torch.float32, capacity: int | None = None,
                   model=None) -> PolicyRun:
    """One training step of `GPT(cfg)` under `policy`, measured (module docstring).

    `capacity` (bytes) gives the tracker a simulated device's limit for the whole step:
    parameters, gradients and saved activations; going over raises `SimulatedOutOfMemoryError`.
    `model` (built from cfg if None) lets a caller pass one already set up."""
    check_int(batch, "batch", context="measure_policy", hint="rows of the batch")
    if seq is not None:
        check_int(seq, "seq", context="measure_policy", hint=f"tokens per row, at most block_size={cfg.block_size}")
    model = (model or GPT(cfg, seed=model_seed).to(dtype))
    apply_recompute(model, policy, k)
    seq = cfg.block_size if seq is None else seq
    idx, targets = global_batch(cfg, batch, 0, batch_seed, seq_len=seq)
    tracker = MemoryTracker(capacity=capacity)
    tracker.track_module(model)
    clock = OpClock(tracker)
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=rng_devices()):
        torch.manual_seed(dropout_seed)
        with clock:
            with tracker.saved_activations():
                _, loss = model(idx, targets)
            kept, fwd = tracker.bytes["activations"], clock.flops
            clock.samples.append((fwd, kept, "forward"))  # the loss's own saves, packed last
            tracker.reset_peak()
            clock.phase = "backward"
            loss.backward()
            tracker.update_gradients(model)
    peak = max(b for _, b, _ in clock.samples)
    grads = {n: p.grad for n, p in model.named_parameters()}
    return PolicyRun(policy, k, loss.detach(), grads, kept, max(peak, kept), fwd,
                     clock.flops - fwd, clock.samples)


def bitwise_equal(a: dict, b: dict) -> bool:
    """Same names, and every tensor equal bit for bit (torch.equal)."""
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def max_abs_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over every tensor of two gradient dicts."""
    return max(float((a[n] - b[n]).abs().max()) for n in a)
