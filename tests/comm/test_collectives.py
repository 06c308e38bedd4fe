"""Every from-scratch collective against gloo's built-in, on the world and on sub-groups;
exact byte counts; alpha-beta time exact on the simulated device; mismatches as clear errors."""
import pytest
from subgroups import group as _group  # tests/comm/subgroups.py

from pipelib.comm import collectives as C
from pipelib.comm.alphabeta import expected_bytes, predicted_time
from pipelib.runtime.errors import RankError

pytestmark = pytest.mark.cluster


def _compare(ranks, sizes, big):
    """Run every entry of the registry, and its twin (torch's built-in), on the group of `ranks`:
    the same result and exactly `expected_bytes`. Returns a list of failures (empty = ok)."""
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.comm.registry import REGISTRY

    g = _group(ranks)
    if dist.get_rank() not in ranks:
        return []
    n, me = len(ranks), ranks.index(dist.get_rank())
    root, bad = n - 1, []
    for size in sizes:
        for dtype, ops in ((torch.float32, ("sum", "avg", "max")), (torch.int64, ("sum", "max"))):
            if size == big and dtype != torch.float32:
                continue
            gen = torch.Generator().manual_seed(1000 * dist.get_rank() + size)
            x = (torch.randn(size, generator=gen) * 100).to(dtype)
            for info in REGISTRY.values():
                for op in (ops if info.reduces else ("sum",)):
                    if size == big and op != "sum":
                        continue
                    case = f"{info.name} {op} n={n} size={size} {dtype}"
                    try:
                        want, twin_ran = info.twin(x.clone(), g, root=root, op=op), True
                    except ValueError:  # scatter: dim 0 must split into n equal blocks
                        want, twin_ran = None, False
                    comms.reset_counters()
                    try:
                        got, ran = info.run(x.clone(), g, root=root, op=op), True
                    except ValueError:  # the same, and halving/doubling: a power-of-two group
                        got, ran = None, False
                    sent = comms.counters()["bytes_sent"]
                    if not (ran and twin_ran):
                        if sent or (ran != twin_ran and n & (n - 1) == 0):  # refused: before any message
                            bad.append(f"{case}: ours ran {ran}, the twin ran {twin_ran}, sent {sent} bytes")
                        continue
                    exact = dtype != torch.float32 or op == "max" or not info.reduces
                    if not info.holds_result(me, root):
                        pass
                    elif got is None or want is None:
                        if got is not want:
                            bad.append(f"{case}: ours {type(got).__name__}, twin {type(want).__name__}")
                    elif not (torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-5, atol=1e-3)):
                        bad.append(f"{case}: values differ")
                    exp = info.run_bytes(x.shape, x.element_size(), n, me, root)
                    if sent != exp:
                        bad.append(f"{case}: sent {sent} bytes, formula {exp}")
    return bad


@pytest.mark.parametrize("ranks", [(0, 1), (1, 2, 3), (0, 1, 2, 3)], ids=["n2", "n3-subgroup", "n4"])
def test_every_collective_equals_the_builtin(cluster4, ranks):
    n = len(ranks)
    sizes = sorted({1, 7, max(n - 1, 1), n + 1, 1000, 2**20})
    results = cluster4.run(_compare, list(ranks), sizes, 2**20, timeout=60)
    assert [b for r in results for b in r] == []


def _multi_dim():
    import torch
    import torch.distributed as dist

    r = dist.get_rank()
    x = torch.arange(5 * 3, dtype=torch.float64).view(5, 3) + r
    ref = x.clone()
    dist.all_reduce(ref)
    y = C.all_reduce(x.t().clone().t())  # non-contiguous input: reduced in place all the same
    ag = C.all_gather(x)
    rs = C.reduce_scatter(x)
    return (torch.equal(y, ref), ag.shape == (20, 3), torch.equal(rs, torch.tensor_split(ref, 4)[r]))


def test_multi_dimensional_and_non_contiguous(cluster4):
    assert cluster4.run(_multi_dim) == [(True, True, True)] * 4


def _timed(name, numel):
    import torch

    from pipelib.runtime.device import current

    x = torch.ones(numel)
    fn = getattr(C, name)
    if name in ("broadcast", "reduce"):
        fn(x, 0)
    else:
        fn(x)
    return current().now()


@pytest.mark.parametrize("name", ["all_reduce", "all_reduce_naive", "reduce_scatter", "all_gather",
                                  "all_to_all", "broadcast", "reduce"])
def test_alpha_beta_time_is_exact_on_the_sim_device(cluster4, name):
    from pipelib.costmodel import PROFILES

    link = PROFILES["toy-gpu"].link
    numel = 4096
    cluster4.reset()
    ends = cluster4.run(_timed, name, numel)
    want = predicted_time(name, 4 * numel, 4, link.alpha, link.beta)
    assert max(ends) == pytest.approx(want, rel=1e-12, abs=1e-15)
    trace = cluster4.trace()
    coll = trace.filter(kind="collective")
    assert len(coll) == 4 and all(e.label == name for e in coll)
    assert [e.bytes for e in sorted(coll, key=lambda e: e.rank)] == [
        expected_bytes(name, (numel,), 4, 4, r) for r in range(4)]


def _mismatch(kind):
    import torch
    import torch.distributed as dist

    r = dist.get_rank()
    if kind == "shape":
        C.all_reduce(torch.ones(4 + (r == 2)))
    elif kind == "dtype":
        C.all_gather(torch.ones(3, dtype=torch.int64 if r == 1 else torch.float32))
    elif kind == "root":
        C.broadcast(torch.ones(3), src=r % 2)
    elif kind == "avg-int":
        C.all_reduce(torch.ones(3, dtype=torch.int32), op="avg")
    elif kind == "collective":
        (C.all_gather if r == 3 else C.all_reduce)(torch.ones(4))


@pytest.mark.parametrize("kind,pattern", [
    ("shape", r"rank 2 \(5,\) float32"),
    ("dtype", r"rank 1 \(3,\) int64"),
    ("root", r"root differs: rank 0 0, rank 1 1"),
    ("avg-int", r"op 'avg' on torch.int32"),
    ("collective", r"collective differs: rank 0 all_reduce, rank 1 all_reduce, rank 2 all_reduce, rank 3 all_gather"),
])
def test_mismatch_is_a_clear_error_and_the_cluster_stays_usable(cluster4, kind, pattern):
    with pytest.raises(RankError, match=pattern) as err:
        cluster4.run(_mismatch, kind)
    assert sorted(err.value.errors) == [0, 1, 2, 3]  # every rank raised: nobody hangs
    assert cluster4.run(_timed, "all_reduce", 8)  # usable again


def _labelled():
    import torch

    C.all_reduce(torch.ones(8), label="blocks.0.mlp.c_proj g forward")
    C.all_gather(torch.ones(2))


def test_a_label_names_the_collective_event(cluster4):
    """label= names the COLLECTIVE event "<name>: <label>" (tensor parallelism's layers), and
    leaves its messages' labels, which the figures replay, as they were."""
    from pipelib.viz import comm as viz_comms

    cluster4.reset()
    cluster4.run(_labelled)
    trace = cluster4.trace()
    assert sorted({e.label for e in trace.filter(kind="collective")}) == [
        "all_gather", "all_reduce: blocks.0.mlp.c_proj g forward"]
    assert {r["name"] for r in viz_comms.message_steps(trace)} == {"all_reduce", "all_gather"}


def _one(name):
    import torch

    x = torch.ones(10)
    if name == "broadcast":
        C.broadcast(x, 0)
    else:
        getattr(C, name)(x)


@pytest.mark.parametrize("name", ["all_reduce", "all_reduce_naive", "all_gather", "broadcast", "reduce_scatter",
                                  "all_to_all"])
def test_replay_from_the_trace_ends_where_the_collective_promises(cluster4, name):
    from pipelib.viz import comm as viz_comms

    cluster4.reset()
    cluster4.run(_one, name)
    trace = cluster4.trace()
    rows = viz_comms.message_steps(trace, name)
    assert sum(r["bytes"] for r in rows) == sum(expected_bytes(name, (10,), 4, 4, r) for r in range(4))
    final = viz_comms.replay(rows, name, 4)[-1]
    full = frozenset(range(4))
    if name == "reduce_scatter":
        assert [final[r][r] for r in range(4)] == [full] * 4  # rank r owns chunk r, fully reduced
    elif name in ("all_to_all", "all_gather"):  # slot s of every rank holds rank s's block
        assert all(final[r][s] == {s} for r in range(4) for s in range(4))
    elif name == "broadcast":
        assert all(final[r][0] == {0} for r in range(4))
    else:
        assert all(cell == full for row in final for cell in row)
    fig = viz_comms.collective_animation(trace, name)
    assert len(fig.frames) == len({r["step"] for r in rows}) + 1


def _segmented(ranks, cases):
    """Ring collectives cut into segments (as on a real device) against gloo's built-ins."""
    import torch
    import torch.distributed as dist

    from pipelib.comm import collectives as C
    from pipelib.comm import p2p as comms

    g = _group(ranks)
    if dist.get_rank() not in ranks:
        return []
    n, me, bad = len(ranks), ranks.index(dist.get_rank()), []
    for shape, seg in cases:
        gen = torch.Generator().manual_seed(7 * dist.get_rank() + shape[0])
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        for op in ("sum", "avg", "max"):
            ref = x.clone()
            dist.all_reduce(ref, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=g)
            ref = ref / n if op == "avg" else ref
            for name, got, want in (
                    ("all_reduce", lambda: C.all_reduce(x.clone(), op, g, segment_bytes=seg), ref),  # noqa: B023
                    ("reduce_scatter", lambda: C.reduce_scatter(x, op, g, segment_bytes=seg),  # noqa: B023
                     torch.tensor_split(ref, n)[me])):
                comms.reset_counters()
                y = got()
                sent = comms.counters()["bytes_sent"]
                if not torch.allclose(y, want, rtol=1e-12, atol=1e-12):
                    bad.append(f"{name} {op} n={n} shape={shape} segment_bytes={seg}: values differ")
                if sent != expected_bytes(name, shape, 8, n, me):
                    bad.append(f"{name} n={n} shape={shape} segment_bytes={seg}: sent {sent} bytes")
        want = torch.empty((n * shape[0], *shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(want, x, group=g)
        if not torch.equal(C.all_gather(x, g, segment_bytes=seg), want):
            bad.append(f"all_gather n={n} shape={shape} segment_bytes={seg}: values differ")
    return bad


@pytest.mark.parametrize("ranks", [(0, 1), (1, 2, 3), (0, 1, 2, 3)], ids=["n2", "n3-subgroup", "n4"])
def test_segmented_rings_equal_the_builtin(cluster4, ranks):
    """segment_bytes cuts every ring chunk into pipelined messages (the default on real devices;
    given explicitly here on the simulated cluster): values and bytes must not change."""
    cases = [((1,), 8), ((7,), 8), ((7,), 16), ((1000,), 800), ((1001,), 3000), ((9, 5), 48), ((4099,), 0)]
    assert [b for r in cluster4.run(_segmented, list(ranks), cases, timeout=60) for b in r] == []


def _measure(ranks, sizes):
    from pipelib.comm import lab

    g = _group(ranks)
    return lab.measure_collective("all_reduce", sizes, repeats=1, group=g, warmup=0)


@pytest.mark.parametrize("ranks", [(0, 1), (1, 2, 3), (0, 1, 2, 3)], ids=["n2", "n3-subgroup", "n4"])
def test_ring_all_reduce_time_is_the_alpha_beta_prediction_on_sim(cluster4, ranks):
    """Virtual-clock time of the ring all-reduce, from a common start to its slowest rank,
    equals 2(n-1) alpha + 2(n-1)/n N / beta at every size (sizes divisible by n)."""
    from pipelib.comm.alphabeta import compare
    from pipelib.costmodel import PROFILES

    link = PROFILES["toy-gpu"].link
    sizes = [48, 4800, 48 * 1024, 48 * 2**14]
    rows = [r for r in cluster4.run(_measure, list(ranks), sizes, timeout=60) if r is not None]
    assert len(rows) == len(ranks) and all(r == rows[0] for r in rows)  # the same table on every rank
    table = compare("all_reduce", rows[0], len(ranks), link.alpha, link.beta)
    assert [t["bytes"] for t in table] == sizes
    for t in table:
        assert t["measured"] == pytest.approx(t["predicted"], rel=1e-12), t


def _shift(sizes):
    from pipelib.comm import lab

    return lab.ring_shift(sizes, repeats=1, warmup=0)


def test_ring_shift_fit_is_the_link_on_sim(cluster4):
    from pipelib.comm.alphabeta import fit_alpha_beta
    from pipelib.costmodel import PROFILES

    link = PROFILES["toy-gpu"].link
    rows = cluster4.run(_shift, [1, 1024, 2**20])[0]
    alpha, beta = fit_alpha_beta([r["bytes"] for r in rows], [r["time"] for r in rows])
    assert alpha == pytest.approx(link.alpha, rel=1e-9) and beta == pytest.approx(link.beta, rel=1e-9)


def _bad_args(kind):
    import torch

    from pipelib.comm import lab

    if kind == "segment":
        C.all_reduce(torch.ones(4), segment_bytes=-1)
    elif kind == "name":
        lab.measure_collective("allreduce", [64])


@pytest.mark.parametrize("kind,pattern", [
    ("segment", r"all_reduce: segment_bytes=-1; pass an integer >= 0 "
                r"\(bytes per ring message; 0 = one message per chunk"),
    ("name", r"unknown collective 'allreduce'"),
])
def test_bad_arguments_are_value_errors(cluster4, kind, pattern):
    with pytest.raises(RankError, match=pattern):
        cluster4.run(_bad_args, kind)
    assert cluster4.run(_timed, "all_reduce", 8)  # nothing was posted: the cluster is usable
