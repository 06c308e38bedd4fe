"""DDP's four steps on the cluster: equal to one process, bytes from the trace, torch's DDP.

Cluster tests (simulated devices, virtual clock): after 3 optimizer steps (Adam and SGD) every
step of chapter 07 leaves the parameters of one process training on the whole batch, on 2 and
4 ranks, with a parameter count that no world size divides (6435, odd); the bytes each rank
sends per step, counted from the trace's SEND events, are exactly the ring all-reduce's
2 psi (N-1)/N; the gradients equal torch.nn.parallel.DistributedDataParallel's on the same data.
"""
import pytest
import torch

from pipelib.data_parallel.buckets import plan_buckets, ring_bytes_per_rank
from pipelib.data_parallel.runner import STEPS, run_ddp
from pipelib.model import GPTConfig
from pipelib.recipe import Recipe
from pipelib.results import check_against_reference
from pipelib.trace import Kind

ODD = GPTConfig(vocab_size=33, block_size=8, n_layer=2, n_head=3, n_embd=15)   # 6435 parameters
EVEN = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)  # every tensor divisible by 4
TOL = dict(rtol=1e-4, atol=1e-5)


def _ranks(n):
    return list(range(n))


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("step,optimizer,accumulate", [
    ("all_reduce", "adam", 1), ("buckets", "sgd", 1), ("overlap", "adam", 1), ("no_sync", "adam", 2),
    ("no_sync", "sgd", 1)])
def test_each_step_equals_one_process(cluster4, n, step, optimizer, accumulate):
    ref = Recipe(ODD, batch_size=8, steps=3, optimizer=optimizer).reference()
    assert sum(p.numel() for p in ref.params.values()) % n  # psi does not divide by n
    res = run_ddp(cluster4, step, ODD, ranks=_ranks(n), steps=3, batch=8, accumulate=accumulate,
                  bucket_bytes=2048, optimizer=optimizer)
    assert res[n:] == [None] * (4 - n)
    agreed = check_against_reference(res, ref, shared=True, **TOL)
    assert agreed.num_tensors == 2 * len(ref.params) and agreed.num_losses == 3
    assert res[0].losses == pytest.approx(ref.losses, rel=1e-5)
    # the replicas stay bitwise equal to each other (not only close to the reference)
    for r in res[1:n]:
        assert all(torch.equal(r.params[k], res[0].params[k]) for k in r.params)


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
def test_bytes_per_rank_per_step_from_the_trace(cluster4, n):
    steps = 3
    res = run_ddp(cluster4, "overlap", EVEN, ranks=_ranks(n), steps=steps, batch=8, bucket_bytes=4096)
    trace = cluster4.trace()
    psi_bytes = 4 * res[0].stats["num_params"]
    assert all(s["num_params"] * 4 % n == 0 for s in [res[0].stats])
    for r in range(n):
        sent = trace.bytes_sent(r)
        assert sent == steps * 2 * psi_bytes * (n - 1) // n, (r, sent)  # 2 psi (N-1)/N, exactly
        assert res[r].stats["bytes_sent"] == (sent // steps,) * steps   # the counters agree
    # odd sizes: the exact ring bytes of each bucket (2 numel - two chunks), from the trace too
    res = run_ddp(cluster4, "buckets", ODD, ranks=_ranks(n), steps=1, batch=8, bucket_bytes=2048)
    trace = cluster4.trace()
    sizes = [(k, v.numel()) for k, v in res[0].params.items()]
    buckets = plan_buckets(sizes, 2048)
    assert len(buckets) == res[0].stats["buckets"] > 1
    for r in range(n):
        assert trace.bytes_sent(r) == sum(ring_bytes_per_rank(b.numel, n, 4, r) for b in buckets)


@pytest.mark.cluster
def test_overlap_on_the_virtual_clock(cluster4):
    """Step 3's all-reduces start during backward (COLLECTIVE events inside the B span) and the
    step is shorter than step 2's, which waits for the whole backward first."""
    times = {}
    for step in ("buckets", "overlap"):
        res = run_ddp(cluster4, step, EVEN, ranks=_ranks(2), steps=1, batch=8, bucket_bytes=2048)
        times[step] = res[0].times[0]
        trace = cluster4.trace()
        b_end = max(e.end for e in trace.filter(rank=0, kind=Kind.COMPUTE, label="B"))
        first_ar = min(e.start for e in trace.filter(rank=0, kind=Kind.COLLECTIVE))
        assert (first_ar < b_end) == (step == "overlap")
    assert times["overlap"] < times["buckets"]


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
def test_same_gradients_as_torch_ddp(cluster4, n):
    kw = dict(ranks=_ranks(n), steps=3, batch=8, bucket_bytes=2048, accumulate=2)
    mine = run_ddp(cluster4, "no_sync", ODD, **kw)
    torch_ = run_ddp(cluster4, "torch", ODD, **kw)
    for a, b in zip(mine[:n], torch_[:n]):
        assert a.grads.keys() == b.grads.keys()
        for k in a.grads:
            torch.testing.assert_close(a.grads[k], b.grads[k], **TOL, msg=lambda m, k=k: f"{k}: {m}")
            torch.testing.assert_close(a.params[k], b.params[k], **TOL)


@pytest.mark.cluster
def test_gloo_switch_equals_pipelib_ring(cluster4):
    ref = Recipe(ODD, batch_size=8, steps=3).reference()
    for comm in ("gloo", "pipelib"):
        res = run_ddp(cluster4, "overlap", ODD, steps=3, batch=8, bucket_bytes=2048, comm=comm)
        check_against_reference(res, ref, shared=True, **TOL)
    assert set(STEPS) == {"all_reduce", "buckets", "overlap", "no_sync", "torch", "bf16", "torch_bf16"}


# cpu2 (tests/conftest.py): the session's two real CPU engines, for the overlapped step's real
# lanes (a worker thread or gloo's)


@pytest.mark.cluster
def test_real_engines_overlap_equals_torch_ddp(cpu2):
    """On real processes the all-reduces run on a worker thread (our ring) or on gloo's threads,
    started from hooks during backward; the result equals torch's DDP, with or without no_sync."""
    kw = dict(steps=3, batch=8, bucket_bytes=2048)
    theirs = run_ddp(cpu2, "torch", ODD, **kw)
    for step, comm in (("overlap", "pipelib"), ("overlap", "gloo"), ("all_reduce", "pipelib")):
        mine = run_ddp(cpu2, step, ODD, comm=comm, **kw)
        trace = cpu2.trace()
        for a, b in zip(mine, theirs):
            for k in a.grads:
                torch.testing.assert_close(a.grads[k], b.grads[k], **TOL)
                torch.testing.assert_close(a.params[k], b.params[k], **TOL)
        if comm == "pipelib":  # every ring message is on the trace, on real devices too
            assert trace.bytes_sent(0) == sum(mine[0].stats["bytes_sent"]) > 0
    acc = dict(kw, accumulate=2)
    mine, theirs = run_ddp(cpu2, "no_sync", ODD, **acc), run_ddp(cpu2, "torch", ODD, **acc)
    for a, b in zip(mine, theirs):
        for k in a.grads:
            torch.testing.assert_close(a.params[k], b.params[k], **TOL)


@pytest.mark.cluster
def test_versus_alternates_sides_that_train_alike(cpu2):
    from pipelib.data_parallel.versus import run_versus

    r = run_versus(cpu2, ODD, sides=("torch", "overlap", "overlap_ring"), steps=2, batch=4, bucket_bytes=2048)
    assert {k: len(v) for k, v in r["times"].items()} == {"torch": 2, "overlap": 2, "overlap_ring": 2}
    assert all(t > 0 for v in r["times"].values() for t in v)
    assert max(r["max_param_diff"].values()) < 1e-5          # same data, same steps: torch's parameters
    with pytest.raises(ValueError, match="torch's among them"):
        run_versus(cpu2, ODD, sides=("overlap",))
