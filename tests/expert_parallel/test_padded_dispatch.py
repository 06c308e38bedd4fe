"""GShard's padded dispatch needs one capacity on every rank: with a capacity each rank derives
from its own counts the all-to-all is refused on every rank (naming each rank's shape), not a
hang; with `agreed_capacity` (one all-reduce) it moves the same rows as the uneven dispatch."""
import pytest
import torch

from pipelib.expert_parallel.padded import pad_by_expert
from pipelib.runtime.errors import RankError

pytestmark = pytest.mark.cluster

COUNTS = [[3, 0, 1, 2], [1, 1, 0, 0], [0, 4, 2, 1], [2, 2, 2, 2]]  # rank r's rows per expert (E = 4)


def _rows(r):
    return torch.arange(sum(COUNTS[r]) * 2, dtype=torch.float64).view(-1, 2) + 100 * r


def _dispatch(agree):
    import torch.distributed as dist

    from pipelib.comm.uneven import all_to_all_uneven
    from pipelib.expert_parallel.padded import agreed_capacity, padded_dispatch

    r = dist.get_rank()
    counts = torch.tensor(COUNTS[r])
    capacity = agreed_capacity(counts, None) if agree else int(counts.max())  # the bug: a capacity of its own
    got = padded_dispatch(_rows(r), counts, capacity, None)  # (P, 1, C, 2)
    want = all_to_all_uneven(_rows(r), counts.tolist())  # one expert per rank: rows per peer = counts
    mine = torch.cat([got[p, 0, :COUNTS[p][r]] for p in range(4)])
    return capacity, torch.equal(mine, want), int((got == 0).all(-1).sum())


def test_one_agreed_capacity_makes_the_padded_dispatch_work(cluster4):
    out = cluster4.run(_dispatch, True)
    assert [o[0] for o in out] == [4] * 4  # the busiest expert anywhere: rank 2's expert 1
    assert all(o[1] for o in out)
    # padding: 4 ranks x 4 slots per expert, of which only the routed rows are filled
    assert [o[2] for o in out] == [16 - sum(COUNTS[p][r] for p in range(4)) for r in range(4)]


def test_capacities_of_their_own_are_refused_on_every_rank(cluster4):
    with pytest.raises(RankError, match=r"shape/dtype differs: rank 0 \(4, 3, 2\) float64, rank 1 \(4, 1, 2\)") as e:
        cluster4.run(_dispatch, False)
    assert sorted(e.value.errors) == [0, 1, 2, 3]  # nobody hangs


def test_pad_by_expert_keeps_rows_in_slots_and_refuses_overflow():
    rows = torch.arange(8.0).view(4, 2)
    out = pad_by_expert(rows, [1, 3], 3)
    assert out.tolist() == [[[0, 1], [0, 0], [0, 0]], [[2, 3], [4, 5], [6, 7]]]
    with pytest.raises(ValueError, match=r"an expert has 3 rows for capacity=2 slots"):
        pad_by_expert(rows, [1, 3], 2)
