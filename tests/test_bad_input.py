"""Bad input at the notebook-facing entry points, the fast cases (issue 28; the review of
2026-11-26 in shared/reviews lists 213 calls by id, kept here). Each call must raise a
ValueError or TypeError whose message names the value, before any engine work (the runners get
a cluster that fails the test if asked to run anything), within a second: nothing hangs in the
notebook's own process (F50 looped forever). The engine cases are
tests/runtime/test_bad_input_cluster.py; the seeded search over the pure layer's signatures is
tests/test_bad_input_property.py.

Every case raises a clear error before any engine work.
"""
from __future__ import annotations

import signal
import time

import pytest
import torch

from pipelib.model import GPTConfig, MLPConfig

ODD = GPTConfig(vocab_size=33, block_size=8, n_layer=2, n_head=3, n_embd=15)
MLP16 = MLPConfig(in_features=16, hidden=64, out_features=10, num_layers=16)
PIPE = GPTConfig(vocab_size=65, block_size=16, n_layer=8, n_head=4, n_embd=32)
LIMIT_S = 5.0  # generous for a loaded 2-core machine; a loop that never ends is what it catches


class NoCluster:
    """A 4-rank cluster that fails the test if any engine work is asked of it."""

    world_size = 4

    def _engine_work(self, *a, **k):
        raise AssertionError("engine work started before the argument was checked")

    run = run_on = measured = trace = _engine_work

    def reset(self):  # run_ddp's own reset is allowed: it clears clocks, nothing runs
        pass


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"did not return within {LIMIT_S} s")


def bounded(call):
    """Run call() under a wall-clock limit (SIGALRM in the main thread: pure Python loops stop)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cases():
    from pipelib.context_parallel.costs import crossover_shard_len, max_shard_len, ring_memory
    from pipelib.context_parallel.partition import split_sequence, work_per_rank
    from pipelib.context_parallel.variants import variant_bytes
    from pipelib.costmodel import get_profile
    from pipelib.data_parallel.buckets import plan_buckets
    from pipelib.data_parallel.efficiency import ddp_step_model, scaled_profile
    from pipelib.data_parallel.zero_formulas import (milestone_table, padded_numel, zero_comm_bytes,
                                                     zero_state_bytes)
    from pipelib.memory import gpt_activation_bytes
    from pipelib.model import GPT, MLP
    from pipelib.pipeline.explorer import Setting, explorer, explorer_sweep, predict
    from pipelib.recompute.registry import predict_policy
    from pipelib.recompute.policies import apply_recompute
    from pipelib.tensor_parallel.formulas import tp_layer_activation_bytes, tp_layer_bytes, tp_step_counts
    from pipelib.tensor_parallel.plan import gpt_tp_plan, validate_plan

    pcie = get_profile("h100")
    gpt = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32))
    x = torch.zeros(1, 64, 1)
    V = ValueError
    return [
        # ZeRO formulas (chapter 08)
        ("F01", lambda: zero_state_bytes(-1000, 4, 2), V, r"zero_state_bytes: psi=-1000; pass an integer >= 0"),
        ("F02", lambda: zero_state_bytes(1000, 0, 2), V, r"world_size=0"),
        ("F03", lambda: zero_state_bytes(1000, 4, 4), V, r"stage=4 is not a ZeRO stage"),
        ("F04", lambda: zero_state_bytes("1000", 4, 1), V, r"psi='1000'"),
        ("F05", lambda: zero_comm_bytes(1000, 0, 2), V, r"zero_comm_bytes: world_size=0"),
        ("F06", lambda: zero_comm_bytes(-1000, 4, 3), V, r"zero_comm_bytes: psi=-1000"),
        ("F07", lambda: padded_numel([10, 20], 0), V, r"padded_numel: world_size=0"),
        ("F08", lambda: milestone_table(10**9, -8), V, r"milestone_table: world_size=-8"),
        ("F08b", lambda: zero_state_bytes(1000, 2.5, 1), V, r"world_size=2\.5; pass an integer"),
        # tensor-parallel formulas and plan (chapter 09)
        ("F09", lambda: tp_layer_bytes(8, 512, 512, 0), V, r"t=0"),
        ("F10", lambda: tp_layer_bytes(-8, 512, 512, 2), V, r"tp_layer_bytes: b=-8"),
        ("F11", lambda: tp_layer_activation_bytes(8, 512, 512, 8, 3), V, r"a=8 heads are not divisible by t=3"),
        ("F11b", lambda: tp_layer_activation_bytes(8, 511, 512, 8, 2, sequence_parallel=True), V,
         r"s=511 is not divisible by t=2"),
        ("F12", lambda: tp_step_counts(-2, 8, 512, 512, 2), V, r"n_layer=-2"),
        ("F12b", lambda: tp_layer_bytes(8, 512, 512, "2"), V, r"t='2'"),
        ("F13", lambda: validate_plan(GPT(GPTConfig(vocab_size=64, block_size=16, n_head=3, n_embd=48)),
                                      gpt_tp_plan(), 2), V, r"n_head=3 is not divisible"),
        ("F14", lambda: validate_plan(GPT(GPTConfig()), gpt_tp_plan(), 2), V, r"vocab_size=65 is not divisible"),
        ("F15", lambda: validate_plan(gpt, {"blocks.*.attn.c_atn": "colwise_qkv"}, 2), V, r"matches no module"),
        ("F16", lambda: validate_plan(gpt, {"blocks.*.mlp.c_fc": "colwize"}, 2), V, r"unknown"),
        ("F17", lambda: validate_plan(gpt, gpt_tp_plan(), "2"), V, r"t='2'"),
        ("F17b", lambda: validate_plan(gpt, gpt_tp_plan(), 64), V, r"t=64"),
        # recomputation (chapter 14)
        ("F18", lambda: apply_recompute(gpt, "fulll"), V, r"unknown recomputation policy 'fulll'"),
        ("F19", lambda: apply_recompute(gpt, "every_k", k=0), V, r"k=0"),
        ("F20", lambda: apply_recompute(gpt, "every_k", k=2.0), V, r"k=2\.0"),
        ("F21", lambda: apply_recompute(gpt, "full", k=2), V, r"takes no k"),
        ("F22", lambda: apply_recompute(torch.nn.Linear(4, 4), "full"), V, r"holds no pipelib.model.Block"),
        ("F23", lambda: apply_recompute(None, "full"), TypeError, r"apply_recompute: model=None"),
        ("F25", lambda: predict_policy(GPTConfig(), -4, 64, "none"), V, r"predict_policy: batch=-4"),
        ("F26", lambda: predict_policy(GPTConfig(), 4, 64, "every_k", k=0), V, r"k=0"),
        ("F26b", lambda: predict_policy(GPTConfig(), 4, 64, "fulll"), V, r"'fulll'"),
        # context parallel (chapter 17)
        ("F29", lambda: variant_bytes("ringg", 1, 4, 16, 8, 4, 4), V, r"'ringg'"),
        ("F30", lambda: variant_bytes("ring", 1, 4, -16, 8, 4, 4), V, r"shard_len=-16"),
        ("F30b", lambda: variant_bytes("ulysses", 1, 6, 16, 8, 4, 4), V, r"6 heads do not split over n=4"),
        ("F31", lambda: max_shard_len(-1, 1, 4, 8, 4, "zigzag"), V, r"capacity=-1"),
        ("F32", lambda: work_per_rank(64, 0, "zigzag"), V, r"n=0"),
        ("F33", lambda: work_per_rank(60, 4, "zigzag"), V, r"sequence length 60 does not split"),
        ("F50", lambda: max_shard_len(2**30, 1, 4, 8, 4, "zigzag", step=0), V, r"max_shard_len: step=0"),
        ("F51", lambda: max_shard_len(0, 1, 4, 8, 4, "zigzag"), V, r"capacity=0"),
        ("F51b", lambda: max_shard_len(100, 1, 4, 8, 4, "zigzag"), V, r"not even a shard of step=2"),
        ("F52", lambda: crossover_shard_len(0, 5e-6, 50e9, 1, 4, 8, 4), V, r"flops=0"),
        ("F53", lambda: split_sequence(x, 4, rank=7), V, r"rank=7; pass an integer in 0\.\.3"),
        ("F55", lambda: work_per_rank(64, 4, "zigzagg"), V, r"unknown layout 'zigzagg'"),
        ("F56", lambda: ring_memory(1, 4, 16, 8, 4, kv_heads=3), V, r"heads=4 is not a multiple of kv_heads=3"),
        # data parallel formulas (chapter 07)
        ("F44", lambda: plan_buckets([("w", 10)], 0), V, r"bucket_bytes=0"),
        ("F45", lambda: ddp_step_model(GPTConfig(), 8, 2, pcie, bucket_bytes=0), V, r"bucket_bytes=0"),
        ("F45b", lambda: ddp_step_model(GPTConfig(), 8, 0, pcie), V, r"ddp_step_model: n=0"),
        ("F45c", lambda: ddp_step_model(GPTConfig(), -8, 2, pcie), V, r"ddp_step_model: batch=-8"),
        ("F45d", lambda: scaled_profile("h100", 0, "pcie5"), V, r"factor=0"),
        ("F45e", lambda: scaled_profile("h100", 192, "pcie6"), V, r"unknown link 'pcie6'"),
        # explorer (chapters 12-13)
        ("F34", lambda: predict(Setting(schedule="1f1bb")), V, r"unknown schedule '1f1bb'"),
        ("F35", lambda: predict(Setting(p=0)), V, r"p=0"),
        ("F36", lambda: predict(Setting(p="4")), V, r"p='4'"),
        ("F36b", lambda: predict(Setting(m=8.0)), V, r"m=8\.0"),
        ("F37", lambda: predict(Setting(b_ratio=-1)), V, r"b_ratio=-1"),
        ("F38", lambda: predict(Setting(w_share=1.5)), V, r"w_share=1\.5"),
        ("F39", lambda: predict(Setting(), f=-1e-3), V, r"f=-0\.001"),
        ("F40", lambda: predict(Setting(), f=0), V, r"f=0; pass a finite number > 0"),
        ("F41", lambda: predict(Setting(schedule="interleaved_1f1b", num_chunks=0)), V, r"v=0"),
        ("F42", lambda: predict(Setting(p2p_ratio=float("inf"))), V, r"p2p_ratio=inf"),
        ("F42b", lambda: predict(Setting(b_ratio=float("nan"))), V, r"b_ratio=nan"),
        ("F43", lambda: explorer_sweep("pp", [1, 2]), V, r"param='pp'"),
        ("E01", lambda: explorer(schedule="1f1bb"), V, r"unknown schedule '1f1bb'"),
        ("E03", lambda: explorer(m=0), V, r"m=0"),
        # model configurations and memory helpers
        ("F46", lambda: GPTConfig(n_head=0), V, r"GPTConfig: n_head=0; pass an integer >= 1"),
        ("F46b", lambda: GPTConfig(n_head=3, n_embd=64), V, r"n_embd=64 must be divisible by n_head=3"),
        ("F47", lambda: GPTConfig(n_layer=-1), V, r"GPTConfig: n_layer=-1"),
        ("F48", lambda: MLP(MLPConfig(hidden=0)), V, r"MLPConfig: hidden=0"),
        ("F48b", lambda: GPTConfig(n_embd=-64), V, r"n_embd=-64"),
        ("F48c", lambda: GPTConfig(vocab_size="65"), V, r"vocab_size='65'"),
        ("F49", lambda: GPT(GPTConfig(n_layer=0)), V, r"GPT\(config\): n_layer=0; pass an integer >= 1"),
        ("F54", lambda: gpt_activation_bytes(GPTConfig(), -4, 64), V, r"gpt_activation_bytes: batch=-4"),
        ("P14", lambda: MLPConfig(hidden=-1, num_layers=4), V, r"MLPConfig: hidden=-1"),
        ("P15", lambda: MLPConfig(hidden=0, num_layers=4), V, r"MLPConfig: hidden=0"),
        ("D16", lambda: GPT(GPTConfig(vocab_size=16, block_size=4, n_layer=0, n_head=2, n_embd=8)), V,
         r"n_layer=0"),
        ("F49b", lambda: GPT(GPTConfig(vocab_size=0)), V, r"GPT\(config\): vocab_size=0"),
        ("M01", lambda: GPTConfig(dropout=1.5), V, r"dropout=1\.5"),
    ]


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_pure_call_with_a_bad_value_raises_a_clear_error_at_once(case):
    _, call, exc, match = case
    t0 = time.perf_counter()
    with pytest.raises(exc, match=match):
        bounded(call)
    assert time.perf_counter() - t0 < LIMIT_S


# ----------------------------------------------------------------------------- cluster arguments
def _cluster_cases():
    from pipelib.runtime.cluster import Cluster

    return [
        ("C01", lambda: Cluster(world_size="4", start=False), r"world_size='4'"),
        ("C02", lambda: Cluster(world_size=4.0, start=False), r"world_size=4\.0"),
        ("C03", lambda: Cluster(world_size=None, start=False), r"world_size=None"),
        ("C04", lambda: Cluster(world_size=0, start=False), r"world_size=0"),
        ("C05", lambda: Cluster(world_size=65, start=False), r"pass at most 64"),
        ("C06", lambda: Cluster(4, device="gpu", start=False), r"unknown device 'gpu'"),
        ("C07", lambda: Cluster(4, profile="a101", start=False), r"unknown device profile 'a101'"),
        ("C08", lambda: Cluster(4, clock="virtua", start=False), r"unknown clock 'virtua'"),
        ("C09", lambda: Cluster(4, timeout=0, start=False), r"timeout must be a positive number"),
        ("C10", lambda: Cluster(4, timeout="20", start=False), r"got '20'"),
        ("C10b", lambda: Cluster(4, timeout=float("nan"), start=False), r"got nan"),
        ("C12", lambda: Cluster(4, track_memory="yes", start=False), r"track_memory='yes'"),
        ("C13", lambda: Cluster(4, timeout=float("inf"), start=False), r"finite.*got inf"),
        ("C14", lambda: Cluster(4, start_timeout=-1, start=False), r"start_timeout must be a positive.*got -1"),
        ("C14b", lambda: Cluster(4, timeout=1e-3, start=False), r"at least 0\.5.*got 0\.001"),
    ]


CLUSTER_CASES = _cluster_cases()


@pytest.mark.parametrize("case", CLUSTER_CASES, ids=[c[0] for c in CLUSTER_CASES])
def test_a_bad_cluster_argument_raises_before_any_process_starts(case):
    _, call, match = case
    with pytest.raises(ValueError, match=match):
        bounded(call)


def test_cuda_without_gpus_does_not_suggest_world_size_zero():  # C11
    from pipelib.runtime.cluster import Cluster

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(ValueError, match=r"has 0 GPU\(s\)\. Use device='sim'") as err:
        Cluster(4, device="cuda", start=False)
    assert "world_size <= 0" not in str(err.value)


def test_run_checks_its_timeout_before_any_engine_work():  # C15, C16
    from pipelib.runtime.cluster import Cluster

    c = Cluster(4, start=False)
    c.client, c._eids = object(), [0, 1, 2, 3]  # "running" without engines: nothing may be sent
    with pytest.raises(ValueError, match=r"run: timeout must be a positive number .*got -1"):
        c.run(time.sleep, 0.5, timeout=-1)
    with pytest.raises(ValueError, match=r"ranks \[5\] are outside 0\.\.3"):
        c.run_on([0, 5], time.sleep, 0.5)
    c.client = None


# ----------------------------------------------------------------------------- runners (lead's files)


def _runner_cases():
    from pipelib.data_parallel.runner import run_ddp
    from pipelib.data_parallel.zero_runner import train_zero
    from pipelib.pipeline.explorer import Setting, measure
    from pipelib.pipeline.step import run_train_step
    from pipelib.recipe import Recipe
    from pipelib.recompute.pipeline import run_recompute_gpt_step

    c = NoCluster()
    SMALL = Recipe(MLPConfig(in_features=30, hidden=50, out_features=7, num_layers=3), batch_size=8)
    return [
        pytest.param(lambda: run_ddp(c, "bucket", ODD), r"step='bucket'", id="D01"),
        pytest.param(lambda: run_ddp(c, "buckets", ODD, bucket_bytes=0), r"bucket_bytes=0", id="D02"),
        pytest.param(lambda: run_ddp(c, "buckets", ODD, bucket_bytes=1.5e6), r"bucket_bytes=1500000\.0", id="D03"),
        pytest.param(lambda: run_ddp(c, "buckets", ODD, bucket_bytes="1MB"), r"bucket_bytes='1MB'", id="D04"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, ranks=5), r"larger than the cluster", id="D05"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, ranks=[0, 4]), r"ranks=\[0, 4\]", id="D06"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, batch=6), r"batch=6", id="D07"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, steps=0), r"steps=0", id="D08"),
        pytest.param(lambda: run_ddp(c, "no_sync", ODD, accumulate=0), r"accumulate=0", id="D09"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, optimizer="adamw"), r"optimizer='adamw'", id="D10"),
        pytest.param(lambda: run_ddp(c, "overlap", ODD, comm="nccl"), r"comm='nccl'", id="D11"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, model_seeds=[0, 0, 7]), r"3 seeds for 4 ranks", id="D12"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, lr=-1.0), r"lr=-1\.0", id="D13"),
        pytest.param(lambda: run_ddp(c, "all_reduce", {"n_layer": 2}), r"config", id="D14"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, profile="h1000"), r"'h1000'", id="D15"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, ranks=0), r"ranks=0", id="D15b"),
        pytest.param(lambda: run_ddp(c, "all_reduce", ODD, batch=8.0), r"batch=8\.0", id="D15c"),
        pytest.param(lambda: run_train_step(c, "1f1bb", 4, 8, MLP16), r"unknown schedule '1f1bb'", id="P01"),
        pytest.param(lambda: run_train_step(c, "1f1b", 0, 8, MLP16), r"p=0", id="P02"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 0, MLP16), r"m=0", id="P03"),
        pytest.param(lambda: run_train_step(c, "1f1b", "4", 8, MLP16), r"p='4'", id="P04"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4.0, 8, MLP16), r"p=4\.0", id="P04b"),
        pytest.param(lambda: run_train_step(c, "1f1b", 8, 8, MLP16), r"needs 8 ranks", id="P05"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, batch_size=10), r"batch_size=10", id="P06"),
        pytest.param(lambda: run_train_step(c, "interleaved_1f1b", 4, 8, MLP16, num_chunks=0), r"v=0", id="P07"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLPConfig(num_layers=2)), r"cannot split 2 layers",
                     id="P08"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, None, MLP16), r"needs p \(ranks\) and m", id="P09"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, dtype="float32"), r"dtype='float32'", id="P10"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, balance="bogus"), r"balance='bogus'", id="P12"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, steps=0), r"steps=0", id="P13"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, batch_size=8.0), r"batch_size=8\.0", id="P16"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, batch_size=0), r"batch_size=0", id="P17"),
        pytest.param(lambda: run_train_step(c, "1f1b", 4, 8, MLP16, recv_ahead=-1), r"recv_ahead=-1", id="P18"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 4, 8, PIPE, policy="fulll"), r"'fulll'", id="R01"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 4, 8, PIPE, policy="every_k", k=0), r"k=0", id="R02"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 8, 8, PIPE, policy="full"), r"needs 8 ranks",
                     id="R03"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 4, 8, PIPE, policy="full", capacity=0),
                     r"capacity=0", id="R04"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 4, 8, PIPE, policy="full", batch_size=12),
                     r"batch_size=12", id="R05"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 4, 8, GPTConfig(vocab_size=65, block_size=16,
                                                                                n_layer=2, n_head=4, n_embd=32),
                                                    policy="full"), r"n_layer=2", id="R07"),
        pytest.param(lambda: run_recompute_gpt_step(c, "1f1b", 4, 8, PIPE, policy="full", batch_size=8.0),
                     r"batch_size=8\.0", id="R09"),
        pytest.param(lambda: measure(c, Setting(p=8)), r"needs 8 ranks", id="E04"),
        pytest.param(lambda: train_zero(c, SMALL, 4), r"stage=4 is not a ZeRO stage", id="Z01"),
        pytest.param(lambda: train_zero(c, SMALL, "2"), r"stage='2'", id="Z02"),
        pytest.param(lambda: train_zero(c, SMALL, 1, world_size=5), r"world_size=5 is larger", id="Z04"),
        pytest.param(lambda: train_zero(c, SMALL, 1, world_size=0), r"world_size=0", id="Z05"),
        pytest.param(lambda: train_zero(c, {"kind": "cnn"}, 1), r"pass a pipelib\.recipe\.Recipe", id="Z08"),
        pytest.param(lambda: Recipe(MLPConfig(), batch_size=8.0), r"batch_size=8\.0", id="Z12"),
        pytest.param(lambda: Recipe(MLPConfig(), steps=0), r"steps=0", id="Z07"),
        pytest.param(lambda: train_zero(c, SMALL, 1, steps=0), r"steps=0", id="Z07b"),
        pytest.param(lambda: train_zero(c, SMALL, 1, lrr=1e-3), r"lrr", id="Z10"),
        pytest.param(lambda: train_zero(c, SMALL, 1, lr=-1), r"lr=-1", id="Z11"),
    ]


@pytest.mark.parametrize("call,match", _runner_cases())
def test_a_runner_checks_its_arguments_in_the_notebook_before_any_engine_work(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bounded(call)


@pytest.mark.parametrize("call,match", [
    pytest.param(lambda: _measure_policy(batch=0), r"batch=0", id="F27"),
    pytest.param(lambda: _measure_policy(batch=4.0), r"batch=4\.0", id="F28b"),
])
def test_measure_policy_checks_its_batch(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bounded(call)


def _measure_policy(**kw):
    from pipelib.recompute.measure import measure_policy

    return measure_policy(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8), "full", **kw)


# ----------------------------------------------------------------------------- chapters 09 and 17's steps
# The chapters call tp_train_step and attention_step straight through cluster.run; these checks
# give them (or a runner) every argument error in the notebook, before any engine works.
TP_CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)


def _tp(*args, **kw):
    from pipelib.tensor_parallel.apply import check_tp_step

    return check_tp_step(*args, **kw)


def _cp(*args, **kw):
    from pipelib.context_parallel.variants import check_attention_step

    return check_attention_step(*args, **kw)


@pytest.mark.parametrize("call,match", [
    pytest.param(lambda: _tp(GPTConfig(vocab_size=64, block_size=16, n_head=3, n_embd=48), 2, 16, 2, 4),
                 r"n_head=3 is not divisible", id="T01"),
    pytest.param(lambda: _tp(GPTConfig(), 2, 16, 2, 4), r"vocab_size=65 is not divisible", id="T02"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, 5, 4), r"t=5 is larger than the cluster \(4 ranks\)", id="T03"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, 0, 4), r"t=0; pass an integer >= 1", id="T04"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, "2", 4), r"t='2'", id="T05"),
    pytest.param(lambda: _tp(TP_CFG, 2, 32, 2, 4), r"s=32 exceeds block_size=16", id="T06"),
    pytest.param(lambda: _tp(TP_CFG, 2, 15, 2, 4, sequence_parallel=True), r"15 is not divisible by t=2", id="T07"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, 2, 4, dtype="fp16"), r"dtype='fp16'", id="T08"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, 2, 4, backend="nccl"), r"backend='nccl'", id="T10"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, 2, 4, plan={"blocks.*.attn.c_atn": "colwise_qkv"}),
                 r"matches no module", id="T11"),
    pytest.param(lambda: _tp(TP_CFG, 2, 16, 2, 4, sequence_parallel=True, vocab=False),
                 r"needs the vocabulary-parallel embedding and head", id="T11b"),
    pytest.param(lambda: _cp("ringg", 64, 4), r"unknown attention variant 'ringg'", id="A01"),
    pytest.param(lambda: _cp("ring", 60, 4), r"sequence length 60 does not split into 2n = 8", id="A02"),
    pytest.param(lambda: _cp("ring", 64, 4, layout="zigzg"), r"unknown layout 'zigzg'", id="A03"),
    pytest.param(lambda: _cp("ulysses", 64, 4, heads=6), r"6 heads do not split over 4 ranks", id="A04"),
    pytest.param(lambda: _cp("ring", "64", 4), r"seq_len='64'", id="A05"),
    pytest.param(lambda: _cp("ring", 64, 4, ranks=5), r"ranks=5 is larger than the cluster", id="A09"),
    pytest.param(lambda: _cp("ring", 64, 4, ranks=0), r"ranks=0; pass an integer >= 1", id="A10"),
    pytest.param(lambda: _cp("ring", 64, 4, head_dim=0), r"head_dim=0", id="A11"),
    pytest.param(lambda: _cp("ring", 64, 4, tile=0), r"tile=0", id="A13"),
    pytest.param(lambda: _cp("allgather", 64, 4, kv_heads=2), r"grouped-query attention is built for \['ring'\]",
                 id="A16"),
    pytest.param(lambda: _cp("ring", 64, 4, kv_heads=3), r"heads=4 is not a multiple of kv_heads=3", id="A17"),
])
def test_the_tp_and_attention_steps_arguments_are_checked_in_the_notebook(call, match):
    with pytest.raises(ValueError, match=match):
        bounded(call)


def test_good_tp_and_attention_arguments_pass_their_checks():
    from pipelib.tensor_parallel.plan import gpt_tp_plan

    assert _tp(TP_CFG, 2, 16, 2, 4) == gpt_tp_plan()
    assert _tp(TP_CFG, 2, 16, 2, 4, sequence_parallel=True) == gpt_tp_plan(sequence_parallel=True)
    assert [_cp(v, 64, 4) for v in ("ring", "allgather", "ulysses")] == [16, 16, 16]
    assert _cp("ring", 64, 4, ranks=2, kv_heads=2, batch=0) == 32
