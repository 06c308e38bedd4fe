"""The all-reduces to choose from (halving/doubling, hierarchical), the tree gather and scatter
and the barrier, against gloo's built-ins; exact bytes; the alpha-beta time on the sim device."""
import pytest
from subgroups import group as _group  # tests/comm/subgroups.py

from pipelib.comm.alphabeta import expected_bytes, predicted_time
from pipelib.runtime.errors import RankError

pytestmark = pytest.mark.cluster


def _against_gloo(ranks, sizes):
    import torch
    import torch.distributed as dist

    from pipelib.comm import algorithms as A
    from pipelib.comm import p2p as comms

    g = _group(ranks)
    if dist.get_rank() not in ranks:
        return []
    n, me, bad = len(ranks), ranks.index(dist.get_rank()), []

    def sent(fn, *a, **k):
        comms.reset_counters()
        out = fn(*a, **k)
        return out, comms.counters()["bytes_sent"]

    def bytes_ok(name, b, shape, isz, root=0, **kw):
        exp = expected_bytes(name, shape, isz, n, me, root, **kw)
        if b != exp:
            bad.append(f"{name} n={n} shape={shape} {kw}: sent {b} bytes, formula {exp}")

    for size in sizes:
        for dtype in (torch.float32, torch.float64):
            gen = torch.Generator().manual_seed(1000 * dist.get_rank() + size)
            x = torch.randn(size, generator=gen, dtype=dtype) * 100
            isz = x.element_size()
            for op in ("sum", "avg", "max"):
                ref = x.clone()
                dist.all_reduce(ref, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=g)
                ref = ref / n if op == "avg" else ref
                cases = [("all_reduce_halving_doubling", {})] * (n & (n - 1) == 0) + [
                    ("all_reduce_hierarchical", {"ranks_per_node": p}) for p in (1, 2, n) if n % p == 0]
                for name, kw in cases:
                    y, b = sent(getattr(A, name), x.clone(), op, g, **kw)
                    ok = torch.equal(y, ref) if op == "max" else torch.allclose(y, ref, rtol=1e-5, atol=1e-3)
                    if not ok:
                        bad.append(f"{name} {op} n={n} size={size} {dtype} {kw}: values differ")
                    bytes_ok(name, b, x.shape, isz, **kw)
            for root in range(n):
                want = [torch.empty_like(x) for _ in range(n)] if me == root else None
                dist.gather(x, want, dst=ranks[root], group=g)
                y, b = sent(A.gather_tree, x, root, g)
                if (me == root) != (y is not None) or (me == root and not torch.equal(y, torch.cat(want))):
                    bad.append(f"gather_tree n={n} size={size} root={root}: values differ")
                bytes_ok("gather_tree", b, x.shape, isz, root)
                parts = [x * (i + 1) for i in range(n)] if me == root else None
                want = torch.empty_like(x)
                dist.scatter(want, parts, src=ranks[root], group=g)
                y, b = sent(A.scatter_tree, torch.empty_like(x), parts, root, g)
                if not torch.equal(y, want):
                    bad.append(f"scatter_tree n={n} size={size} root={root}: values differ")
                bytes_ok("scatter_tree", b, x.shape, isz, root)
    _, b = sent(A.barrier, g)
    bytes_ok("barrier", b, (1,), 1)
    return bad


@pytest.mark.parametrize("ranks", [(0, 1), (1, 2, 3), (0, 1, 2, 3)], ids=["n2", "n3-subgroup", "n4"])
def test_algorithms_equal_the_builtin(cluster4, ranks):
    sizes = [1, 3, 7, 1001]
    assert [b for r in cluster4.run(_against_gloo, list(ranks), sizes, timeout=60) for b in r] == []


def _barrier_waits(path):
    import os
    import time

    import torch.distributed as dist

    from pipelib.comm import algorithms as A

    r = dist.get_rank()
    if r == 3:
        time.sleep(0.3)
        open(path, "w").close()
    A.barrier(check=False)
    return os.path.exists(path)


def test_barrier_lets_nobody_leave_early(cluster4, tmp_path):
    assert cluster4.run(_barrier_waits, str(tmp_path / "arrived")) == [True] * 4


def _timed(name, numel):
    import torch

    from pipelib.comm import algorithms as A
    from pipelib.runtime.device import current

    x = torch.ones(numel)
    if name == "barrier":
        A.barrier()
    elif name == "scatter_tree":
        import torch.distributed as dist

        A.scatter_tree(x, [x] * 4 if dist.get_rank() == 0 else None)
    elif name == "all_reduce_hierarchical":
        A.all_reduce_hierarchical(x, ranks_per_node=2)
    else:
        getattr(A, name)(x)
    return current().now()


@pytest.mark.parametrize("name", ["all_reduce_halving_doubling", "all_reduce_hierarchical", "gather_tree",
                                  "scatter_tree", "barrier"])
def test_alpha_beta_time_is_exact_on_the_sim_device(cluster4, name):
    from pipelib.costmodel import PROFILES

    link = PROFILES["toy-gpu"].link
    numel = 4096
    cluster4.reset()
    ends = cluster4.run(_timed, name, numel)
    want = predicted_time(name, 4 * numel, 4, link.alpha, link.beta, ranks_per_node=2)
    assert max(ends) == pytest.approx(want, rel=1e-12, abs=1e-15)
    coll = cluster4.trace().filter(kind="collective")
    assert sorted(e.label for e in coll) == [name] * 4
    kw = {"ranks_per_node": 2} if name == "all_reduce_hierarchical" else {}
    shape = (1,) if name == "barrier" else (numel,)
    assert [e.bytes for e in sorted(coll, key=lambda e: e.rank)] == [
        expected_bytes(name, shape, 1 if name == "barrier" else 4, 4, r, **kw) for r in range(4)]


def _bad(kind):
    import torch
    import torch.distributed as dist

    from pipelib.comm import algorithms as A

    if kind == "power":
        g = dist.new_group([0, 1, 2])
        if dist.get_rank() < 3:
            A.all_reduce_halving_doubling(torch.ones(4), group=g)
    elif kind == "node":
        A.all_reduce_hierarchical(torch.ones(4), ranks_per_node=3)


@pytest.mark.parametrize("kind,pattern", [
    ("power", r"all_reduce_halving_doubling needs a power-of-two group size, got 3 ranks; use all_reduce"),
    ("node", r"ranks_per_node=3 does not divide the group of 4 ranks into nodes; pass a divisor of 4"),
])
def test_bad_group_sizes_are_value_errors(cluster4, kind, pattern):
    with pytest.raises(RankError, match=pattern):
        cluster4.run(_bad, kind)
    assert cluster4.run(_timed, "barrier", 1)  # nothing was posted: the cluster is usable


def test_formulas_closed_forms():
    N, n = 4 * 2**20, 8
    for r in range(n):
        assert expected_bytes("all_reduce_halving_doubling", (2**20,), 4, n, r) == 2 * (n - 1) * N // n
        assert expected_bytes("gather_tree", (2**20,), 4, n, r, 3) == N * {3: 0, 4: 1, 5: 2, 6: 1, 7: 4, 0: 1,
                                                                              1: 2, 2: 1}[r]
    assert sum(expected_bytes("scatter_tree", (5,), 4, 6, r, 2) for r in range(6)) == 20 * 7
    assert expected_bytes("scatter_tree", (5,), 4, 6, 2, 2) == 20 * 5
    a, b = 1e-5, 1e9
    assert predicted_time("all_reduce_halving_doubling", N, 64, a, b) == pytest.approx(12 * a + 2 * 63 / 64 * N / b)
    assert predicted_time("all_reduce_hierarchical", N, 64, a, b, ranks_per_node=8, intra=(a / 10, 10 * b)) == \
        pytest.approx(6 * (a / 10 + N / b / 10) + 14 * a + 2 * 7 / 8 * N / b)
    with pytest.raises(ValueError, match="power-of-two group size, got 6 ranks.*sub-group of 4 ranks"):
        expected_bytes("all_reduce_halving_doubling", (8,), 4, 6, 0)
