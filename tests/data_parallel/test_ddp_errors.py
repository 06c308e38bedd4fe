"""Bad input to DDP gets a clear error before any engine work (chapter 07, issue 13 item 6),
and no_sync misuse is caught on the rank that makes it, before any message."""
import pytest

from pipelib.data_parallel.buckets import Bucket, check_bucket_bytes, plan_buckets, ring_bytes_per_rank
from pipelib.data_parallel.runner import check_run, run_ddp
from pipelib.model import GPTConfig
from pipelib.runtime.errors import RankError

TINY = GPTConfig(vocab_size=16, block_size=4, n_layer=1, n_head=2, n_embd=8)


class NoEngines:
    """A cluster whose engines must not be touched: any run or reset fails the test."""

    world_size = 4

    def run(self, *a, **k):
        raise AssertionError("engine work started before the arguments were checked")

    reset = trace = run


@pytest.mark.parametrize("kw,words", [
    (dict(bucket_bytes=0), ["bucket_bytes=0", ">= 1", "25 MiB"]),
    (dict(bucket_bytes=-5), ["bucket_bytes=-5"]),
    (dict(bucket_bytes=1.5), ["bucket_bytes=1.5"]),
    (dict(ranks=8), ["8 ranks", "larger than the cluster of 4", "world_size=8"]),
    (dict(ranks=[0, 1, 2, 3, 4]), ["outside", "0..3"]),
    (dict(ranks=[1, 1]), ["distinct"]),
    (dict(step="zero"), ["step='zero'", "no_sync"]),
    (dict(comm="nccl"), ["comm='nccl'", "gloo"]),
    (dict(batch=6, ranks=4), ["batch=6", "multiple of 4"]),
    (dict(batch=8, accumulate=3), ["multiple of 12"]),
    (dict(optimizer="lamb"), ["lamb", "adam"]),
    (dict(model_seeds=[0, 1]), ["2 seeds for 4 ranks"]),
])
def test_bad_input_before_engine_work(kw, words):
    with pytest.raises(ValueError) as e:
        run_ddp(NoEngines(), config=TINY, **kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_check_run_returns_the_group():
    assert check_run(4, "overlap", 2, 8, 1, 3, 1024, "pipelib", "adam") == [0, 1]
    assert check_run(4, "overlap", [3, 1], 8, 2, 3, 1024, "gloo", "sgd") == [1, 3]


def test_buckets_follow_backward_order_and_the_limit():
    sizes = [("a", 10), ("b", 300), ("c", 5), ("d", 20)]  # registration order
    bs = plan_buckets(sizes, bucket_bytes=100)  # 4 bytes each: d=80, c=20 -> 100 closes
    assert [b.names for b in bs] == [("d", "c"), ("b",), ("a",)]
    assert bs[0].offsets == (0, 20) and bs[0].numel == 25
    assert plan_buckets(sizes, 1 << 30) == [Bucket(0, ("d", "c", "b", "a"), (20, 5, 300, 10))]
    assert len(plan_buckets(sizes, 1)) == 4  # one tensor per bucket: step 1's messages
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        check_bucket_bytes(0)


def test_ring_bytes_per_rank():
    assert ring_bytes_per_rank(1000, 4) == 4 * 2 * 750          # 2 (N-1)/N numel when N divides
    assert ring_bytes_per_rank(10, 1) == 0
    odd = [ring_bytes_per_rank(10, 4, 4, r) for r in range(4)]  # chunks 3, 3, 2, 2
    assert odd == [4 * (20 - 3 - 3), 4 * (20 - 3 - 2), 4 * (20 - 2 - 2), 4 * (20 - 2 - 3)]


# ---------------------------------------------------------------- no_sync misuse, on the ranks
def _misuse(case):
    import torch.distributed as dist

    from pipelib.data_parallel.ddp import DDP
    from pipelib.data_parallel.runner import build_model, global_batch, loss_of

    ddp = DDP(build_model(TINY), None, bucket_bytes=256)
    x, y = global_batch(TINY, 4, 0)
    try:
        if case == "finish inside no_sync":
            with ddp.no_sync():
                ddp.backward(loss_of(ddp, x, y))
                ddp.finish_gradients()
        elif case == "only no_sync backwards":
            with ddp.no_sync():
                ddp.backward(loss_of(ddp, x, y))
            ddp.finish_gradients()
        elif case == "forward before finish":
            ddp.backward(loss_of(ddp, x, y))
            loss_of(ddp, x, y)
        elif case == "nested":
            with ddp.no_sync():
                with ddp.no_sync():
                    pass
        elif case == "right":  # accumulate, then the last backward outside: no error
            with ddp.no_sync():
                ddp.backward(loss_of(ddp, x, y))
            ddp.backward(loss_of(ddp, x, y))
            ddp.finish_gradients()
            return dist.get_rank()
    finally:
        ddp.close()


@pytest.mark.cluster
@pytest.mark.parametrize("case,words", [
    ("finish inside no_sync", ["inside no_sync()", "outside no_sync()"]),
    ("only no_sync backwards", ["no backward ran outside no_sync()", "never all-reduced"]),
    ("forward before finish", ["unwaited", "finish_gradients() before optimizer.step()"]),
    ("nested", ["already inside no_sync()"]),
])
def test_no_sync_misuse(cluster4, case, words):
    with pytest.raises(RankError) as e:
        cluster4.run(_misuse, case)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert cluster4.run(_misuse, "right") == [0, 1, 2, 3]  # the cluster is still usable


def _wrap_with_seeds(seeds):
    import torch.distributed as dist

    from pipelib.data_parallel.ddp import BucketedGrads
    from pipelib.data_parallel.runner import build_model

    BucketedGrads(build_model(TINY, seeds[dist.get_rank()]), None)


@pytest.mark.cluster
def test_replicas_that_differ_at_wrap_time(cluster4):
    with pytest.raises(RankError) as e:
        cluster4.run(_wrap_with_seeds, [0, 0, 5, 5])
    msg = str(e.value)
    assert "'embed.wte.weight'" in msg and "rank(s) [2, 3]" in msg and "same seed" in msg
    with pytest.raises(RankError, match="differs"):
        run_ddp(cluster4, "no_sync", TINY, steps=1, batch=4, model_seeds=[0, 0, 0, 1])
