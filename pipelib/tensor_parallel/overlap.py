"""Hiding tensor parallelism's backward communication behind the weight gradient.

A column-parallel linear Y = X A_r^T needs two products in backward: the input's gradient
dX_r = dY_r A_r (a partial sum over the t ranks, which `f` all-reduces, or under sequence
parallelism reduce-scatters) and the weight's gradient dA_r = dY_r^T X. The second does not
need the first's collective. Megatron-LM launches the all-reduce of dX asynchronously as soon
as dX is computed and computes dA meanwhile (Korthikanti et al. 2022, §6.2: "we overlap
all-reduce communication with the linear weight's gradient computation"; Megatron Core's
`LinearWithGradAccumulationAndAsyncCommunication`); under sequence parallelism it overlaps the
reduce-scatter of dX with dA the same way (§4.2.2). `column_linear_overlapped` does the same:

    dX = dY A_r                 # lap: the compute clock advances by its FLOPs
    work = lanes.launch(f, dX)  # the collective on the communication lane, from now
    dA = dY^T X, db = sum dY    # meanwhile, on the compute lane
    dX = lanes.wait(work)       # the compute lane waits for what is left of the collective

`TPLanes` holds one rank's two lanes on its `Device`, as chapter 07's `CommStream` does for
DDP's buckets (`pipelib.data_parallel.overlap`; the same `Device.lane` mechanism): on a
simulated device with the virtual clock, a launched collective runs pipelib's ring with a
second `VirtualClock` in the device's place, starting at max(lane free, now); the compute clock
does not move; `wait` moves it to the collective's end and records the idle time as a RECV_WAIT
event. While `timed()` is active, every collective of `pipelib.tensor_parallel.ops` first charges
the compute done since the last one (matmul FLOPs counted by torch's FlopCounterMode, at the
profile's roofline rate) as a COMPUTE event: the step then has a simulated time, and the
trace shows the hidden collectives under the weight gradients. With torch's built-ins as the
backend, `launch_torch` starts them with ``async_op=True`` (NCCL runs them on its own stream,
gloo on its threads) and `wait` waits for the work: the overlap as production runs it. With
pipelib's ring on a real device `launch` runs the collective at once: the gradients are the
same, nothing is hidden.

The forward's collectives cannot be hidden this way (the next matmul needs their result);
production hides them by cutting the matmul and the collective into pieces that pipeline
(PyTorch's async TP: `fused_all_gather_matmul`, `fused_matmul_reduce_scatter`; Transformer
Engine's userbuffers): named in chapter 09, not built here. Introduced in chapter 09.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipelib.trace import Kind


@dataclass
class TPWork:
    """One launched collective: its result and (simulated) when the lane finishes it."""

    out: torch.Tensor
    end: float | None = None
    handle: object = None  # torch's async work (backend "torch")


class TPLanes:
    """One rank's compute lane and communication lane for tensor parallelism (module doc)."""

    def __init__(self, dev):
        self.dev = dev
        self.counter = None      # FlopCounterMode while `timed()` is active
        self.counted = 0         # FLOPs already charged to the compute clock
        self.in_lane = False     # inside `launch`: collectives there are the lane's, no lap
        self.free_at = 0.0       # simulated: when the lane's last collective ends

    @property
    def simulated(self) -> bool:
        return self.dev.modelled and self.dev.clock.virtual

    @contextlib.contextmanager
    def timed(self):
        """Charge the matmul FLOPs run inside the block to the compute clock, lap by lap (a
        modelled device only; elsewhere the clock is real and this does nothing)."""
        if not self.dev.modelled or self.counter is not None:
            yield self
            return
        from torch.utils.flop_counter import FlopCounterMode

        self.counter, self.counted = FlopCounterMode(display=False), 0
        try:
            with self.counter:
                yield self
                self.lap()
        finally:
            self.counter = None

    def lap(self, label: str = "compute") -> None:
        """Advance the compute clock by the roofline time of the FLOPs run since the last lap."""
        if self.counter is None or self.in_lane:
            return
        flops = self.counter.get_total_flops()
        delta, self.counted = flops - self.counted, flops
        if delta <= 0:
            return
        dev = self.dev
        start = dev.clock.now()
        dev.clock.advance(dev.profile.compute_time(delta))
        dev.tracer.record(Kind.COMPUTE, label, start, dev.clock.now(), memory=dev.memory.total)

    def launch(self, collective, *args) -> TPWork:
        """Run `collective(*args)` on the communication lane (simulated), or at once (real)."""
        self.lap()
        if not self.simulated:
            return TPWork(collective(*args))
        from pipelib.runtime.clocks import VirtualClock

        lane = VirtualClock(max(self.free_at, self.dev.clock.now()))
        self.in_lane = True
        try:
            with self.dev.lane(lane):  # the ring's messages, waits and events timed on the lane
                out = collective(*args)
        finally:
            self.in_lane = False
        self.free_at = lane.now()
        return TPWork(out, self.free_at)

    def launch_torch(self, dx: torch.Tensor, comm, scatter: bool) -> TPWork:
        """torch's all-reduce of dx (or its reduce-scatter along the sequence, dim 1) with
        ``async_op=True``, on the same layout as `pipelib.tensor_parallel.ops` uses."""
        import torch.distributed as dist

        self.lap()
        if scatter:
            s = dx.transpose(0, 1).contiguous()  # (T, B, C): the collective cuts dim 0
            out = torch.empty((s.shape[0] // comm.size, *s.shape[1:]), dtype=s.dtype, device=s.device)
            handle = dist.reduce_scatter_tensor(out, s, group=comm.group, async_op=True)
            return TPWork(out.transpose(0, 1), handle=handle)  # (B, T/t, C), filled when done
        y = dx.contiguous().clone()
        return TPWork(y, handle=dist.all_reduce(y, group=comm.group, async_op=True))

    def wait(self, work: TPWork, label: str) -> torch.Tensor:
        """The compute lane waits for `work`; the idle time is a RECV_WAIT event (exposed)."""
        self.lap()
        if work.handle is not None:
            work.handle.wait()
        if work.end is not None:
            dev = self.dev
            start = dev.clock.now()
            dev.clock.wait_until(work.end)
            if dev.clock.now() > start:
                dev.tracer.record(Kind.RECV_WAIT, f"wait {label}", start, dev.clock.now())
        return work.out


class _ColumnOverlapped(torch.autograd.Function):
    """Y = X A_r^T + b_r; backward: dX's collective launched, then dA and db, then the wait."""

    @staticmethod
    def forward(ctx, x, weight, bias, comm, label, sequence_parallel):
        from pipelib.tensor_parallel.ops import all_gather_seq

        if sequence_parallel:
            x = all_gather_seq(x, comm, f"{label} all-gather forward")  # (B, T, in)
        ctx.save_for_backward(x, weight)
        ctx.comm, ctx.label, ctx.sp, ctx.has_bias = comm, label, sequence_parallel, bias is not None
        return F.linear(x, weight, bias)  # (B, T, out / t)

    @staticmethod
    def backward(ctx, grad):
        from pipelib.tensor_parallel.ops import all_reduce_tp, reduce_scatter_seq

        x, weight = ctx.saved_tensors
        comm, lanes = ctx.comm, ctx.comm.lanes
        g2 = grad.reshape(-1, grad.shape[-1])                       # (B T, out / t)
        dx = g2.mm(weight).view(x.shape)                            # (B, T, in), a partial sum
        what = f"{ctx.label} {'reduce-scatter' if ctx.sp else 'f'} backward"
        if comm.uses_torch:
            work = lanes.launch_torch(dx, comm, ctx.sp)
        elif ctx.sp:
            work = lanes.launch(reduce_scatter_seq, dx, comm, what)
        else:
            work = lanes.launch(all_reduce_tp, dx, comm, what)
        dw = g2.t().mm(x.reshape(-1, x.shape[-1]))                   # (out / t, in): meanwhile
        db = g2.sum(0) if ctx.has_bias else None
        return lanes.wait(work, what), dw, db, None, None, None


def column_linear_overlapped(x: torch.Tensor, weight: torch.Tensor, bias, comm, label: str,
                             sequence_parallel: bool = False) -> torch.Tensor:
    """A column-parallel linear whose backward collective (the all-reduce of dX, or under
    sequence parallelism its reduce-scatter) runs on the communication lane while the weight
    gradient is computed. Same values, same bytes as `ColumnParallelLinear` without overlap."""
    return _ColumnOverlapped.apply(x, weight, bias, comm, label, sequence_parallel)
