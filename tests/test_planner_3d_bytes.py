"""Chapter 15's 2 x 2 x 2 with ZeRO-1 over dp on 8 simulated engines: the bytes every axis sent,
read from the trace, equal their formulas. dp: ZeRO-1's reduce-scatter of the gradients and
all-gather of the parameters, (N-1)/N of each pipeline rank's tp shard twice a step
(`zero_comm_bytes`, the parameters counted by `planner.book.pipeline_rank_params`), on each of
the dp x tp ranks of every stage; tp: Megatron's collectives (`tp_step_counts`); pp: each
microbatch's activation and gradient in each of the 4 pipelines and the tied embedding's
gradient summed between the first and last stage."""
import pytest

from pipelib.comm.alphabeta import expected_bytes
from pipelib.data_parallel.zero_formulas import zero_comm_bytes
from pipelib.model import GPTConfig
from pipelib.parallelize import Plan
from pipelib.planner.book import pipeline_rank_params
from pipelib.planner.spec import ModelSpec
from pipelib.planner.strategy import Strategy
from pipelib.recipe import Recipe
from pipelib.tensor_parallel.formulas import tp_step_counts
from pipelib.trainer import run

GPT = GPTConfig(vocab_size=64, block_size=8, n_layer=4, n_head=2, n_embd=16)
SPEC = ModelSpec("chapter 15's GPT", n_layer=4, hidden=16, n_head=2, vocab=64, seq_len=8)
STEPS, BATCH, M = 3, 8, 2


@pytest.fixture(scope="module")
def trace3d():
    from pipelib.runtime.cluster import Cluster

    with Cluster(8, timeout=60) as c:
        run(c, Recipe(GPT, batch_size=BATCH, steps=STEPS, lr=1e-2),
            Plan(dp=2, tp=2, pp=2, microbatches=M, data_parallel="zero1"))
        yield c.trace()


def test_dp_bytes_are_zero1s_formula(trace3d):
    psi = pipeline_rank_params(SPEC, Strategy(dp=2, tp=2, pp=2), M)   # one tp shard of each stage
    assert psi == [4016, 3920]  # every unit's numel is even: ZeRO's padding to N = 2 adds nothing
    per_step = sum(zero_comm_bytes(p, 2, 1, mixed_precision=False) for p in psi)  # (1/2) psi (4 + 4)
    assert trace3d.bytes_sent(axis="dp") == STEPS * 2 * 2 * per_step  # dp x tp ranks of every stage


def test_tp_and_pp_bytes_are_their_formulas(trace3d):
    C, V, T, t, rows = GPT.n_embd, GPT.vocab_size, GPT.block_size, 2, BATCH // 2
    c = tp_step_counts(GPT.n_layer, rows, T, C, t, 4, vocab=True)
    assert trace3d.bytes_sent(axis="tp") == STEPS * 2 * 2 * (c.forward_bytes + c.backward_bytes)
    act = rows // M * T * C * 4
    tied = sum(expected_bytes("all_reduce", (V // t * C,), 4, 2, r) for r in range(2))
    assert trace3d.bytes_sent(axis="pp") == STEPS * 4 * (2 * M * act + tied)
