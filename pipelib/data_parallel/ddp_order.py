"""Bucket order and unused parameters on the ranks: what chapter 07 shows of torch's DDP rules.

`ScrambledNet` registers its three layers in the reverse of the order it uses them, so the
buckets (planned from registration order, backwards) fill in the reverse of their index: the
case where torch's rule, all-reduces started in bucket-index order, costs the overlap, and where
rebuilding the buckets from the first backward's order wins it back. With ``unused=True`` a
fourth layer is never used: `OverlappedGrads` raises, naming it, unless
``find_unused_parameters=True``.

`ddp_orders` runs on every rank (`Cluster.run`) and reports, step by step, the buckets, the
order they became ready and the order their all-reduces started, whether the first one started
inside backward, the compute lane's wait for communication, and the largest difference from
one process on the whole batch.

Introduced in chapter 07.
"""
from __future__ import annotations

import torch


class ScrambledNet(torch.nn.Module):
    """x -> a -> tanh -> b -> tanh -> c, the layers registered c, b, a (and `spare`, unused)."""

    def __init__(self, width: int = 8, unused: bool = False):
        super().__init__()
        self.c, self.b, self.a = (torch.nn.Linear(width, width) for _ in range(3))
        self.spare = torch.nn.Linear(width, width) if unused else None

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def ddp_orders(steps: int = 2, *, unused: bool = False, width: int = 8, rows: int = 4, **options) -> list[dict]:
    """On every rank: `steps` DDP steps of a `ScrambledNet` (`options` go to `ddp.DDP`: e.g.
    rebuild_buckets, find_unused_parameters, bucket_bytes), this rank's rows of one batch."""
    import torch.distributed as dist

    from pipelib.data_parallel.ddp import DDP
    from pipelib.runtime.device import current
    from pipelib.runtime.place import to_rank_device
    from pipelib.trace import Kind

    torch.manual_seed(0)
    net, ref = to_rank_device((ScrambledNet(width, unused), ScrambledNet(width, unused)))
    ref.load_state_dict(net.state_dict())
    ddp = DDP(net, None, **{"bucket_bytes": 4 * width * (width + 1), **options})  # one layer per bucket
    n, r, tracer, out = dist.get_world_size(), dist.get_rank(), current().tracer, []
    try:
        for step in range(steps):
            x = to_rank_device(torch.randn(rows * n, width, generator=torch.Generator().manual_seed(step)))
            tracer.clear()
            ddp.backward(ddp(x[rows * r:rows * (r + 1)]).pow(2).mean())
            names, ready, launched = [b.names for b in ddp.buckets], list(ddp.ready_order), list(ddp.launch_order)
            ddp.finish_gradients()
            evs = tracer.take()
            b_end = max(e.end for e in evs if e.kind == Kind.COMPUTE and e.label == "B")
            first = min(e.start for e in evs if e.kind == Kind.COLLECTIVE)
            ref.zero_grad()
            ref(x).pow(2).mean().backward()
            worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(net.parameters(), ref.parameters())
                        if q.grad is not None)
            out.append(dict(buckets=names, ready=ready, launched=launched, started_in_backward=first < b_end,
                            waited=sum(e.duration for e in evs if e.kind == Kind.RECV_WAIT), worst=worst))
            for p in net.parameters():
                p.grad = None
    finally:
        ddp.close()
    return out
