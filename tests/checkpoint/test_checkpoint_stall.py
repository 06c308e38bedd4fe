"""A stalled rank is named by `monitored_barrier` within its timeout (three spawned gloo ranks)."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 3


def _worker(rank, path):
    store = dist.FileStore(os.path.join(path, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    from pipelib.checkpoint.stalls import stall_probe

    torch.save(stall_probe(stalled_rank=2, stall_s=4.0, timeout_s=1.0), os.path.join(path, f"out{rank}.pt"))
    os._exit(0)  # the group is left half-exchanged: no orderly teardown


def test_monitored_barrier_names_the_stalled_rank(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    out = [torch.load(tmp_path / f"out{r}.pt", weights_only=True) for r in range(WORLD)]
    assert "Ranks 2 failed to pass monitoredBarrier in 1000 ms" in out[0]["error"]
    assert out[0]["seconds"] < 4.0  # named by the barrier's timeout, not after the stall ended
    assert all(o["error"] is not None for o in out[1:])  # every rank learns of it
