"""Distributed data parallel from first principles, in four steps (chapter 07).

Every rank of `group` holds the whole model, runs forward and backward on its own slice of the
batch, and the ranks *average their gradients* before the optimizer step, so every replica
takes the same step as one process on the whole batch (Li et al. 2020, "PyTorch Distributed").
Four small classes, each adding one idea to the one before:

1. `AllReduceGrads`: after backward, one all-reduce per gradient (sum, then divide by N);
2. `BucketedGrads`: gradients flattened into buckets of `bucket_bytes`, one all-reduce each,
   divided by N *before* the sum as torch does, through a communication hook (`comm_hooks`:
   ``comm_hook="bf16"`` sends bfloat16, half the bytes);
3. `OverlappedGrads`: a bucket's all-reduce starts from gradient hooks, in bucket-index order,
   on a communication stream (`overlap`) while backward goes on; waited before the step;
   unused parameters an error unless ``find_unused_parameters=True``; buckets rebuilt from the
   first backward's order with ``rebuild_buckets=True``;
4. `DDP`: `no_sync()` for gradient accumulation, and the misuse checks.

Use, on every rank of `group` (the group is an argument, never a global):

    ddp = DDP(model, group, bucket_bytes=1 << 20)     # checks the replicas are equal
    ddp.backward(loss_fn(ddp(x), y))                  # loss.backward(), timed in laps
    ddp.finish_gradients()                            # averaged gradients in p.grad
    optimizer.step()

Who sends what: each rank sends 2 (N-1)/N x (the gradients' bytes on the wire) per step in the
ring all-reduces (exactly `buckets.ring_bytes_per_rank` per bucket); steps 2-4 pay the latency
once per bucket, step 3 hides the transfer behind backward. Collectives go through chapter 06's
ring (``comm="pipelib"``, every message on the trace) or gloo's (``comm="gloo"``). Introduced in
chapter 07; every rank agrees on the bucket plan and the frozen parameters when it wraps.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as torch_ddp

from pipelib.data_parallel.buckets import agree_buckets, check_bucket_bytes, plan_buckets
from pipelib.data_parallel.comm_hooks import comm_hook as comm_hook_of
from pipelib.data_parallel.overlap import BackwardTimer, CommStream, check_comm, unused_parameters
from pipelib.data_parallel.replicas import check_same_parameters
from pipelib.runtime.device import current

# torch's DDP defaults, 25 MiB and a 1 MiB first bucket: named in torch 2.13, inline in older torch
DEFAULT_BUCKET_BYTES = int(getattr(torch_ddp, "_DEFAULT_BUCKET_CAP_MB", 25) * 2**20)
FIRST_BUCKET_BYTES = int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20))


class AllReduceGrads:
    """Step 1: after backward, all-reduce every gradient (sum), then divide by N.

    One all-reduce per parameter tensor: correct, and as slow as it gets: each pays the ring's
    2(N-1) latencies, and none starts before backward has finished."""

    def __init__(self, module: torch.nn.Module, group=None, *, comm: str = "pipelib", ignore=()):
        self.comm = check_comm(comm, type(self).__name__)
        self.module, self.group, ignore = module, group, frozenset(ignore)  # reduced elsewhere (experts)
        self.n = dist.get_world_size(group)
        self.dev = current()
        self.params = [(name, p) for name, p in module.named_parameters() if p.requires_grad and name not in ignore]
        check_same_parameters(module, group, ignore=ignore, comm=self.comm)  # equal replicas, frozen alike, one comm
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

    Same bytes as step 1, far fewer messages: the latency is paid once per bucket. Each bucket
    goes through `comm_hook` (`pipelib.data_parallel.comm_hooks`): divided by N *before* the
    sum, as torch's DDP does, and with ``comm_hook="bf16"`` sent in bfloat16 (half the bytes).
    `first_bucket_bytes`: the cap of the bucket backward fills first (torch: 1 MiB when its bucket
    size is left at the default, `FIRST_BUCKET_BYTES`)."""

    def __init__(self, module, group=None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int | None = None, comm: str = "pipelib", comm_hook="allreduce", ignore=()):
        check_bucket_bytes(bucket_bytes, type(self).__name__)  # before any message
        self.hook = comm_hook_of(comm_hook)
        super().__init__(module, group, comm=comm, ignore=ignore)
        self.bucket_bytes, self.first_bucket_bytes = bucket_bytes, first_bucket_bytes
        self.itemsize, self.by_name = max((p.element_size() for _, p in self.params), default=4), dict(self.params)
        self._plan([(n, p.numel()) for n, p in self.params], backward_order=False)
        self.works, self.flats, self.wires = {}, {}, {}

    def _plan(self, sizes, backward_order: bool) -> None:
        self.buckets = plan_buckets(sizes, self.bucket_bytes, self.itemsize, self.first_bucket_bytes,
                                    backward_order=backward_order)
        self.bucket_params = [[self.by_name[n] for n in b.names] for b in self.buckets]
        self.bucket_of = {id(p): b for b, ps in enumerate(self.bucket_params) for p in ps}
        agree_buckets(self)  # the all-reduces skip the per-message check: agree on the plan once

    def flatten(self, index: int) -> torch.Tensor:
        """Bucket `index`'s gradients copied into one flat tensor (zeros for a missing one)."""
        ps = self.bucket_params[index]
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])

    def unflatten(self, index: int, flat: torch.Tensor) -> None:
        """The averaged flat bucket back into each parameter's .grad."""
        for p, g in zip(self.bucket_params[index], flat.split([p.numel() for p in self.bucket_params[index]])):
            p.grad = g.view_as(p).clone() if p.grad is None else p.grad.copy_(g.view_as(p))

    def _launch(self, b: int) -> None:
        """Bucket b flattened, encoded by the hook (divided by N, cast), its all-reduce started."""
        self.flats[b] = flat = self.flatten(b)
        self.wires[b] = wire = self.hook.encode(flat, self.n)
        self.works[b] = self.stream.launch(wire, f"all_reduce bucket {b}")

    def _land(self, b: int) -> None:
        """Wait for bucket b's all-reduce; decode it into the fp32 bucket and the .grad tensors."""
        self.stream.wait(self.works[b])
        self.unflatten(b, self.hook.decode(self.wires[b], self.flats[b]))

    def finish_gradients(self) -> None:
        """Average the gradients, one blocking all-reduce per bucket."""
        for b in range(len(self.buckets)):
            self._launch(b)
            self._land(b)
        self.works, self.flats, self.wires = {}, {}, {}


class OverlappedGrads(BucketedGrads):
    """Step 3: each bucket's all-reduce starts from a gradient hook, on the communication stream,
    while backward computes the rest; `finish_gradients` waits for them all before the step.

    As torch's DDP: all-reduces start in *bucket-index order* (a ready bucket waits for every
    lower-index one to start: "Mismatched allreduce order across processes can lead to wrong
    results or DDP backward hang", DDP design note); `ready_order`, `launch_order` record both.
    A parameter given no gradient is an error at `finish_gradients`, naming it; with
    ``find_unused_parameters=True`` backward first walks the autograd graph from the loss and
    marks the parameters it does not reach as ready (local gradient zero), a walk every step.
    ``rebuild_buckets=True``: buckets planned again after the first synchronised backward, in
    the order its gradients came (torch rebuilds so by default)."""

    def __init__(self, module, group=None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int | None = None, comm: str = "pipelib", comm_hook="allreduce",
                 find_unused_parameters: bool = False, rebuild_buckets: bool = False, ignore=()):
        super().__init__(module, group, bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                         comm=comm, comm_hook=comm_hook, ignore=ignore)
        self.find_unused_parameters, self.rebuild_buckets = bool(find_unused_parameters), bool(rebuild_buckets)
        self.arrivals, self.rebuilt = [], False  # names in the order the first backward's gradients came
        self.timer, self.sync, self.ready_order, self.launch_order = None, True, [], []
        self._new_step()
        self.name_of = {id(p): n for n, p in self.params}
        self.hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for _, p in self.params]

    def _new_step(self) -> None:
        self.pending = [len(ps) for ps in self.bucket_params]  # gradients still to come, per bucket
        self.works, self.flats, self.wires = {}, {}, {}
        self.arrived, self.ready, self.next_bucket = set(), set(), 0

    def _grad_ready(self, p) -> None:
        if not self.sync:
            return  # inside no_sync (step 4): gradients just accumulate in p.grad
        self._arrive(p)
        if self.rebuild_buckets and not self.rebuilt:
            self.arrivals.append(self.name_of[id(p)])
        self._launch_ready()

    def _arrive(self, p) -> None:
        if id(p) not in self.arrived:
            self.arrived.add(id(p))
            b = self.bucket_of[id(p)]
            self.pending[b] -= 1
            if self.pending[b] == 0:
                self.ready.add(b)
                self.ready_order.append(b)

    def _launch_ready(self) -> None:
        """Start every ready bucket whose lower-index buckets have all started (index order)."""
        if self.next_bucket in self.ready and self.timer is not None:
            self.timer.lap()  # backward's compute up to now: the buckets start at this time
        while self.next_bucket in self.ready:
            self._launch(self.next_bucket)
            self.launch_order.append(self.next_bucket)
            self.next_bucket += 1

    def backward(self, loss) -> None:
        """loss.backward(); the hooks launch the buckets' all-reduces as they fill."""
        self.ready_order, self.launch_order = [], []
        with BackwardTimer(self.dev) as self.timer:
            try:
                if self.find_unused_parameters and self.sync:
                    for p in unused_parameters(loss, [p for _, p in self.params]):
                        self._arrive(p)  # ready now, with its local gradient as it is (zero)
                    self._launch_ready()
                loss.backward()
            finally:
                self.timer = None

    def finish_gradients(self) -> None:
        """Wait for every all-reduce in bucket order and write the averaged gradients back.
        A parameter whose gradient never came is an error unless find_unused_parameters."""
        missing = [n for n, p in self.params if id(p) not in self.arrived]
        if missing and not self.find_unused_parameters:
            raise ValueError(
                f"{type(self).__name__}.finish_gradients: {len(missing)} parameter(s) received no gradient in "
                f"this backward: {missing[:8]}{' ...' if len(missing) > 8 else ''}; their buckets' all-reduces "
                f"never started. If the model leaves them unused on purpose, pass "
                f"find_unused_parameters=True (as torch's DDP asks), or freeze them (requires_grad=False)")
        for b in range(self.next_bucket, len(self.buckets)):
            self._launch(b)  # find_unused_parameters: a parameter reached but given no gradient
            self.launch_order.append(b)
        for b in range(len(self.buckets)):
            self._land(b)
        if self.rebuild_buckets and not self.rebuilt and self.arrivals:
            self._rebuild()
        self._new_step()

    def _rebuild(self) -> None:
        """Buckets planned again in the order the first backward produced the gradients."""
        numel = {n: p.numel() for n, p in self.params}
        order = list(dict.fromkeys(self.arrivals)) + [n for n in numel if n not in self.arrivals]
        self.initial_buckets, self.rebuilt = self.buckets, True
        self._plan([(n, numel[n]) for n in order], backward_order=True)

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

    def __init__(self, module, group=None, **options):
        """`options`: OverlappedGrads's (bucket_bytes, first_bucket_bytes, comm, comm_hook,
        find_unused_parameters, rebuild_buckets)."""
        super().__init__(module, group, **options)
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
