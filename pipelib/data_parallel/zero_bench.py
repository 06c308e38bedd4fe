"""Step times of pipelib's ZeRO against torch's FSDP2 on real CPU engines, side by side.

Each rank builds the same model three times: pipelib's ZeRO-3, pipelib's stage 0 (plain data
parallelism with one all-reduce per layer: the DDP-like baseline of ZeRO-3's throughput
penalty) and torch's FSDP2 (`fully_shard` per layer, then the root), all with torch's Adam.
`zero_bench_step(which)` times one training step of one of them, from a barrier to the end of
its optimizer step: the benchmark (bench/data_parallel_zero.py) alternates them step by step,
so a change of load on a shared machine hits all three alike, and takes the slowest rank.
The contestants are kept on the engine's Device between the two calls (`Device.groups`,
under the key ("zero_bench",)), not in a module global.

Introduced for chapter 08's benchmark.
"""
from __future__ import annotations


import torch

_KEY = ("zero_bench",)


def zero_bench_setup(recipe, group=None) -> int:
    """Build the three contestants on this rank (kept on its Device); return the number of
    parameters. Every rank of the world calls it (FSDP2's mesh is `Mesh.first(n)`'s)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from pipelib.data_parallel.zero import ZeRO
    from pipelib.data_parallel.zero_units import layer_units
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh
    from pipelib.runtime.place import to_rank_device

    bench = current().groups[_KEY] = {}
    n, r = dist.get_world_size(group), dist.get_rank(group)
    x, y = to_rank_device(recipe.batch(0, r, n))  # drawn on the CPU, then moved
    for stage in (0, 3):
        m = to_rank_device(recipe.build())
        bench[f"zero{stage}"] = (m, ZeRO(m, group, stage=stage, lr=recipe.lr))
    m = to_rank_device(recipe.build())
    mesh = Mesh.first(n).to_device_mesh()  # the rank's device type: the GPU's under NCCL
    for _, layer in layer_units(m):
        if layer is not m:
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    bench["fsdp2"] = (m, torch.optim.Adam(m.parameters(), lr=recipe.lr))
    bench["batch"] = (x, y)
    return sum(p.numel() for p in m.parameters())


def zero_bench_step(which: str) -> None:
    """One training step of `which` ("zero0", "zero3" or "fsdp2") on this rank."""
    from pipelib.recipe import loss_of
    from pipelib.runtime.device import current

    bench = current().groups[_KEY]
    model, opt = bench[which]
    x, y = bench["batch"]
    loss = loss_of(opt if which.startswith("zero") else model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()


def zero_bench_times(order, steps: int) -> dict:
    """On every rank: each contestant of `order` one step in turn, `steps` times after a warm-up
    (`pipelib.runtime.alternate.alternate_steps`: each step's time the slowest rank's)."""
    from pipelib.runtime.alternate import alternate_steps

    return alternate_steps({k: (lambda k=k: zero_bench_step(k)) for k in order}, steps, warmup=1)
