"""Context parallelism across a whole tiny GPT (`context_parallel.model_step`): a few AdamW
steps with the sequence sharded over 2, 3 and 4 ranks, every layout, equal to one process training
on the whole sequence (losses, gradients, parameters); on a cluster and under plain
torch.distributed; and the global positions are what makes it so."""
import os
import sys

import pytest
import torch
import torch.distributed as dist

from pipelib.context_parallel.model_step import cp_recipe
from pipelib.context_parallel.partition import LAYOUTS
from pipelib.model import GPTConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comm"))
from subgroups import group as _group  # noqa: E402  tests/comm/subgroups.py
from spawned import spawn_ranks  # tests/spawned.py

CFG = GPTConfig(vocab_size=17, block_size=32, n_layer=2, n_head=2, n_embd=16)
B, S, STEPS = 2, 24, 3   # 24 splits into 2n zigzag chunks for n = 2, 3, 4


def _check(result, ref):
    assert result.losses == pytest.approx(ref.losses, rel=0, abs=1e-12)
    for what in ("grads", "params"):
        got, want = getattr(result, what), getattr(ref, what)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-10, msg=lambda e, k=k, w=what: f"{w} {k}: {e}")


def _cp(ranks, layout):
    from pipelib.context_parallel.model_step import cp_train

    return cp_train(CFG, B, S, STEPS, group=_group(ranks), layout=layout)


@pytest.mark.cluster
@pytest.mark.parametrize("ranks", [(0, 1, 2, 3), (1, 2, 3)])
def test_cp_gpt_training_equals_one_process(cluster4, ranks):
    ref = cp_recipe(CFG, B, S, STEPS).reference()
    assert ref.losses[-1] < ref.losses[0]                     # it trains
    for layout in LAYOUTS:
        res = [r for r in cluster4.run(_cp, ranks, layout) if r is not None]
        assert len(res) == len(ranks)
        for r in res:
            _check(r, ref)
        pos = torch.cat([r.stats["positions"] for r in res])
        assert sorted(pos.tolist()) == list(range(S))          # every global position, once


def _first(layout, global_positions):
    from pipelib.context_parallel.model_step import cp_first_loss

    return cp_first_loss(CFG, B, S, layout=layout, global_positions=global_positions)


@pytest.mark.cluster
def test_global_positions_matter(cluster4):
    from pipelib.context_parallel.model_step import check_training, cp_train

    want = cp_recipe(CFG, B, S, 1).reference().losses[0]
    for layout in ("zigzag", "striped", "contiguous"):
        assert cluster4.run(_first, layout, True)[0] == pytest.approx(want, abs=1e-12)
        assert abs(cluster4.run(_first, layout, False)[0] - want) > 1e-6, layout   # shard at 0..c-1: wrong
    res = cluster4.run(cp_train, CFG, B, S, 2)
    assert check_training(res, cp_recipe(CFG, B, S, 2).reference()) < 1e-10
    with pytest.raises(AssertionError, match="differs from one process"):
        check_training(res, cp_recipe(CFG, B, S, 2, lr=2e-2).reference())      # the check can fail


# ----------------------------------------------------------------------------- plain torch.distributed
def _worker(rank, path):
    import datetime

    from pipelib.context_parallel.model_step import cp_train

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        torch.save(cp_train(CFG, B, S, STEPS, layout="zigzag"), os.path.join(path, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_cp_gpt_training_without_a_cluster(tmp_path):
    outs = spawn_ranks(_worker, 2, tmp_path, 180)
    ref = cp_recipe(CFG, B, S, STEPS).reference()
    for out in outs:
        _check(out, ref)
