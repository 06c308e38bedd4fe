"""DualPipeV with an MoE layer in every stage (chapter 13 meets chapter 16): the executor runs the
real uneven all-to-alls over the ep group inside its actions, its timeline on the virtual clock is
`simulate`'s with `Costs.all_to_all`, and its gradients are one process's."""
import pytest
from torch.testing import assert_close

from pipelib.expert_parallel.layer import MoESpec
from pipelib.expert_parallel.pipelined import (
    MoEStage,
    action_spans,
    PipeSizes,
    exchange_costs,
    latency_only,
    moe_pipeline_reference,
    moe_pipeline_step,
    pipeline_batch,
    token_loss,
)
from pipelib.pipeline.schedules import Op, dualpipe_v
from pipelib.pipeline.simulate import Costs, simulate
from pipelib.pipeline.stage import Stage
from pipelib.topology import Topology
from pipelib.trace import Kind

SPEC = MoESpec(num_experts=4, k=2)  # dropless: each token's routing is the same in any batch
SIZES = PipeSizes()
COMPUTE = dict(F=1e-3, B=2e-3, I=1e-3, W=1e-3)


# ----------------------------------------------------------------------------- pure
def _pairs(s, costs):
    return [(a, b) for acts in s.actions for a, b in zip(acts, acts[1:]) if costs.overlaps(a, b)]


def test_a_backward_all_to_all_of_its_own_is_paid_by_b_and_i_and_in_the_pair():
    s = dualpipe_v(2, 4)
    for fwd, bwd, pair in [(3e-4, 2e-4, 3e-3), (3e-3, 2e-3, 5e-3)]:  # F + B = 3e-3 of compute
        c = Costs(**COMPUTE, all_to_all=fwd, all_to_all_backward=bwd)
        r, pairs = simulate(s, c), _pairs(s, c)
        assert pairs
        for a, b in pairs:  # the longer of compute and both all-to-alls
            assert r.times[b][1] - r.times[a][0] == pytest.approx(pair, abs=1e-15)
        alone = [a for a in r.times if all(a not in ab for ab in pairs)]
        assert {a.op for a in alone} == {Op.F, Op.B, Op.I, Op.W}
        for a in alone:  # compute plus its own all-to-alls: F's, B's and I's, none in W
            want = c.compute(a.op, a.stage) + {Op.F: fwd, Op.B: bwd, Op.I: bwd, Op.W: 0.0}[a.op]
            assert r.times[a][1] - r.times[a][0] == pytest.approx(want, abs=1e-15)
    assert Costs(all_to_all=1.0).exchange(Op.B) == 1.0 and Costs(all_to_all=1.0).exchange(Op.W) == 0.0
    with pytest.raises(ValueError, match="all_to_all_backward"):
        Costs(all_to_all_backward=-1.0)


def test_per_module_split_backward_equals_one_backward_on_one_process():
    """I then W per module (each expert, the router) gives B's gradients, input's and weights'."""
    x, y = pipeline_batch(SIZES, 1, 1)
    grads = {}
    for split in (False, True):
        mod = MoEStage(SPEC, SIZES, 1, 2)
        st = Stage(mod, 1, 2, per_module=split)
        st.forward(0, x, y, token_loss)
        gin = st.backward_input(0) if split else st.backward(0)
        if split:
            assert all(p.grad is None for p in mod.parameters())  # I left every weight alone
            st.backward_weight(0)
        grads[split] = (gin, {k: p.grad for k, p in mod.named_parameters()})
    assert_close(grads[True][0], grads[False][0])
    assert grads[True][1].keys() == grads[False][1].keys()
    for k in grads[False][1]:
        assert_close(grads[True][1][k], grads[False][1][k], msg=k)


# ----------------------------------------------------------------------------- on the cluster
def _predicted(result, rank):
    return [(e.label, e.stage, e.microbatch, e.start, e.end)
            for e in result.events.filter(rank=rank, kind=Kind.COMPUTE)]


@pytest.mark.cluster
@pytest.mark.parametrize("alpha", [1e-4, 1e-3])  # compute-bound pairs (3 ms > 0.5 ms), all-to-all-bound (5 > 3)
def test_dualpipe_v_with_real_all_to_alls_is_simulates_timeline_and_one_process(cluster4, alpha):
    p, m, ep = 2, 4, 2
    costs = exchange_costs(alpha, ep, **COMPUTE)
    cluster4.reset()
    res = cluster4.run(moe_pipeline_step, "dualpipe_v", p, m, SPEC, SIZES, ep=ep, costs=costs,
                       profile=latency_only("toy-gpu", alpha), timeout=120)
    trace = cluster4.trace()
    predicted = simulate(dualpipe_v(p, m), costs)
    topo = Topology(pp=p, dp=ep, ep=ep)
    for r in range(4):
        pp = topo.coords(r).pp
        got, want = action_spans(trace, r), _predicted(predicted, pp)
        assert [g[:3] for g in got] == [w[:3] for w in want]
        for g, w in zip(got, want):  # virtual clocks: the same sums of the same seconds, rounding apart
            assert g[3:] == pytest.approx(w[3:], abs=1e-12), (r, g, w)
        # every F ran three all-to-alls (counts, dispatch, combine), every B and I two, W none
        coll = [e for e in trace.filter(rank=r, kind=Kind.COLLECTIVE) if ": moe " in e.label]
        ops = [a.op for a in dualpipe_v(p, m).actions[pp]]
        assert len(coll) == 3 * ops.count(Op.F) + 2 * (ops.count(Op.B) + ops.count(Op.I))
        assert {round(e.duration / alpha, 9) for e in coll} == {1.0}  # one pairwise round each
    ref = moe_pipeline_reference("dualpipe_v", p, m, SPEC, SIZES, ep=ep)
    losses = [x.loss for x in res if x.loss is not None]
    assert len(losses) == ep
    for loss in losses:
        assert_close(loss, ref.loss)
    seen = set()
    for x in res:
        for k, g in x.grads.items():
            assert_close(g, ref.grads[k], msg=k)
            seen.add(k)
    assert seen == set(ref.grads)  # every expert's and every router's gradient, somewhere
    assert _pairs(dualpipe_v(p, m), costs)  # the comparison covered overlapped pairs
