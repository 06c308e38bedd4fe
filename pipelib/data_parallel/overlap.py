"""Overlap: a communication stream beside the compute, and a backward that says when it is where.

A GPU runs a bucket's all-reduce on its own stream while backward goes on; DDP waits for every
bucket only before the optimizer step. Here the same two lanes, on every kind of device:

- `CommStream.launch(flat)` starts an all-reduce (sum) of a flat bucket and returns a `CommWork`
  at once; `CommStream.wait(work)` blocks the compute lane until it is done. With
  ``comm="gloo"`` the all-reduce is gloo's own (`dist.all_reduce(..., async_op=True)`); with
  ``comm="pipelib"`` it is chapter 06's ring (`pipelib.comm.collectives.all_reduce`).
- On a simulated device with the virtual clock the stream is a second clock: an all-reduce
  starts at max(stream free, now on the compute clock), runs pipelib's ring with that clock in
  the device's place (every message, wait and COLLECTIVE event is timed on it), and the
  compute clock does not move. `wait` moves the compute clock to the all-reduce's end; the
  time it sits idle there is a RECV_WAIT event ("wait all-reduce"): exposed communication.
  Both lanes land on one rank's trace, so the timeline shows all-reduces under backward.
  (gloo's all-reduce on a simulated device takes the alpha-beta time of the ring,
  `pipelib.comm.alphabeta.predicted_time`, and records no messages.)
- On a real device (``cpu``, ``cuda``) pipelib's ring runs on one worker thread, bucket after
  bucket in launch order (gloo's waits release Python's lock, so backward goes on meanwhile);
  gloo's runs on gloo's own threads. ``comm="gloo"`` names torch.distributed's built-in
  all-reduce: on ``cuda`` engines it is NCCL's, and the trace's labels name the backend.

`BackwardTimer` times backward in *laps*: a gradient hook calls `lap()` when a bucket is full,
which records the backward compute so far as one COMPUTE event "B" and, on a simulated device,
advances the compute clock to the roofline time of the FLOPs counted so far
(torch's FlopCounterMode, as `Device.compute` counts them). So a bucket becomes ready at the
time its last gradient was computed, not at the end of backward.

Introduced in chapter 07.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

import torch.distributed as dist

from pipelib.runtime.clocks import VirtualClock
from pipelib.runtime.measured import stream_synchronize
from pipelib.trace import Kind

COMMS = ("pipelib", "gloo")


def check_comm(comm, context: str = "DDP") -> str:
    if comm not in COMMS:
        raise ValueError(f"{context}: comm={comm!r}; use 'pipelib' (chapter 06's ring, traced message by "
                         f"message) or 'gloo' (torch.distributed's built-in all_reduce)")
    return comm


@dataclass
class CommWork:
    """One launched all-reduce: a gloo work, a future of the worker thread, or (simulated) the
    time the stream finishes it."""

    label: str
    end: float | None = None   # simulated: when the all-reduce finishes on the stream's clock
    handle: object = None      # gloo work or thread future
    done: bool = False


class CommStream:
    """The communication lane of one rank: launch all-reduces, wait for them before the step."""

    def __init__(self, dev, group, comm: str = "pipelib"):
        self.dev, self.group, self.comm = dev, group, check_comm(comm)
        self.n = dist.get_world_size(group)
        self.free_at = 0.0  # simulated: when the stream's last all-reduce ends
        self._pool = None

    @property
    def simulated(self) -> bool:
        return self.dev.modelled and self.dev.clock.virtual

    def launch(self, flat, label: str) -> CommWork:
        """Start summing `flat` over the group; returns at once (on the compute lane)."""
        work = CommWork(label)
        if self.simulated:
            lane = VirtualClock(max(self.free_at, self.dev.clock.now()))
            with self.dev.lane(lane):  # the ring's messages, waits and events are timed on the stream
                self._all_reduce(flat, label, lane)
            work.end = self.free_at = lane.now()
            work.done = True
        elif self.comm == "gloo":
            t0 = self.dev.clock.now()
            work.handle = (dist.all_reduce(flat, group=self.group, async_op=True), t0, flat)
        else:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pipelib-comm",
                                                                   **_on_device(self.dev.torch_device))
            work.handle = self._pool.submit(self._all_reduce, flat, label, None)
        return work

    def _all_reduce(self, flat, label: str, lane) -> None:
        if self.comm == "pipelib":
            from pipelib.comm.collectives import all_reduce

            all_reduce(flat, group=self.group, check=False)
        else:  # gloo on a simulated device: the real sum, the ring's alpha-beta time
            from pipelib.comm.alphabeta import predicted_time

            t0 = lane.now()
            dist.all_reduce(flat, group=self.group)
            link = self.dev.profile.link
            lane.advance(predicted_time("all_reduce", flat.numel() * flat.element_size(), self.n,
                                        link.alpha, link.beta))
            self.dev.tracer.record(Kind.COLLECTIVE, f"{label} ({dist.get_backend(self.group)})", t0, lane.now())

    def wait(self, work: CommWork) -> None:
        """Block the compute lane until `work` is done; idle time is a RECV_WAIT event."""
        dev = self.dev
        start = dev.clock.now()
        if self.simulated:
            dev.clock.wait_until(work.end)
        elif self.comm == "gloo":
            w, t0, flat = work.handle
            w.wait()  # gloo reports completion only here: the bar ends when it was waited
            dev.synchronize()  # NCCL's wait only orders streams: the host waits for the bytes too
            dev.tracer.record(Kind.COLLECTIVE, f"all_reduce ({dist.get_backend(self.group)})", t0, dev.clock.now(),
                              bytes=0)
        else:
            work.handle.result()  # re-raises the worker's error here
        work.done = True
        end = dev.clock.now()
        if end > start:
            dev.tracer.record(Kind.RECV_WAIT, "wait all-reduce", start, end)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class BackwardTimer:
    """Times one backward pass in laps (see the module docstring). Use as a context manager
    around ``loss.backward()``; hooks call `lap()`."""

    def __init__(self, dev, label: str = "B"):
        self.dev, self.label = dev, label
        self.counter = None

    def __enter__(self):
        if self.dev.modelled:
            from torch.utils.flop_counter import FlopCounterMode

            self.counter = FlopCounterMode(display=False)
            self.counter.__enter__()
        self.start = self.mark = self.dev.clock.now()
        return self

    def lap(self) -> float:
        """Record backward's compute since the last lap; return the compute clock's time."""
        dev = self.dev
        if self.counter is not None:
            # the modelled time of the FLOPs so far (a wall clock sleeps until then)
            dev.clock.wait_until(self.start + dev.profile.compute_time(self.counter.get_total_flops()))
        stream_synchronize(dev)  # on cuda: the gradients so far computed, not only queued (NCCL runs on)
        now = dev.clock.now()
        if now > self.mark:
            dev.tracer.record(Kind.COMPUTE, self.label, self.mark, now, memory=dev.memory_now())
        self.mark = now
        return now

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.lap()
        finally:
            if self.counter is not None:
                self.counter.__exit__(exc_type, exc, tb)
        return False


def unused_parameters(loss, params) -> list:
    """The parameters of `params` that backward from `loss` will not reach: a walk of the
    autograd graph (what torch's DDP does after forward with find_unused_parameters=True)."""
    reached, seen, todo = set(), set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # an AccumulateGrad node: the leaf it accumulates into
        if var is not None:
            reached.add(id(var))
        todo.extend(f for f, _ in fn.next_functions)
    return [p for p in params if id(p) not in reached]


def _on_device(device) -> dict:
    """The worker thread's initializer: on a GPU it makes the rank's device current there too (a
    new host thread starts on GPU 0, as torch's pin-memory thread knows), nothing on the CPU."""
    import torch

    if device.type != "cuda":
        return {}
    return {"initializer": torch.cuda.set_device, "initargs": (device,)}
