"""Chapter 09's backward overlap (Korthikanti et al. §6.2): the column-parallel layers launch
dX's all-reduce (under sequence parallelism its reduce-scatter) on the communication lane while
the weight gradient computes. Gradients bitwise those of the non-overlapped step and equal to
one process; the simulated step no longer, and shorter by exactly what the formula says."""
import math
import os

import pytest
import torch

from pipelib.costmodel import PROFILES
from pipelib.model import GPTConfig
from pipelib.results import check_against_reference
from pipelib.tensor_parallel.formulas import tp_overlap_hidden
from pipelib.tensor_parallel.step import tp_recipe, tp_train_step

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)
B, S = 2, 16


def _step(cluster, t, sp, overlap, dtype):
    cluster.reset()
    res = cluster.run(tp_train_step, CFG, B, S, t, sequence_parallel=sp, overlap=overlap, timed=True,
                      dtype=dtype)
    return res, cluster.trace()


@pytest.mark.cluster
@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_overlap_gives_the_same_gradients_and_hides_what_the_formula_says(cluster4, t, sp, dtype):
    plain, plain_trace = _step(cluster4, t, sp, False, dtype)
    over, over_trace = _step(cluster4, t, sp, True, dtype)
    assert torch.equal(plain[0].loss, over[0].loss)
    assert plain[0].grads.keys() == over[0].grads.keys()
    assert all(torch.equal(plain[0].grads[n], over[0].grads[n]) for n in plain[0].grads)
    ref = tp_recipe(CFG, B, S, dtype=dtype).first_step()
    loss, grads = ref.loss, ref.grads
    tol = {} if dtype == "float64" else {"rtol": 1e-5, "atol": 1e-6}
    check_against_reference(over, loss, grads, **tol)
    link, width = PROFILES["toy-gpu"].link, torch.finfo(getattr(torch, dtype)).bits // 8
    hidden = tp_overlap_hidden(CFG.n_layer, B, S, CFG.n_embd, t, flops=PROFILES["toy-gpu"].flops,
                               alpha=link.alpha, beta=link.beta, itemsize=width, sequence_parallel=sp)
    for rank in range(t):
        before, after = plain[rank].stats["step_time"], over[rank].stats["step_time"]
        assert after < before
        assert math.isclose(before - after, hidden, rel_tol=1e-9), (before - after, hidden)
        # the same collectives, the same bytes: only when they run changed
        calls = [sorted((e.label, e.bytes) for e in tr.filter(kind="collective", rank=rank).events)
                 for tr in (plain_trace, over_trace)]
        assert calls[0] == calls[1]


@pytest.mark.cluster
def test_the_trace_shows_the_all_reduce_under_the_weight_gradient(cluster4):
    _, trace = _step(cluster4, 2, False, True, "float32")
    compute = trace.filter(kind="compute", rank=0).events
    hidden = [e for e in trace.filter(kind="collective", rank=0).events
              if "mlp.c_fc f backward" in e.label]
    assert len(hidden) == CFG.n_layer
    for e in hidden:  # a compute event (dW) runs while the all-reduce is on the lane
        assert any(c.start < e.end and e.start < c.end for c in compute), e.label
    _, plain = _step(cluster4, 2, False, False, "float32")
    for e in plain.filter(kind="collective", rank=0).events:  # without overlap: never
        assert not any(c.start < e.end and e.start < c.end
                       for c in plain.filter(kind="compute", rank=0).events), e.label


def _plain_torch(rank, path, backend):
    """Two gloo ranks, no cluster: the overlapped layers under plain torch.distributed."""
    import datetime

    import torch.distributed as dist

    from pipelib.model import GPT
    from pipelib.tensor_parallel.apply import apply_tensor_parallel, tp_full_gradients
    from pipelib.tensor_parallel.plan import gpt_tp_plan

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
        x = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(0))
        y = torch.roll(x, 1, 1)
        out = {}
        for overlap in (False, True):
            model = GPT(cfg, seed=0).double()
            tp = apply_tensor_parallel(model, None, gpt_tp_plan(sequence_parallel=True), backend=backend,
                                       overlap=overlap)
            loss = tp.forward_loss(model, x, y)
            loss.backward()
            tp.after_backward(model)
            out[overlap] = tp_full_gradients(model, None)
        ref = GPT(cfg, seed=0).double()
        ref(x, y)[1].backward()
        for name, p in ref.named_parameters():
            assert torch.equal(out[True][name], out[False][name]), name
            torch.testing.assert_close(out[True][name], p.grad, msg=name)
        torch.save(len(out[True]), os.path.join(path, f"ok{rank}"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["pipelib", "torch"])
def test_overlap_without_a_cluster(tmp_path, backend):
    import torch.multiprocessing as mp

    mp.spawn(_plain_torch, args=(str(tmp_path), backend), nprocs=2, join=True)
    assert all((tmp_path / f"ok{r}").exists() for r in range(2))


@pytest.mark.parametrize("sp", [False, True])
def test_overlap_hides_every_backward_collective_exactly_when_each_weight_gradient_outlasts_it(sp):
    # Chapter 09's "a GPT-3-wide layer covers all of it": a column layer hides min(dW, collective),
    # so the whole collective hides exactly when the shortest column layer's dW (c_attn's 3h/t
    # outputs; under SP only c_fc's 4h/t) lasts at least as long. Either side of that device speed:
    from pipelib.comm.alphabeta import predicted_time

    L, b, s, h, t, itemsize, alpha, beta = 2, 1, 2048, 12288, 8, 2, 2e-6, 450e9
    comm = predicted_time("reduce_scatter" if sp else "all_reduce", b * s * h * itemsize, t, alpha, beta)
    columns = 1 if sp else 2
    shortest = 2 * b * s * h * ((4 if sp else 3) * h // t)       # dW FLOPs of the shortest column layer
    crossover = shortest / comm                                  # FLOP/s at which dW == collective
    kw = dict(alpha=alpha, beta=beta, itemsize=itemsize, sequence_parallel=sp)
    slow = tp_overlap_hidden(L, b, s, h, t, flops=0.99 * crossover, **kw)
    fast = tp_overlap_hidden(L, b, s, h, t, flops=1.01 * crossover, **kw)
    assert math.isclose(slow, L * columns * comm, rel_tol=1e-12)
    assert fast < L * columns * comm
