"""The MoE layer's expert parallelism as a library: three gloo ranks from `torch.multiprocessing.spawn`,
no pipelib Cluster (a real device: the uneven all-to-all posts every pair at once). Each rank
routes its own tokens; outputs and gradients (router and experts) equal one process running all
ranks' tokens through all experts; the uneven all-to-all equals `all_to_all_single`."""
import datetime
import os
import traceback

import torch
import torch.distributed as dist
from spawned import spawn_ranks  # tests/spawned.py

DEADLINE_S = 240
WORLD = 3


def _inputs(rank):
    return torch.randn(3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + rank))


def _check(rank):
    from pipelib.comm.registry import collective_info
    from pipelib.expert_parallel.layer import MoE, MoESpec

    spec = MoESpec(num_experts=6, k=2, capacity_factor=1.0)
    ref = MoE(spec, 8, layer=0, seed=1, n_layer=2).double()
    want = [ref(_inputs(r)) for r in range(WORLD)]
    sum(w.square().sum() for w in want).backward()   # every rank's tokens, one process
    moe = MoE(spec, 8, layer=0, seed=1, n_layer=2).double().shard(dist.group.WORLD)
    y = moe(_inputs(rank))
    y.square().sum().backward()
    router = moe.router.weight.grad.clone()
    dist.all_reduce(router)   # the router is replicated: its gradient sums over the ranks
    m = torch.randint(0, 4, (WORLD, WORLD), generator=torch.Generator().manual_seed(3))  # rows i -> j
    x = torch.randn(int(m[rank].sum()), 3, generator=torch.Generator().manual_seed(rank))
    info = collective_info("all_to_all_uneven")
    ins, outs = m[rank].tolist(), m[:, rank].tolist()
    return {"experts": sorted(moe.experts, key=int),
            "uneven": torch.equal(info.run(x, None, input_splits=ins, output_splits=outs),
                                  info.twin(x, None, input_splits=ins, output_splits=outs)),
            "output": torch.allclose(y, want[rank], atol=1e-12),
            "expert_grads": all(torch.allclose(p.grad, dict(ref.named_parameters())[k].grad, atol=1e-12)
                                for k, p in moe.named_parameters() if k.startswith("experts.")),
            "router_grad": torch.allclose(router, ref.router.weight.grad, atol=1e-12)}


def _worker(rank, path):
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        try:
            out = _check(rank)
        except Exception:
            out = {"error": traceback.format_exc()}
        torch.save(out, os.path.join(path, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_expert_parallel_moe_on_plain_torch_distributed(tmp_path):
    outs = spawn_ranks(_worker, WORLD, tmp_path, DEADLINE_S)
    assert not [o["error"] for o in outs if "error" in o]
    assert [o["experts"] for o in outs] == [["0", "1"], ["2", "3"], ["4", "5"]]
    assert all(o["output"] and o["expert_grads"] and o["router_grad"] and o["uneven"] for o in outs), outs
