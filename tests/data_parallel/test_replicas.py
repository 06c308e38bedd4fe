"""check_same_parameters: one broadcast-and-compare names the parameter and the ranks that
differ; broadcast_parameters makes the replicas equal; a sub-group is checked on its own."""
import pytest

from pipelib.runtime.errors import RankError


def _check(seeds, ranks, structure=False, fix=False):
    import torch
    import torch.distributed as dist

    from pipelib.data_parallel.replicas import broadcast_parameters, check_same_parameters

    me = dist.get_rank()
    group = dist.new_group(ranks)  # collective: every rank calls it
    if me not in ranks:
        return None
    torch.manual_seed(seeds[me])
    width = 5 if (structure and me == ranks[-1]) else 4
    model = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))
    if fix:
        broadcast_parameters(model, group)
    return check_same_parameters(model, group)


@pytest.mark.cluster
def test_equal_replicas_pass_and_return_the_count(cluster4):
    assert cluster4.run(_check, [1, 1, 1, 1], [0, 1, 2, 3]) == [3 * 4 + 4 + 4 * 2 + 2] * 4


@pytest.mark.cluster
def test_first_differing_parameter_and_ranks_named(cluster4):
    with pytest.raises(RankError) as e:
        cluster4.run(_check, [1, 2, 1, 2], [0, 1, 2, 3])
    msg = str(e.value)
    assert "parameter '0.weight' (4, 3) differs between rank 0" in msg and "rank(s) [1, 3]" in msg
    assert "same seed" in msg and "broadcast_parameters" in msg


@pytest.mark.cluster
def test_sub_group_only_and_broadcast_fixes(cluster4):
    # ranks 1 and 3 form the group; rank 0 and 2 (different seeds) are not in it
    assert cluster4.run(_check, [7, 1, 9, 1], [1, 3]) == [None, 26, None, 26]
    with pytest.raises(RankError, match=r"between rank 1 \(group rank 0\) and rank\(s\) \[3\]"):
        cluster4.run(_check, [0, 1, 0, 2], [1, 3])
    assert cluster4.run(_check, [1, 2, 3, 4], [0, 1, 2, 3], fix=True) == [26] * 4


@pytest.mark.cluster
def test_structure_mismatch_is_an_error_not_an_abort(cluster4):
    with pytest.raises(RankError, match="differ in structure"):
        cluster4.run(_check, [1, 1, 1, 1], [0, 1, 2, 3], structure=True)
    assert cluster4.run(_check, [1, 1, 1, 1], [0, 1]) == [26, 26, None, None]  # still usable
