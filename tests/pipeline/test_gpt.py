"""The tiny GPT pipelined on the live cluster equals the single-process GPT: same loss, same
gradients, the tied embedding/head weight on both of its ranks included."""
import pytest

from pipelib.recipe import Recipe
import torch

from pipelib.model import GPT, GPTConfig
from pipelib.pipeline.gpt import PIPELINE_GPT, check_gpt_step, gpt_train_step, run_gpt_train_step
from pipelib.pipeline.gpt_stages import gpt_stages, tied_ranks
from pipelib.pipeline.simulate import Costs
from pipelib.pipeline.schedules import resolve_schedule
from pipelib.results import check_against_reference

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("one_thread")]  # small models: 1 thread

CFG = PIPELINE_GPT  # 8 blocks: p=4 with v=2 chunks still has a block per stage
ROWS = 2            # rows per microbatch
WTE = "embed.wte.weight"
COSTS = Costs()     # modelled durations: no FLOP counting (0.5 s per GPT step on 2 cores)
# (schedule, p, m); zb_h1 splits B into I and W, zbv puts stage 0 and the last on one rank
CASES = [("gpipe", 2, 4), ("gpipe", 4, 4), ("1f1b", 2, 4), ("1f1b", 4, 8),
         ("interleaved_1f1b", 2, 4), ("interleaved_1f1b", 4, 4), ("zb_h1", 4, 4), ("zbv", 2, 4)]


def _run_cases(cases, tie=True):
    return [gpt_train_step(name, p, m, CFG, batch_seed=m, tie=tie, costs=COSTS)
            for name, p, m in cases]


@pytest.fixture(scope="module")
def results(cluster4):
    for name, p, m in CASES:  # every check before any engine works
        check_gpt_step(name, p, m, CFG, ROWS * m, world_size=cluster4.world_size)
    out = {}
    for p in sorted({p for _, p, _ in CASES}):  # one call per p: ranks >= p skip every case
        todo = [c for c in CASES if c[1] == p]
        per_rank = cluster4.run(_run_cases, todo, timeout=120)
        out.update({case: [per_rank[r][i] for r in range(p)] for i, case in enumerate(todo)})
    return out


def _merge(name, p, m, per_rank):
    """One gradient per monolith name; the tied weight must come from both of its ranks."""
    s = resolve_schedule(name, p, m)
    first, last = tied_ranks(s)
    losses = [r.loss for r in per_rank if r.loss is not None]
    grads, tied = {}, {}
    for rank, r in enumerate(per_rank):
        for k, v in r.grads.items():
            if k == WTE:
                tied[rank] = v
            else:
                assert k not in grads, f"{name} p={p}: two ranks returned {k}"
                grads[k] = v
    assert sorted(tied) == sorted({first, last}), \
        f"{name} p={p}: the tied weight is on ranks {sorted(tied)}"
    return losses, grads, tied


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-p{p}-m{m}" for n, p, m in CASES])
def test_pipelined_gpt_equals_the_monolith(results, case):
    name, p, m = case
    _, _, tied = _merge(name, p, m, results[case])  # the tied weight on its first and last rank
    agreed = check_against_reference(results[case], Recipe(CFG, batch_size=ROWS * m, data_seed=m).first_step(),
                                     shared={WTE})
    assert agreed.num_tensors == len(dict(GPT(CFG).named_parameters()))
    if len(tied) == 2:  # the two copies are summed in the same order: bit for bit equal
        assert torch.equal(*tied.values())


def test_without_the_sum_each_copy_holds_only_its_own_use(cluster4):
    """The test can fail: skip the sum and the copies miss each other's part."""
    case = ("1f1b", 4, 4)
    per_rank = cluster4.run(_run_cases, [case], tie=False)
    _, _, tied = _merge(*case, [r[0] for r in per_rank[:4]])
    ref = Recipe(CFG, batch_size=ROWS * 4, data_seed=4).first_step().grads[WTE]
    for g in tied.values():
        assert not torch.allclose(g, ref, atol=1e-6)
    torch.testing.assert_close(tied[0] + tied[3], ref)


def _tied_step(name, p, m, megatron):
    """The sum by an exchange on the pipeline group, or Megatron's way: an all-reduce on the
    {first, last} group, which every rank must create."""
    import torch.distributed as dist

    from pipelib.pipeline.gpt_stages import embedding_group, tied_ranks
    from pipelib.runtime.mesh import Mesh

    s = resolve_schedule(name, p, m)
    group = embedding_group(s) if megatron else None
    if megatron:  # the mesh's tied group, made once per engine (every rank makes the mesh)
        tied = Mesh.first(p, "pp").tied_group(*tied_ranks(s))
        assert dist.get_rank() not in tied_ranks(s) or group is tied is embedding_group(s)
    return gpt_train_step(name, p, m, CFG, batch_seed=m, emb_group=group, costs=COSTS)


@pytest.mark.parametrize("megatron", [False, True], ids=["exchange", "embedding-group"])
def test_the_tied_sum_sends_one_gradient_each_way(cluster4, megatron):
    per_rank = cluster4.run(_tied_step, "1f1b", 4, 4, megatron)
    _, _, tied = _merge("1f1b", 4, 4, per_rank)
    ref = Recipe(CFG, batch_size=ROWS * 4, data_seed=4).first_step().grads[WTE]
    for g in tied.values():
        torch.testing.assert_close(g, ref)
    nbytes = CFG.vocab_size * CFG.n_embd * 4  # (V, C) float32, measured by comms' counters
    assert [r.stats["tied_bytes_sent"] for r in per_rank] == [nbytes, 0, 0, nbytes]


def test_gpt_stages_put_embedding_and_head_at_the_ends():
    from pipelib.model import GPT

    model = GPT(CFG)
    stages = gpt_stages(model, 3)
    assert [len(s) for s in stages] == [1 + 3, 3, 2 + 1]
    assert stages[0][0] is model.embed and stages[-1][-1] is model.head
    assert stages[-1][-1].lm_head.weight is stages[0][0].wte.weight  # shared, not copied
    one = gpt_stages(model, 1)[0]
    assert list(one) == [model.embed, *model.blocks, model.head]



def test_flop_balance_beats_parameter_balance():
    """A big vocabulary: the embedding is parameters without FLOPs, the tied head FLOPs."""
    from pipelib.pipeline.gpt_stages import gpt_stage_costs, gpt_unit_costs

    model = GPT(GPTConfig(vocab_size=1024, block_size=16, n_layer=10, n_head=2, n_embd=32))
    params, flops = gpt_unit_costs(model, "params"), gpt_unit_costs(model, "flops")
    assert flops[0] == 0 and params[0] > 2 * params[1] and flops[-1] > 2 * flops[1]
    assert [len(s) for s in gpt_stages(model, 4, "flops")] == [1 + 3, 3, 3, 1 + 1]
    assert [len(s) for s in gpt_stages(model, 4, "params")] == [1 + 1, 4, 4, 1 + 1]
    by_flops = {b: max(gpt_stage_costs(model, 4, b, "flops")) for b in ("params", "flops")}
    assert by_flops["flops"] < by_flops["params"]
    assert sum(gpt_stage_costs(model, 4, "flops", "flops")) == sum(flops)
    check_gpt_step("1f1b", 4, 4, CFG, balance="flops")
    with pytest.raises(ValueError, match="by='bytes'"):
        gpt_unit_costs(model, "bytes")


# ----------------------------------------------------------------------------- bad input
class NoCluster:
    world_size = 4

    def run(self, *a, **k):
        raise AssertionError("the cluster must not be asked to run anything")


@pytest.mark.parametrize("args,kw,match", [
    (("2f2b", 2, 2), {}, r"unknown schedule '2f2b'; choose one of"),
    (("1f1b", 4, 4, GPTConfig(n_layer=3)), {}, r"n_layer=3\) has 3 blocks .* num_stages=4"),
    (("interleaved_1f1b", 4, 4, GPTConfig(n_layer=4)), {}, r"num_stages=8 stages.*n_layer >= 8"),
    (("gpipe", 2, 4), {"batch_size": 6}, r"batch_size=6 cannot be split into m=4"),
    (("gpipe", 2, 2), {"seq_len": 17}, r"seq_len=17 must be between 1 and block_size=16"),
    (("1f1b", 8, 8), {}, r"needs 8 ranks; the cluster has 4"),
    (("gpipe", 2, 2), {"balance": [5, 4]}, r"balance=\[5, 4\] must list num_stages=2"),
    (("zb_h1", 1, 2), {}, r"splits the backward into I and W on a single stage"),
])
def test_bad_input_fails_before_any_engine_work(args, kw, match):
    with pytest.raises(ValueError, match=match):
        run_gpt_train_step(NoCluster(), *args, **kw)
