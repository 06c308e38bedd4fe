"""DDP as torch ships it: buckets planned as torch plans them (1 MiB first bucket, 25 MiB cap),
all-reduces started in bucket-index order, buckets rebuilt from the first backward's order,
unused parameters an error unless find_unused_parameters, division before the sum."""
import random

import pytest
import torch

from pipelib.data_parallel.buckets import plan_buckets
from pipelib.runtime.errors import RankError


def test_defaults_are_torchs():
    import torch.distributed as dist
    import torch.nn.parallel.distributed as torch_ddp

    from pipelib.data_parallel.ddp import DEFAULT_BUCKET_BYTES, FIRST_BUCKET_BYTES

    # torch 2.13 (the pin) names them; older torch (2.11 on GPU images) writes 25 and 1 MiB inline
    cap, first = getattr(torch_ddp, "_DEFAULT_BUCKET_CAP_MB", 25), getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)
    assert DEFAULT_BUCKET_BYTES == cap * 2**20 == 25 * 2**20
    assert FIRST_BUCKET_BYTES == first == 2**20


@pytest.mark.parametrize("seed", range(5))
def test_plan_equals_torchs_bucket_assignment(seed):
    """torch's own planner, given the tensors in backward's order and the limits [first, cap],
    cuts the same buckets as plan_buckets (which walks registration order backwards)."""
    import torch.distributed as dist

    rng = random.Random(seed)
    numels = [rng.choice((3, 17, 64, 250, 1000, 4096)) for _ in range(rng.randint(5, 30))]
    sizes = [(f"p{i}", k) for i, k in enumerate(numels)]
    backward = list(range(len(numels)))[::-1]
    tensors = [torch.zeros(numels[i]) for i in backward]
    for first, cap in ((None, 2048), (512, 4096), (4000, 16384), (1, 1 << 30)):
        limits = [cap] if first is None else [first, cap]
        theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors), backward)
        ours = plan_buckets(sizes, cap, 4, first)
        assert [[int(n[1:]) for n in b.names] for b in ours] == theirs, (first, cap)
    # a plan in backward's order (what a rebuild uses) walks the order as given
    order = [("b", 10), ("a", 300), ("c", 5)]
    assert [b.names for b in plan_buckets(order, 100, backward_order=True)] == [("b", "a"), ("c",)]


def test_unused_parameters_walk():
    from pipelib.data_parallel.overlap import unused_parameters

    a, b, c = (torch.nn.Linear(3, 3) for _ in range(3))
    loss = c(a(torch.ones(1, 3))).sum()
    assert unused_parameters(loss, [*a.parameters(), *b.parameters(), *c.parameters()]) == list(b.parameters())


def test_division_before_the_sum_avoids_fp16_overflow():
    """torch divides before the all-reduce 'to avoid overflow, especially for FP16': 4 ranks of
    fp16 gradients of 40,000 sum past fp16's 65,504, their quarters do not."""
    from pipelib.data_parallel.comm_hooks import comm_hook

    grads = [torch.full((4,), 40_000.0) for _ in range(4)]
    after = sum(g.half() for g in grads) / 4                      # sum, then divide
    before = sum(comm_hook("fp16").encode(g.clone(), 4) for g in grads)   # what the hook sends
    assert torch.isinf(after).all() and torch.equal(before.float(), torch.full((4,), 40_000.0))
    with pytest.raises(ValueError, match="bf16"):
        comm_hook("int8")


# ---------------------------------------------------------------- on the ranks
# pipelib.data_parallel.ddp_order: a net whose layers are registered c, b, a and used a, b, c


@pytest.mark.cluster
def test_index_order_launch_and_rebuild(cluster4):
    from pipelib.data_parallel.ddp_order import ddp_orders

    for first, second in cluster4.run(ddp_orders, 2, rebuild_buckets=True):
        # step 1: registration order is the reverse of use, so the buckets fill 2, 1, 0;
        # they start in index order, 0, 1, 2, all after the last one is ready
        assert first["buckets"] == [("a.bias", "a.weight"), ("b.bias", "b.weight"), ("c.bias", "c.weight")]
        assert first["ready"] == [2, 1, 0] and first["launched"] == [0, 1, 2]
        assert not first["started_in_backward"]
        # rebuilt from the order the gradients came: c first, and the first all-reduce starts inside backward
        assert second["buckets"][0][0].startswith("c.") and second["buckets"][-1][-1].startswith("a.")
        assert second["ready"] == second["launched"] == [0, 1, 2]
        assert second["started_in_backward"] and second["waited"] < first["waited"]
        assert max(first["worst"], second["worst"]) < 1e-6   # one process on the whole batch, both steps
    for first, second in cluster4.run(ddp_orders, 2):        # without rebuild: the same as step 1, twice
        assert first["launched"] == second["launched"] == [0, 1, 2] and second["ready"] == [2, 1, 0]


@pytest.mark.cluster
def test_unused_parameter_is_an_error_unless_asked(cluster4):
    from pipelib.data_parallel.ddp_order import ddp_orders

    with pytest.raises(RankError) as e:
        cluster4.run(ddp_orders, 1, unused=True)
    msg = str(e.value)
    assert "'spare.weight'" in msg and "'spare.bias'" in msg and "find_unused_parameters=True" in msg
    for steps in cluster4.run(ddp_orders, 2, unused=True, find_unused_parameters=True):
        for s in steps:
            assert s["worst"] < 1e-6 and s["ready"][0] == 0     # the unused layer's bucket: ready at once
            assert s["launched"] == list(range(len(s["buckets"])))
