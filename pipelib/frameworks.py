"""The same run in the production frameworks: a recipe and a plan as Megatron-LM arguments, a
DeepSpeed configuration and a torchtitan TOML file (chapter 19).

    rows = framework_table(recipe, plan)        # one `FrameworkSetting` per concept, side by side
    to_megatron_args(recipe, plan)              # ['--tensor-model-parallel-size', '2', ...]
    to_deepspeed_config(recipe, plan)           # the JSON dict DeepSpeed reads
    to_torchtitan_toml(recipe, plan)            # [parallelism] tensor_parallel_degree = 2 ...

What a framework does not offer is said, not guessed: a `FrameworkSetting` holds None and the reason
(Megatron-LM has no ZeRO-2 and runs no GPipe; torchtitan has no ZeRO-1 or -2, FSDP shards the
parameters too; DeepSpeed's pipeline and activation checkpointing are set in code, not in its
configuration). The names were checked against: Megatron-LM's `megatron/training/arguments.py`
(core_r0.13), DeepSpeed 0.19.8 (installed: `runtime/config.py`, `runtime/tensor_parallel/
config.py`; chapter 08's twin runs the data-parallel part of this configuration) and
torchtitan's `torchtitan/config/job_config.py` at 000204a.

Pure: no process, no torch.distributed.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

VERSIONS = MappingProxyType({"Megatron-LM": "core_r0.13 (megatron/training/arguments.py)",
                             "DeepSpeed": "0.19.8 (installed)",
                             "torchtitan": "job_config.py at 000204a"})

# data parallelism: (Megatron-LM flags, DeepSpeed ZeRO stage, torchtitan (replicate, shard) or a reason)
_DP = MappingProxyType({
    "ddp": ((), 0, ("replicate", None)),
    "ddp_overlap": (("--overlap-grad-reduce",), 0, ("replicate", None)),
    "zero1": (("--use-distributed-optimizer",), 1, "torchtitan has no ZeRO-1: FSDP shards the parameters too"),
    "zero2": ("Megatron-LM has no ZeRO-2 (its distributed optimizer is ZeRO-1; FSDP is ZeRO-3)", 2,
              "torchtitan has no ZeRO-2: FSDP shards the parameters too"),
    "zero3": (("--use-torch-fsdp2",), 3, ("shard", None)),
})
# recomputation: (Megatron-LM flags, torchtitan activation_checkpoint.mode)
_RECOMPUTE = MappingProxyType({
    "none": ((), "none"),
    "full": (("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"),
             "full"),
    "every_k": (("--recompute-granularity", "full", "--recompute-method", "uniform"), "full"),
    "selective": (("--recompute-granularity", "selective"), "selective"),
})


@dataclass(frozen=True)
class FrameworkSetting:
    """One concept of a run and its spelling in each framework (None: not offered; `note` says why)."""

    concept: str
    pipelib: str
    megatron: str | None
    deepspeed: str | None
    torchtitan: str | None
    note: str = ""


def _model(recipe):
    m = recipe.model
    if not hasattr(m, "n_embd"):
        raise ValueError(f"frameworks: the recipe's model is {type(m).__name__}; the frameworks train "
                         f"transformers: use a GPTConfig recipe")
    return m


def _micro(recipe, plan) -> int:
    rows = recipe.batch_size // plan.dp
    return rows // plan.pipeline.microbatches if plan.pp > 1 else rows


def to_megatron_args(recipe, plan) -> list[str]:
    """Megatron-LM's `pretrain_gpt.py` arguments for the same model, batch and layout; a
    ValueError names what Megatron-LM does not offer."""
    from pipelib.pipeline.schedules import schedule_info

    m = _model(recipe)
    args = ["--num-layers", m.n_layer, "--hidden-size", m.n_embd, "--num-attention-heads", m.n_head,
            "--ffn-hidden-size", 4 * m.n_embd, "--seq-length", recipe.seq_len or m.block_size,
            "--max-position-embeddings", m.block_size, "--micro-batch-size", _micro(recipe, plan),
            "--global-batch-size", recipe.batch_size, "--train-iters", recipe.steps, "--lr", recipe.lr,
            "--tensor-model-parallel-size", plan.tp, "--pipeline-model-parallel-size", plan.pp,
            "--context-parallel-size", plan.cp]
    if plan.tensor.sequence_parallel and plan.tp > 1:
        args.append("--sequence-parallel")
    dp = _DP[plan.data.kind][0]
    if isinstance(dp, str):
        raise ValueError(f"to_megatron_args: data_parallel={plan.data.kind!r}: {dp}")
    args += list(dp)
    if plan.pp > 1:
        info = schedule_info(plan.pipeline.schedule)
        if not info.in_megatron:
            from pipelib.pipeline.schedules.registry import REGISTRY

            raise ValueError(f"to_megatron_args: schedule={plan.pipeline.schedule!r}: Megatron-LM runs 1F1B and "
                             f"interleaved 1F1B; use one of {[n for n, i in REGISTRY.items() if i.in_megatron]}")
        if info.chunked:  # interleaved: two model chunks per rank, as `parallelize` cuts them
            args += ["--num-layers-per-virtual-pipeline-stage", m.n_layer // (plan.pp * 2)]
    args += list(_RECOMPUTE[plan.recompute][0])
    if recipe.mixed_precision:
        args.append("--bf16")
    return [str(a) for a in args]


def to_deepspeed_config(recipe, plan) -> dict:
    """The JSON DeepSpeed reads for the same batch, optimizer and sharding. Pipeline stages are
    DeepSpeed's `PipelineModule(num_stages=pp)` in code and its microbatches the gradient
    accumulation steps; tensor parallelism is AutoTP's `tensor_parallel.autotp_size`."""
    _model(recipe)
    stage = _DP[plan.data.kind][1]
    micro = _micro(recipe, plan)
    cfg = {"train_batch_size": recipe.batch_size, "train_micro_batch_size_per_gpu": micro,
           "gradient_accumulation_steps": recipe.batch_size // (plan.dp * micro),
           "optimizer": {"type": "Adam", "params": {"lr": recipe.lr, "weight_decay": 0.0, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "gradient_clipping": 0.0}
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.cp > 1:
        cfg["sequence_parallel_size"] = plan.cp  # DeepSpeed-Ulysses splits the sequence
    if recipe.mixed_precision:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _toml_value(v) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def to_torchtitan_toml(recipe, plan) -> str:
    """A torchtitan job file's [training], [optimizer], [parallelism] and [activation_checkpoint]
    tables for the same run; a ValueError names what torchtitan does not offer."""
    from pipelib.pipeline.schedules import schedule_info

    m = _model(recipe)
    dp = _DP[plan.data.kind][2]
    if isinstance(dp, str):
        raise ValueError(f"to_torchtitan_toml: data_parallel={plan.data.kind!r}: {dp}")
    replicate, shard = (plan.dp, 1) if dp[0] == "replicate" else (1, plan.dp)
    parallelism = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                   "tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": plan.pp,
                   "context_parallel_degree": plan.cp}
    if plan.pp > 1:
        torch_class = schedule_info(plan.pipeline.schedule).torch_class
        if torch_class is None:
            raise ValueError(f"to_torchtitan_toml: schedule={plan.pipeline.schedule!r} has no "
                             f"torch.distributed.pipelining class for torchtitan to run")
        parallelism["pipeline_parallel_schedule"] = torch_class.removeprefix("Schedule")
        parallelism["pipeline_parallel_microbatch_size"] = _micro(recipe, plan)
    tables = {"training": {"local_batch_size": recipe.batch_size // plan.dp, "global_batch_size": recipe.batch_size,
                           "seq_len": recipe.seq_len or m.block_size, "steps": recipe.steps,
                           "mixed_precision_param": "bfloat16" if recipe.mixed_precision else "float32"},
              "optimizer": {"name": "Adam", "lr": recipe.lr, "weight_decay": 0.0},
              "parallelism": parallelism,
              "activation_checkpoint": {"mode": _RECOMPUTE[plan.recompute][1]}}
    lines = []
    for name, table in tables.items():
        lines += [f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()] + [""]
    return "\n".join(lines)


def framework_table(recipe, plan) -> list[FrameworkSetting]:
    """One row per concept of the run: pipelib's value and each framework's spelling of it."""
    dp = _DP[plan.data.kind]
    mega_dp = None if isinstance(dp[0], str) else " ".join(dp[0]) or "(default DDP)"
    titan_dp = None if isinstance(dp[2], str) else f"data_parallel_{dp[2][0]}_degree = {plan.dp}"
    recompute = _RECOMPUTE[plan.recompute]
    return [
        FrameworkSetting("data parallel", f"dp={plan.dp}", "(the ranks left over)", "(the ranks left over)", titan_dp),
        FrameworkSetting("data-parallel kind", plan.data.kind, mega_dp, f'zero_optimization.stage = {dp[1]}',
                titan_dp, note="; ".join(x for x in (dp[0], dp[2]) if isinstance(x, str))),
        FrameworkSetting("tensor parallel", f"tp={plan.tp}", f"--tensor-model-parallel-size {plan.tp}",
                f"tensor_parallel.autotp_size = {plan.tp}", f"tensor_parallel_degree = {plan.tp}"),
        FrameworkSetting("sequence parallel", str(plan.tensor.sequence_parallel), "--sequence-parallel", None,
                "(on with tensor_parallel_degree > 1)", note="DeepSpeed's AutoTP has no sequence parallelism"),
        FrameworkSetting("pipeline parallel", f"pp={plan.pp}, {plan.pipeline.schedule}, m={plan.pipeline.microbatches}",
                f"--pipeline-model-parallel-size {plan.pp}", f"PipelineModule(num_stages={plan.pp}) in code",
                f"pipeline_parallel_degree = {plan.pp}"),
        FrameworkSetting("context parallel", f"cp={plan.cp}", f"--context-parallel-size {plan.cp}",
                f"sequence_parallel_size = {plan.cp} (Ulysses)", f"context_parallel_degree = {plan.cp}"),
        FrameworkSetting("recomputation", plan.recompute, " ".join(recompute[0]) or "(none)",
                "activation_checkpointing in code", f'activation_checkpoint.mode = "{recompute[1]}"'),
        FrameworkSetting("batch", f"{recipe.batch_size} rows, {_micro(recipe, plan)} per microbatch",
                f"--global-batch-size {recipe.batch_size} --micro-batch-size {_micro(recipe, plan)}",
                f"train_batch_size = {recipe.batch_size}", f"global_batch_size = {recipe.batch_size}"),
    ]
