"""Llama 3's interleaved schedule (Llama 3 paper, section 3.3.2): N microbatches per round, from
depth first (N = p: interleaved 1F1B) to breadth first (N = m: looped BFS's forward order)."""
import pytest

from pipelib.pipeline.schedules import Op, interleaved_1f1b, llama3_interleaved, looped_bfs, make_schedule, validate
from pipelib.pipeline.simulate import Costs, simulate

CASES = [(p, m, v) for p in (1, 2, 3, 4) for m in (1, 2, 4, 6, 8, 12) for v in (1, 2, 3)]


def _rounds(p, m):
    return [n for n in range(min(p, m), m + 1) if m % n == 0]


def _costs(v, p2p):
    return Costs(F=1.0, B=2.0, p2p=p2p).scaled(1 / v)


@pytest.mark.parametrize("p,m,v", CASES)
def test_every_n_validates(p, m, v):
    for n in _rounds(p, m):
        s = validate(llama3_interleaved(p, m, v, n), order="kind")  # as the executor runs it
        assert (s.num_stages, s.num_microbatches) == (p * v, m)


@pytest.mark.parametrize("p,m,v", CASES)
def test_depth_first_end_is_interleaved_1f1b(p, m, v):
    if m % p and m > p:
        return                        # interleaved_1f1b refuses these m (torch's rule)
    n = min(p, m)                     # N = p, or every microbatch when there are fewer
    assert llama3_interleaved(p, m, v, n).actions == interleaved_1f1b(p, m, v).actions
    assert llama3_interleaved(p, m, v).actions == interleaved_1f1b(p, m, v).actions
    assert make_schedule("llama3", p, m, v).actions == interleaved_1f1b(p, m, v).actions


@pytest.mark.parametrize("p2p", [0.0, 0.1])
@pytest.mark.parametrize("p,m,v", [c for c in CASES if c[1] >= c[0]])
def test_breadth_first_end_has_looped_bfs_forwards_and_bubble_with_less_memory(p, m, v, p2p):
    wide, bfs = llama3_interleaved(p, m, v, m), looped_bfs(p, m, v)
    for r in range(p):
        assert [a for a in wide.actions[r] if a.op is Op.F] == [a for a in bfs.actions[r] if a.op is Op.F]
    a, b = simulate(wide, _costs(v, p2p)), simulate(bfs, _costs(v, p2p))
    assert abs(a.bubble - b.bubble) < 1e-9
    assert all(x <= y for x, y in zip(a.peak_inflight, b.peak_inflight))


@pytest.mark.parametrize("p2p", [0.0, 0.1])
@pytest.mark.parametrize("p,m,v", [c for c in CASES if c[1] >= c[0] and c[2] > 1])
def test_bubble_falls_and_memory_grows_with_n(p, m, v, p2p):
    sims = [simulate(llama3_interleaved(p, m, v, n), _costs(v, p2p)) for n in _rounds(p, m)]
    for narrow, wide in zip(sims, sims[1:]):
        assert wide.bubble <= narrow.bubble + 1e-9
        assert all(x <= y for x, y in zip(narrow.peak_inflight, wide.peak_inflight))
    if p2p == 0:  # free messages: every N has interleaving's bubble
        assert all(abs(s.bubble - (p - 1) / (v * m + p - 1)) < 1e-9 for s in sims)


@pytest.mark.parametrize("n,match", [(3, "must divide m"), (2, r"\[min\(p, m\), m\]"),
                                     (16, "choose N among"), (0, "per_round")])
def test_bad_n_is_refused_with_the_choices(n, match):
    with pytest.raises(ValueError, match=match):
        llama3_interleaved(4, 8, 2, n)
