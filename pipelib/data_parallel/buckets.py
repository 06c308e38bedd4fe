"""Gradient buckets: which parameters' gradients travel together in one all-reduce.

One all-reduce per parameter pays the link's latency once per tensor (2(N-1) alpha each, on a
ring of N ranks): a GPT with 50 small tensors pays it 50 times. DDP therefore flattens the
gradients into *buckets* of about `bucket_bytes` and all-reduces each bucket once (Li et al.
2020, "PyTorch Distributed", section 3.2.3). Parameters are bucketed in *reverse* order of
registration, which is about the order backward produces their gradients, so the first bucket is
full first and its all-reduce can start while backward goes on (step 3 of chapter 07). A
parameter larger than `bucket_bytes` gets a bucket of its own; a bucket is never empty.

torch's defaults (torch 2.13, `torch.nn.parallel.distributed`): a cap of 25 MiB
(`_DEFAULT_BUCKET_CAP_MB`) and a *first* bucket of 1 MiB (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`)
when `bucket_cap_mb` is left at its default: the bucket backward fills first is small, so the
first all-reduce starts early. `first_bucket_bytes` gives the same plan: `plan_buckets` equals
torch's `torch.distributed._compute_bucket_assignment_by_size` on the same sizes and limits in
backward's order (a test checks).

Pure: imports nothing but the standard library and `pipelib.checks`, so a figure can plan
buckets without torch (a test checks).

Introduced in chapter 07.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.checks import check_int


@dataclass(frozen=True)
class Bucket:
    """One bucket: its parameters (names, in the order they are flattened) and their sizes."""

    index: int
    names: tuple[str, ...]
    numels: tuple[int, ...]

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each parameter's gradient starts in the flat bucket."""
        out, o = [], 0
        for k in self.numels:
            out.append(o)
            o += k
        return tuple(out)


def check_bucket_bytes(bucket_bytes, context: str = "DDP") -> int:
    """`bucket_bytes` if it is an int >= 1, else a ValueError saying what the number means."""
    return check_int(bucket_bytes, "bucket_bytes", context=context,
                     hint="bytes of gradients per all-reduce; torch's DDP uses 25 MiB = 26214400")


def plan_buckets(sizes, bucket_bytes: int, itemsize: int = 4, first_bucket_bytes: int | None = None,
                 *, backward_order: bool = False) -> list[Bucket]:
    """Buckets for parameters `sizes` = [(name, numel), ...] given in registration order
    (or, with `backward_order=True`, in the order backward produced their gradients, as DDP
    observes it in its first step: `OverlappedGrads(rebuild_buckets=True)`).

    Walks them in backward's order and closes a bucket as soon as it holds at least
    `bucket_bytes` (so a bucket may pass the limit by its last parameter, as torch's does);
    the first bucket closes at `first_bucket_bytes` instead, when given (torch: 1 MiB)."""
    check_bucket_bytes(bucket_bytes)
    if first_bucket_bytes is not None:
        check_bucket_bytes(first_bucket_bytes, "plan_buckets (first_bucket_bytes)")
    check_int(itemsize, "itemsize", context="plan_buckets", hint="bytes per gradient element")
    buckets, names, numels, nbytes = [], [], [], 0
    for name, numel in (list(sizes) if backward_order else reversed(list(sizes))):
        names.append(name)
        numels.append(numel)
        nbytes += numel * itemsize
        limit = first_bucket_bytes if (first_bucket_bytes is not None and not buckets) else bucket_bytes
        if nbytes >= limit:
            buckets.append(Bucket(len(buckets), tuple(names), tuple(numels)))
            names, numels, nbytes = [], [], 0
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), tuple(numels)))
    return buckets


def ring_bytes_per_rank(numel: int, n: int, itemsize: int = 4, rank: int = 0) -> int:
    """Bytes group rank `rank` sends in the ring all-reduce of `numel` elements on n ranks:
    2 numel - |chunk rank| - |chunk rank+1| elements (chunks as `torch.tensor_split` cuts
    them), which is 2 (n-1)/n numel when n divides numel. 0 on one rank."""
    if n == 1:
        return 0
    q, r = divmod(numel, n)
    chunk = [q + 1 if i < r else q for i in range(n)]
    return itemsize * (2 * numel - chunk[rank % n] - chunk[(rank + 1) % n])


def agree_buckets(ddp) -> None:
    """Every rank of `ddp.group` holds the same bucket plan (sizes, caps, hook), or all raise an
    `ArgumentMismatchError` naming each rank's: one small exchange when the plan is made. DDP's
    all-reduces skip the per-message agreement (check=False), so a rank with other buckets would
    otherwise send other sizes: a dead rank, or gradients summed with the wrong peers'."""
    from pipelib.comm.agreement import agree

    agree(f"{type(ddp).__name__} bucket plan", ddp.group, bucket_bytes=ddp.bucket_bytes,
          first_bucket_bytes=ddp.first_bucket_bytes, comm_hook=ddp.hook.name,
          buckets=tuple(b.numel for b in ddp.buckets))
