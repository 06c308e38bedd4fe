"""One timed forward of the MoE GPT on 4 simulated ranks: every module that does math is one
COMPUTE event, and the forward's time is exactly its compute plus its collectives."""
import pytest

from pipelib.expert_parallel.layer import MoESpec
from pipelib.expert_parallel.timeline import all_to_all_share, timed_forward
from pipelib.model import GPTConfig
from pipelib.recipe import Recipe
from pipelib.trace import Kind

pytestmark = pytest.mark.cluster

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def test_forward_time_is_its_compute_plus_its_all_to_alls(cluster4):
    spec = MoESpec(num_experts=8, k=2)
    cluster4.reset()
    times = cluster4.run(timed_forward, Recipe(CFG, batch_size=8), spec, 4, 4)
    trace = cluster4.trace()
    share = all_to_all_share(trace)
    for r in range(4):
        compute = [e for e in trace if e.rank == r and e.kind == Kind.COMPUTE]
        coll = [e for e in trace if e.rank == r and e.kind == Kind.COLLECTIVE]
        # embed, head, 3 per block, a router and 2 local experts per layer
        assert len(compute) == 2 + 3 * 2 + 2 * (1 + 2)
        assert [e.label for e in coll] == [f"{kind}: moe {layer} {what}" for layer in (0, 1) for kind, what in
                                           (("all_to_all", "counts"), ("all_to_all_uneven", "dispatch"),
                                            ("all_to_all_uneven", "combine"))]
        total = sum(e.duration for e in compute) + sum(e.duration for e in coll)
        assert times[r] == pytest.approx(total, rel=1e-9)
        assert 0 < share[r] < 1
        assert share[r] == pytest.approx(sum(e.duration for e in coll) / times[r], rel=1e-9)


def test_step_time_is_its_compute_plus_its_all_to_alls_forward_and_backward(cluster4):
    """The backward on the timeline: each timed module's backward (twice its forward's time) and
    the backward's two all-to-alls per layer, from the trace."""
    from pipelib.expert_parallel.timeline import timed_step

    spec = MoESpec(num_experts=8, k=2)
    cluster4.reset()
    times = cluster4.run(timed_step, Recipe(CFG, batch_size=8), spec, 4, 4)
    trace = cluster4.trace()
    for r in range(4):
        compute = [e for e in trace if e.rank == r and e.kind == Kind.COMPUTE]
        coll = [e for e in trace if e.rank == r and e.kind == Kind.COLLECTIVE]
        forward = {e.label: e.duration for e in compute if not e.label.endswith(" backward")}
        backward = {e.label[:-len(" backward")]: e.duration for e in compute if e.label.endswith(" backward")}
        assert len(forward) == 2 + 3 * 2 + 2 * (1 + 2)
        assert backward.keys() <= forward.keys() and len(backward) >= len(forward) - 1  # all but maybe embed
        for name, seconds in backward.items():
            assert seconds == pytest.approx(2 * forward[name], rel=1e-12)
        labels = [e.label for e in coll]
        for layer in (0, 1):  # forward: counts, dispatch, combine; backward: combine's reverse, dispatch's
            mine = [lab for lab in labels if f"moe {layer} " in lab]
            assert mine[:3] == [f"all_to_all: moe {layer} counts", f"all_to_all_uneven: moe {layer} dispatch",
                                f"all_to_all_uneven: moe {layer} combine"]
            assert mine[3:] == [f"all_to_all_uneven: moe {layer} combine backward",
                                f"all_to_all_uneven: moe {layer} dispatch backward"]
        # backward runs the layers in reverse: layer 1's all-to-alls before layer 0's
        assert labels.index("all_to_all_uneven: moe 1 combine backward") < labels.index(
            "all_to_all_uneven: moe 0 combine backward")
        total = sum(e.duration for e in compute) + sum(e.duration for e in coll)
        assert times[r] == pytest.approx(total, rel=1e-9)


def test_by_role_names_four_kinds_of_compute_and_keeps_the_rest():
    from pipelib.expert_parallel.timeline import by_role
    from pipelib.trace import Event, Trace

    labels = ["attn 0", "attn 0 backward", "expert 1.2", "expert 1.2 backward", "head", "router 0 backward"]
    t = Trace([Event(0, Kind.COMPUTE, lab, i, i + 1) for i, lab in enumerate(labels)]
              + [Event(1, Kind.COLLECTIVE, "all_to_all: moe 0 counts", 9, 10)], world_size=2)
    got = by_role(t)
    assert [e.label for e in got] == ["forward", "backward", "experts", "experts backward", "forward", "backward",
                                      "all_to_all: moe 0 counts"]
    assert [(e.start, e.end, e.rank) for e in got] == [(e.start, e.end, e.rank) for e in t] and got.world_size == 2
