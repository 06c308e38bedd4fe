"""A recipe and a plan in the production frameworks' spelling (`pipelib.frameworks`): Megatron-LM
arguments, the DeepSpeed configuration (the data-parallel part the same as the one chapter 08's
DeepSpeed twin runs), a torchtitan TOML file that parses, and what each framework lacks, said."""
import tomllib

import pytest

from pipelib.data_parallel.deepspeed_twin import deepspeed_config
from pipelib.frameworks import framework_table, to_deepspeed_config, to_megatron_args, to_torchtitan_toml
from pipelib.model import GPTConfig, MLPConfig
from pipelib.plan import PipelineOptions, Plan, TensorOptions
from pipelib.recipe import Recipe

RECIPE = Recipe(GPTConfig(vocab_size=64, block_size=32, n_layer=8, n_head=4, n_embd=64), batch_size=16, steps=5,
                lr=3e-4)
# the fields of torchtitan's job_config.py (000204a) this module writes, per table
TORCHTITAN = {"training": {"local_batch_size", "global_batch_size", "seq_len", "steps", "mixed_precision_param"},
              "optimizer": {"name", "lr", "weight_decay"},
              "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                              "pipeline_parallel_degree", "context_parallel_degree", "pipeline_parallel_schedule",
                              "pipeline_parallel_microbatch_size"},
              "activation_checkpoint": {"mode"}}


def _flags(args):
    return {a: b for a, b in zip(args, args[1:] + [""]) if a.startswith("--")}


def test_megatron_arguments_of_a_3d_plan():
    plan = Plan(dp=2, tp=2, pp=2, recompute="selective", data="zero1",
                pipeline=PipelineOptions("interleaved_1f1b", microbatches=4),
                tensor=TensorOptions(sequence_parallel=True))
    f = _flags(to_megatron_args(RECIPE, plan))
    assert (f["--tensor-model-parallel-size"], f["--pipeline-model-parallel-size"]) == ("2", "2")
    assert f["--micro-batch-size"] == "2" and f["--global-batch-size"] == "16"        # 16 / dp 2 / m 4
    assert f["--num-layers-per-virtual-pipeline-stage"] == "2"                        # 8 layers, 2 x 2 chunks
    assert "--sequence-parallel" in f and "--use-distributed-optimizer" in f
    assert f["--recompute-granularity"] == "selective"
    with pytest.raises(ValueError, match="Megatron-LM has no ZeRO-2"):
        to_megatron_args(RECIPE, Plan(dp=2, data="zero2"))
    with pytest.raises(ValueError, match="Megatron-LM runs 1F1B and interleaved 1F1B"):
        to_megatron_args(RECIPE, Plan(pp=2, pipeline="gpipe"))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_config_is_the_one_chapter_08_runs(stage):
    kind = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    ours = to_deepspeed_config(RECIPE, Plan(dp=2, data=kind))
    run = deepspeed_config(stage, RECIPE.lr, RECIPE.batch_size // 2, world_size=2)
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "zero_optimization", "gradient_clipping"):
        assert ours[key] == run[key], key
    assert ours["optimizer"]["params"]["lr"] == run["optimizer"]["params"]["lr"]
    tp = to_deepspeed_config(RECIPE, Plan(dp=2, tp=2))
    assert tp["tensor_parallel"] == {"autotp_size": 2}


def test_torchtitan_toml_parses_into_its_own_fields():
    plan = Plan(dp=2, pp=2, recompute="full", pipeline=PipelineOptions("zbv", microbatches=4))
    job = tomllib.loads(to_torchtitan_toml(RECIPE, plan))
    assert {k: set(v) for k, v in job.items()} == TORCHTITAN
    p = job["parallelism"]
    assert (p["data_parallel_shard_degree"], p["data_parallel_replicate_degree"]) == (1, 2)
    assert p["pipeline_parallel_schedule"] == "ZBVZeroBubble" and job["activation_checkpoint"]["mode"] == "full"
    fsdp = tomllib.loads(to_torchtitan_toml(RECIPE, Plan(dp=4, data="zero3")))["parallelism"]
    assert (fsdp["data_parallel_shard_degree"], fsdp["data_parallel_replicate_degree"]) == (4, 1)
    with pytest.raises(ValueError, match="torchtitan has no ZeRO-1"):
        to_torchtitan_toml(RECIPE, Plan(dp=2, data="zero1"))
    with pytest.raises(ValueError, match="frameworks train transformers"):
        to_torchtitan_toml(Recipe(MLPConfig()), Plan())


def test_the_table_says_what_a_framework_lacks():
    plan = Plan(dp=2, tp=2, data="zero2", tensor=TensorOptions(sequence_parallel=True))
    rows = {r.concept: r for r in framework_table(RECIPE, plan)}
    kind = rows["data-parallel kind"]
    assert kind.megatron is None and kind.torchtitan is None and "no ZeRO-2" in kind.note
    assert kind.deepspeed == "zero_optimization.stage = 2"
    assert rows["sequence parallel"].deepspeed is None and rows["sequence parallel"].note
