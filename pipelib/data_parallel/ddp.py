"""Distributed data parallel from first principles, in four steps (chapter 07).

Every rank of `group` holds the whole model, runs forward and backward on its own slice of the
batch, and the ranks *average their gradients* before the optimizer step, so every replica
takes the same step as one process on the whole batch (Li et al. 2020, "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training"). The four steps, each a small class that
adds one idea to the one before:

1. `AllReduceGrads`: after backward, one all-reduce per gradient;
2. `BucketedGrads`: gradients flattened into buckets of `bucket_bytes`, one all-reduce each;
3. `OverlappedGrads`: a bucket's all-reduce starts from gradient hooks as soon as the bucket is
   full, on a communication stream (`pipelib.data_parallel.overlap`), while backward goes on;
   waited before the optimizer step;
4. `DDP`: `no_sync()` for gradient accumulation (skip the all-reduces on all but the last
   micro-batch), and the misuse checks.

Use, on every rank of `group` (the group is an argument, never a global):

    ddp = DDP(model, group, bucket_bytes=1 << 20)     # checks the replicas are equal
    loss = loss_fn(ddp(x), y)
    ddp.backward(loss)                                # loss.backward(), timed in laps
    ddp.finish_gradients()                            # averaged gradients in p.grad
    optimizer.step()

Who sends what: each rank sends 2 (N-1)/N x (the gradients' bytes) per step in the ring
all-reduces (exactly `buckets.ring_bytes_per_rank` per bucket), whatever the step; steps 2-4
only pay the latency once per bucket instead of once per tensor, and step 3 hides the transfer
behind backward.

Collectives go through chapter 06's ring (``comm="pipelib"``, every message on the trace) or
gloo's built-in (``comm="gloo"``).

Introduced in chapter 07.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from pipelib.data_parallel.buckets import check_bucket_bytes, plan_buckets
from pipelib.data_parallel.overlap import BackwardTimer, CommStream, check_comm
from pipelib.data_parallel.replicas import check_same_parameters
from pipelib.runtime.device import current

DEFAULT_BUCKET_BYTES = 25 << 20  # torch's DistributedDataParallel default, 25 MiB


class AllReduceGrads:
    """Step 1: after backward, all-reduce every gradient (sum), then divide by N.

    One all-reduce per parameter tensor: correct, and as slow as it gets: each pays the ring's
    2(N-1) latencies, and none starts before backward has finished."""

    def __init__(self, module: torch.nn.Module, group=None, *, comm: str = "pipelib"):
        self.comm = check_comm(comm, type(self).__name__)
        self.module, self.group = module, group
        self.n = dist.get_world_size(group)
        self.dev = current()
        self.params = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        check_same_parameters(module, group)  # replicas must start equal
        self.stream = CommStream(self.dev, group, comm)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss) -> None:
        """loss.backward(), timed on this rank's device (one COMPUTE event "B")."""
        with BackwardTimer(self.dev):
            loss.backward()

    def finish_gradients(self) -> None:
        """Average every gradient over the group, one all-reduce each (blocking)."""
        for name, p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.all_reduce(p.grad, f"all_reduce {name}")
            p.grad.div_(self.n)

    def all_reduce(self, tensor: torch.Tensor, label: str) -> None:
        """Sum `tensor` over the group in place, and wait for it (ring or gloo: `comm`)."""
        self.stream.wait(self.stream.launch(tensor, label))

    def close(self) -> None:
        """Stop the communication stream's worker (if any)."""
        self.stream.close()


class BucketedGrads(AllReduceGrads):
    """Step 2: the gradients flattened into buckets of about `bucket_bytes`, one all-reduce each.

    Same bytes as step 1, far fewer messages: the latency is paid once per bucket."""

    def __init__(self, module, group=None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, comm: str = "pipelib"):
        check_bucket_bytes(bucket_bytes, type(self).__name__)  # before any message
        super().__init__(module, group, comm=comm)
        self.bucket_bytes = bucket_bytes
        itemsize = max((p.element_size() for _, p in self.params), default=4)
        self.buckets = plan_buckets([(n, p.numel()) for n, p in self.params], bucket_bytes, itemsize)
        by_name = dict(self.params)
        self.bucket_params = [[by_name[n] for n in b.names] for b in self.buckets]

    def flatten(self, index: int) -> torch.Tensor:
        """Bucket `index`'s gradients copied into one flat tensor (zeros for a missing one)."""
        ps = self.bucket_params[index]
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])

    def unflatten(self, index: int, flat: torch.Tensor) -> None:
        """The averaged flat bucket back into each parameter's .grad."""
        flat.div_(self.n)
        for p, g in zip(self.bucket_params[index], flat.split([p.numel() for p in self.bucket_params[index]])):
            if p.grad is None:
                p.grad = g.view_as(p).clone()
            else:
                p.grad.copy_(g.view_as(p))

    def finish_gradients(self) -> None:
        """Average the gradients, one blocking all-reduce per bucket."""
        for b in self.buckets:
            flat = self.flatten(b.index)
            self.all_reduce(flat, f"all_reduce bucket {b.index}")
            self.unflatten(b.index, flat)


class OverlappedGrads(BucketedGrads):
    """Step 3: each bucket's all-reduce starts from a gradient hook as soon as its last
    gradient is accumulated, on the communication stream, while backward computes the rest;
    `finish_gradients` waits for them all before the optimizer step."""

    def __init__(self, module, group=None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, comm: str = "pipelib"):
        super().__init__(module, group, bucket_bytes=bucket_bytes, comm=comm)
        self.bucket_of = {id(p): b for b, ps in enumerate(self.bucket_params) for p in ps}
        self.timer, self.sync = None, True
        self._new_step()
        self.hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for _, p in self.params]

    def _new_step(self) -> None:
        self.pending = [len(ps) for ps in self.bucket_params]  # gradients still to come, per bucket
        self.works, self.flats = {}, {}

    def _grad_ready(self, p) -> None:
        if not self.sync:
            return  # inside no_sync (step 4): gradients just accumulate in p.grad
        b = self.bucket_of[id(p)]
        self.pending[b] -= 1
        if self.pending[b] == 0:
            self._launch(b)

    def _launch(self, b: int) -> None:
        if self.timer is not None:
            self.timer.lap()  # backward's compute up to now: the bucket is ready at this time
        self.flats[b] = flat = self.flatten(b)
        self.works[b] = self.stream.launch(flat, f"all_reduce bucket {b}")

    def backward(self, loss) -> None:
        """loss.backward(); the hooks launch the buckets' all-reduces as they fill."""
        with BackwardTimer(self.dev) as self.timer:
            try:
                loss.backward()
            finally:
                self.timer = None

    def finish_gradients(self) -> None:
        """Launch any bucket not launched yet (a parameter unused in this step), wait for
        every all-reduce in bucket order, and write the averaged gradients back."""
        for b in range(len(self.buckets)):
            if b not in self.works:
                self._launch(b)
        for b in range(len(self.buckets)):
            self.stream.wait(self.works[b])
            self.unflatten(b, self.flats[b])
        self._new_step()

    def close(self) -> None:
        """Remove the gradient hooks and stop the stream: the module is unwrapped again."""
        for h in self.hooks:
            h.remove()
        self.hooks = []
        super().close()


class DDP(OverlappedGrads):
    """Step 4: `no_sync()` for gradient accumulation, and clear errors when it is misused.

    Inside ``with ddp.no_sync():`` backward only accumulates gradients locally (no message);
    the first backward outside it all-reduces the accumulated sums, as torch's
    DistributedDataParallel.no_sync does. Misuse raised, on the rank that makes it, before any
    message: `finish_gradients` inside no_sync, or when no backward ran outside it since the
    last step (the gradients would be stepped unsynchronised); a forward while a synchronised
    backward's all-reduces are still unwaited (call finish_gradients before optimizer.step)."""

    def __init__(self, module, group=None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, comm: str = "pipelib"):
        super().__init__(module, group, bucket_bytes=bucket_bytes, comm=comm)
        self.synced_backward = False  # a backward outside no_sync since the last step

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication."""
        if not self.sync:
            raise ValueError("DDP.no_sync: already inside no_sync(); nested no_sync blocks are not needed "
                             "(gradients keep accumulating until the first backward outside)")
        if self.works:
            raise ValueError(f"DDP.no_sync: {len(self.works)} bucket all-reduce(s) of the last backward are "
                             f"still in flight; call finish_gradients() (and optimizer.step()) first")
        self.sync = False
        try:
            yield self
        finally:
            self.sync = True

    def __call__(self, *args, **kwargs):
        if self.works and self.sync:
            raise ValueError(f"DDP: forward while {len(self.works)} bucket all-reduce(s) of the last backward "
                             f"are unwaited; call finish_gradients() before optimizer.step() and before the "
                             f"next forward")
        return super().__call__(*args, **kwargs)

    def _grad_ready(self, p) -> None:
        if self.sync:
            self.synced_backward = True  # a synchronised backward is under way
        super()._grad_ready(p)

    def finish_gradients(self) -> None:
        if not self.sync:
            raise ValueError("DDP.finish_gradients inside no_sync(): the gradients are this rank's alone. "
                             "Run the last micro-batch's backward outside no_sync(), then finish_gradients()")
        if not self.synced_backward:
            raise ValueError("DDP.finish_gradients: no backward ran outside no_sync() since the last step, so "
                             "the accumulated gradients were never all-reduced. Run the last micro-batch's "
                             "backward outside the no_sync() block")
        super().finish_gradients()
        self.synced_backward = False
