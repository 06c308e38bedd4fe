"""Timing and memory on a real device: `Device.compute`'s measured op, and the CUDA allocator.

`TimedOp` times one op on "cpu" by the wall clock, and on "cuda" by CUDA events on the current
stream: it waits for that stream up to the op's end only, never the whole device (a receive
posted on NCCL's stream must not be waited inside a compute op: it would deadlock a pipeline
whose sender waits for this rank), and what the stream ran before the op is not charged to it.

Memory on "cuda" comes from the allocator (`torch.cuda.memory_allocated`, and the peak of a
`Device.measure()` scope from `max_memory_allocated`): it includes what the tracker's bookkeeping
cannot see (allocator rounding, workspaces, temporaries), and not the CUDA context or NCCL's own
buffers. The tracker (`pipelib.runtime.memtrack`) still counts "the model's bytes" by category.
Nested scopes share the allocator's one peak counter: `allocator_peak_open`/`_close` fold it so
that an outer scope still sees an inner scope's peak.

Introduced with issue 26 (CUDA and NCCL).
"""
from __future__ import annotations

from pipelib.trace import Kind


def allocated_bytes(dev) -> int:
    """Bytes held now on `dev`: the CUDA allocator's on cuda, else the tracker's total."""
    if dev.kind == "cuda":
        import torch

        return torch.cuda.memory_allocated(dev.torch_device)
    return dev.memory.total


def stream_synchronize(dev) -> None:
    """On cuda, wait until the current stream has run what was queued on it (its GPU work done,
    not only launched); other streams, NCCL's among them, keep running. A no-op elsewhere."""
    if dev.kind == "cuda":
        import torch

        torch.cuda.current_stream(dev.torch_device).synchronize()


def allocator_reset(dev) -> None:
    """Start a new measurement of the allocator's peak (a no-op off cuda)."""
    if dev.kind == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(dev.torch_device)
        dev.allocator_peak = 0


def allocator_peak_open(dev) -> int | None:
    """At a scope's start: the peak seen so far by the scopes around it (None off cuda); the
    allocator's counter then starts again for this scope."""
    if dev.kind != "cuda":
        return None
    import torch

    seen = max(dev.allocator_peak, torch.cuda.max_memory_allocated(dev.torch_device))
    allocator_reset(dev)
    return seen


def allocator_peak_close(dev, seen: int | None) -> int | None:
    """At a scope's end: its own peak (None off cuda); the scopes around it keep the higher."""
    if seen is None:
        return None
    import torch

    mine = max(dev.allocator_peak, torch.cuda.max_memory_allocated(dev.torch_device))
    dev.allocator_peak = max(seen, mine)
    return mine


def compute_text(label: str, stage, microbatch) -> str:
    return (f"compute {label}" + (f" stage {stage}" if stage is not None else "")
            + (f" microbatch {microbatch}" if microbatch is not None else ""))


class TimedOp:
    """`Device.compute` on a real device: the op's wall-clock time, recorded once it ended (a
    class, not a generator: it runs around every F, B, I and W of a pipeline step)."""

    __slots__ = ("dev", "label", "stage", "microbatch", "before", "start", "events")

    def __init__(self, dev, label: str, stage, microbatch):
        self.dev, self.label, self.stage, self.microbatch = dev, label, stage, microbatch

    def __enter__(self):
        activity = self.dev.activity
        self.before = activity.text
        activity.set(compute_text(self.label, self.stage, self.microbatch))
        self.events = None
        if self.dev.kind == "cuda":  # CUDA events on the current stream: the op's own GPU time
            import torch

            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        self.start = self.dev.clock.now()
        return self.dev

    def __exit__(self, exc_type, exc, tb):
        dev = self.dev
        if exc_type is None:
            start, end = self.start, dev.clock.now()
            if self.events is not None:
                # wait for this stream up to the op's end only, not the whole device: a receive
                # posted ahead on NCCL's stream must not be waited here (it would deadlock a
                # pipeline whose sender waits for this rank), and what the stream ran before the
                # op is not charged to it
                self.events[1].record()
                self.events[1].synchronize()
                end = dev.clock.now()
                start = end - self.events[0].elapsed_time(self.events[1]) / 1e3
            dev.tracer.record(Kind.COMPUTE, self.label, start, end,
                              stage=self.stage, microbatch=self.microbatch, memory=allocated_bytes(dev))
        dev.activity.set(self.before)
        return False
