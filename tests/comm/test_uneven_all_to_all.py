"""The uneven all-to-all (chapter 16) against gloo's `all_to_all_single` with split sizes: zero
splits, several row shapes, on the world and on sub-groups; the counts exchanged first; bytes
exact from the counters and the trace; ranks that disagree on the counts get a clear error."""
import pytest
from subgroups import group as _group  # tests/comm/subgroups.py

from pipelib.runtime.errors import RankError

pytestmark = pytest.mark.cluster


def _splits(n, seed, zeros=True):
    """An n x n matrix of row counts, sends[i][j] from rank i to rank j, with zeros."""
    import torch

    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 6, (n, n), generator=g)
    if zeros:
        m[torch.rand(n, n, generator=g) < 0.3] = 0
    return m.tolist()


def _against_gloo(ranks, seeds, world=False):
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.comm.registry import collective_info
    from pipelib.comm.uneven import uneven_bytes

    g = None if world else _group(ranks)
    if dist.get_rank() not in ranks:
        return []
    info, n, me, bad = collective_info("all_to_all_uneven"), len(ranks), ranks.index(dist.get_rank()), []
    for seed in seeds:
        m = _splits(n, seed)
        ins, outs = m[me], [m[i][me] for i in range(n)]
        for row, dtype in (((), torch.float32), ((3, 2), torch.float64), ((5,), torch.int64)):
            gen = torch.Generator().manual_seed(100 * seed + dist.get_rank())
            x = (torch.randn((sum(ins), *row), generator=gen) * 100).to(dtype)
            want = info.twin(x, g, input_splits=ins, output_splits=outs)
            for given in (outs, None):  # counts known, or exchanged first
                comms.reset_counters()
                got = info.run(x, g, input_splits=ins, output_splits=given, label="t")
                sent = comms.counters()["bytes_sent"]
                case = f"n={n} seed={seed} row={row} {dtype} output_splits={given}"
                if not torch.equal(got, want):
                    bad.append(f"{case}: values differ")
                exp = uneven_bytes(ins, me, x[:1].numel() * x.element_size() if x.shape[0] else
                                   torch.empty(row, dtype=dtype).numel() * x.element_size())
                exp += 0 if given is not None else 8 * (n - 1)  # the counts: n int64, all but mine
                if sent != exp:
                    bad.append(f"{case}: sent {sent} bytes, expected {exp}")
        if not torch.equal(info.twin(x, g, input_splits=ins), want):  # the twin exchanges counts too
            bad.append(f"n={n} seed={seed}: the twin without output splits differs")
    return bad


@pytest.mark.parametrize("ranks", [(0, 1), (1, 2, 3), (0, 1, 2, 3)], ids=["n2", "n3-subgroup", "n4"])
def test_uneven_all_to_all_equals_gloo(cluster4, ranks):
    assert [b for r in cluster4.run(_against_gloo, list(ranks), [1, 2, 3]) for b in r] == []


def test_on_real_cpu_devices_every_pair_in_flight_at_once(cpu2):
    """A real device posts all n-1 pairs at once (no alpha-beta rounds): the same rows, bytes."""
    assert [b for r in cpu2.run(_against_gloo, [0, 1], [4, 5], world=True) for b in r] == []


def _traced(m):
    import torch
    import torch.distributed as dist

    from pipelib.comm.uneven import all_to_all_uneven

    me = dist.get_rank()
    x = torch.full((sum(m[me]), 4), float(me))
    y = all_to_all_uneven(x, m[me], label="dispatch")
    return [int(v) for v in y[:, 0].tolist()]


def test_bytes_in_the_trace_are_the_counts_and_rows_arrive_in_rank_order(cluster4):
    m = [[1, 0, 2, 3], [0, 0, 4, 1], [2, 2, 0, 0], [5, 1, 1, 1]]  # rank i sends m[i][j] rows to j
    cluster4.reset()
    got = cluster4.run(_traced, m)
    assert got == [sum(([i] * m[i][j] for i in range(4)), []) for j in range(4)]
    coll = cluster4.trace().filter(kind="collective")
    moved = {e.rank: e.bytes for e in coll if e.label == "all_to_all_uneven: dispatch"}
    counts = {e.rank: e.bytes for e in coll if e.label == "all_to_all: dispatch: splits"}
    assert moved == {i: (sum(m[i]) - m[i][i]) * 4 * 4 for i in range(4)}  # rows x 4 floats x 4 bytes
    assert counts == {i: 3 * 8 for i in range(4)}  # the counts went first: 3 int64 to the others


def _disagree():
    import torch
    import torch.distributed as dist

    from pipelib.comm.uneven import all_to_all_uneven

    r = dist.get_rank()
    # every rank sends 2 rows to each; rank 2 thinks rank 0 sends it 3 (a capacity of its own)
    outs = [3, 2, 2, 2] if r == 2 else [2, 2, 2, 2]
    all_to_all_uneven(torch.zeros(8, 2), [2, 2, 2, 2], outs)


def test_ranks_that_disagree_on_the_counts_get_one_clear_error(cluster4):
    with pytest.raises(RankError, match=r"rank 0 sends 2 rows to rank 2, which expects 3") as err:
        cluster4.run(_disagree)
    assert sorted(err.value.errors) == [0, 1, 2, 3]  # every rank raised: nobody hangs


def _bad(kind):
    import torch

    from pipelib.comm.uneven import all_to_all_uneven

    if kind == "sum":
        all_to_all_uneven(torch.zeros(5), [1, 1, 1, 1])
    elif kind == "length":
        all_to_all_uneven(torch.zeros(4), [2, 2])
    else:
        all_to_all_uneven(torch.zeros(4), None, [1, 1, 1, 1])


@pytest.mark.parametrize("kind, pattern", [
    ("sum", r"input_splits=\[1, 1, 1, 1\] on a group of 4 ranks; pass 4 non-negative row counts summing to 5"),
    ("length", r"input_splits=\[2, 2\] on a group of 4 ranks"),
    ("outputs-only", r"output_splits=\[1, 1, 1, 1\] without input_splits"),
])
def test_bad_splits_are_value_errors(cluster4, kind, pattern):
    with pytest.raises(RankError, match=pattern):
        cluster4.run(_bad, kind)
    assert cluster4.run(_traced, [[1] * 4] * 4)  # usable again


def _spawned_exchanges():
    """3 spawned CPU ranks, no cluster: splits of `_splits` under both matching rules (gloo's
    tagged messages, NCCL's one batch), on the world and a 2-rank subgroup, checked and not (the
    MoE layer's call, whose rows go first under gloo's rules: `p2p.Posted`); what each rank
    received, counted and traced."""
    import torch
    import torch.distributed as dist

    from pipelib.comm.registry import collective_info
    from pipelib.runtime.device import Device, DeviceSpec, current, set_current
    from pipelib.runtime.matching import MATCHING
    from pipelib.trace import Kind

    r, info, out = dist.get_rank(), collective_info("all_to_all_uneven"), {}
    pair = dist.new_group([1, 2])
    for matching in MATCHING:
        for ranks, g in (((0, 1, 2), None), ((1, 2), pair)):
            if r not in ranks:
                continue
            n, me = len(ranks), ranks.index(r)
            for seed, check in ((4, True), (5, True), (4, False), (5, False), (6, False)):
                set_current(Device(r, 3, DeviceSpec("cpu", matching=matching)))
                m = _splits(n, seed)
                ins, outs = m[me], [m[i][me] for i in range(n)]
                x = torch.randn(sum(ins), 3, generator=torch.Generator().manual_seed(seed * 10 + r))
                got = info.run(x, g, input_splits=ins, output_splits=outs, label="t", check=check)
                dev = current()
                sends = [e for e in dev.tracer.events if e.kind == Kind.SEND]
                waits = [e for e in dev.tracer.events if e.kind == Kind.RECV_WAIT]
                coll = [e for e in dev.tracer.events if e.kind == Kind.COLLECTIVE]
                out[matching, ranks, seed, check] = {
                    "equal": torch.equal(got, info.twin(x, g, input_splits=ins, output_splits=outs)),
                    "sent": sum(e.bytes for e in sends), "want_sent": (sum(ins) - ins[me]) * 12,
                    "collective": [e.bytes for e in coll],
                    "peers": sorted(e.peer for e in sends),
                    "want_peers": sorted(ranks[j] for j in range(n) if j != me and ins[j]),
                    "waits": sorted(e.peer for e in waits),
                    "want_waits": sorted(ranks[i] for i in range(n) if i != me and outs[i]),
                    "counters": dict(dev.counters()),
                    "want_received": (sum(outs) - outs[me]) * 12,
                    "outstanding": len(dev.outstanding),
                }
    set_current(None)
    return out


def test_spawned_cpu_ranks_under_both_rules_send_receive_count_and_trace_every_row():
    """Real CPU ranks, no cluster: under gloo's rules and NCCL's (one batch) the rows are the
    twin's, with one SEND per peer that gets rows, one RECV_WAIT per peer that sends some, the
    counters' bytes and messages, and nothing left outstanding."""
    from pipelib.runtime.matching import MATCHING_ENV
    from pipelib.runtime.spawn import run_spawned

    bad = []
    for r, out in enumerate(run_spawned(_spawned_exchanges, 3, timeout=180, env={MATCHING_ENV: ""})):
        assert len(out) == (20 if r else 10)
        for case, f in out.items():
            c = f["counters"]
            if not (f["equal"] and f["sent"] == f["want_sent"] == c["bytes_sent"] == f["collective"][0]
                    and f["peers"] == f["want_peers"] and f["waits"] == f["want_waits"]
                    and c["bytes_received"] == f["want_received"] and f["outstanding"] == 0
                    and c["messages_sent"] == len(f["peers"]) and c["messages_received"] == len(f["waits"])):
                bad.append(f"rank {r} {case}: {f}")
    assert bad == []


class _Work:
    """A torch work stand-in: `wait` raises `error` if given, and counts its calls."""

    def __init__(self, error=None):
        self.error, self.waits = error, 0

    def wait(self):
        self.waits += 1
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return False


def test_posted_messages_left_by_an_error_stay_with_the_device_until_waited():
    """A wait that fails (a peer gone) ends `Posted.wait` with that error; the works not waited,
    the failed one included, stay registered as Handles (gloo crashes on a dropped work), the
    beacon says what it said before, and `wait_all` waits each remaining work once."""
    import torch

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import Device, DeviceSpec, set_current

    dev = set_current(Device(0, 3, DeviceSpec("cpu")))
    try:
        dev.activity.set("before")
        a, b, c = torch.zeros(2), torch.zeros(3), torch.zeros(4)
        posted = object.__new__(comms.Posted)  # its works, not gloo's: no process group here
        posted.dev, posted.group, posted.tag, posted.t_post, posted.name = dev, None, 7, 0.0, "t"
        posted.items = [("send", a, 1, 0, 1), ("recv", b, 2, 0, 2), ("recv", c, 1, 1, 1)]
        posted.works = [_Work(RuntimeError("peer 1 gone")), _Work(), _Work()]  # sends are waited first
        with pytest.raises(RuntimeError, match="peer 1 gone"):
            posted.wait()
        left = sorted((h.op, h.peer, h.label) for h in dev.outstanding.values())
        assert left == [("recv", 1, "t step 1 chunk 1"), ("recv", 2, "t step 0 chunk 2"),
                        ("send", 1, "t step 0 chunk 1")]
        assert dev.activity.text == "before"
        posted.works[0].error = None
        comms.wait_all()
        assert [w.waits for w in posted.works] == [2, 1, 1] and not dev.outstanding
    finally:
        set_current(None)
