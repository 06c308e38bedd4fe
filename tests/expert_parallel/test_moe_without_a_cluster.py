"""The MoE layer's expert parallelism as a library: two gloo ranks from `torch.multiprocessing.spawn`,
no pipelib Cluster. Each rank routes its own tokens; outputs and gradients (router and experts)
equal one process running both ranks' tokens through all experts."""
import datetime
import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 180


def _inputs(rank):
    return torch.randn(3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + rank))


def _check(rank):
    from pipelib.expert_parallel.layer import MoE, MoESpec

    spec = MoESpec(num_experts=4, k=2, capacity_factor=1.0)
    ref = MoE(spec, 8, layer=0, seed=1, n_layer=2).double()
    want = [ref(_inputs(r)) for r in range(2)]
    (want[0].square().sum() + want[1].square().sum()).backward()   # both ranks' tokens, one process
    moe = MoE(spec, 8, layer=0, seed=1, n_layer=2).double().shard(dist.group.WORLD)
    y = moe(_inputs(rank))
    y.square().sum().backward()
    router = moe.router.weight.grad.clone()
    dist.all_reduce(router)   # the router is replicated: its gradient sums over the ranks
    return {"experts": sorted(moe.experts, key=int),
            "output": torch.allclose(y, want[rank], atol=1e-12),
            "expert_grads": all(torch.allclose(p.grad, dict(ref.named_parameters())[k].grad, atol=1e-12)
                                for k, p in moe.named_parameters() if k.startswith("experts.")),
            "router_grad": torch.allclose(router, ref.router.weight.grad, atol=1e-12)}


def _worker(rank, path):
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        try:
            out = _check(rank)
        except Exception:
            out = {"error": traceback.format_exc()}
        torch.save(out, os.path.join(path, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_expert_parallel_moe_on_plain_torch_distributed(tmp_path):
    ctx = mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the two spawned ranks did not finish within {DEADLINE_S} s")
    outs = [torch.load(tmp_path / f"out{r}.pt", weights_only=False) for r in range(2)]
    assert not [o["error"] for o in outs if "error" in o]
    assert [o["experts"] for o in outs] == [["0", "1"], ["2", "3"]]
    assert all(o["output"] and o["expert_grads"] and o["router_grad"] for o in outs), outs
