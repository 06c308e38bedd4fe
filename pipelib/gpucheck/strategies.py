"""The strategies' checks: each trains its plan through the spine against one process
(`pipelib.gpucheck.spine`), then races pipelib against torch's twin where pipelib has one.

Every size scales with the world n, so each plan fits any number of GPUs: a GPT of 2n blocks
(a ZB-V pipeline cuts 2 stages per rank), n heads of `Sizes.width` channels, a vocabulary of 16n
(split over tp), sequences of 4n tokens (2n zigzag chunks for ring attention), 4n rows a step
(2n microbatches of a pipeline). The GPT runs in float64, where one process and n ranks differ
only by the order of their sums (about 1e-15 relative): the tolerance 1e-9 is far above that and
far below any mistake. ZeRO keeps fp32 flat buffers, so its row trains the GPT in fp32 with SGD:
a parameter moves by lr x its gradient, so the two runs stay within fp32 rounding, and the
tolerance 1e-5 is about 100 ulp of O(1) values (Adam would divide a gradient near zero by
sqrt(v) + 1e-8 and magnify its rounding up to lr / 1e-8 times: 4e-5 measured on 4 CPU ranks).

A race's times are the median over steps of the slowest rank's, each side one step in turn
(`pipelib.runtime.alternate.alternate_steps`); pipelib's side is the same strategy as the row's
plan, on the twin's model: the GPT for DDP and TP, the MLP for ZeRO-3 and the pipelines
(torch.distributed.pipelining cuts an MLP: `pipeline.torch_twin`). A twin that crashes fails
the row with its error; what the spine measured stays in it.
"""
from __future__ import annotations

import dataclasses
import statistics

import torch

from pipelib.gpucheck.rows import Context, Measured, error_line
from pipelib.gpucheck.spine import spine_row

GPT_TOLERANCE = 1e-9  # float64: n ranks and one process differ by the order of their sums
FP32_TOLERANCE = 1e-5  # float32 with SGD (ZeRO's flat buffers): about 100 ulp of O(1) values


def gpt_recipe(ctx: Context, dtype=torch.float64, optimizer: str = "adam"):
    """The GPT recipe sized for the cluster (module docstring): float64 and Adam by default."""
    from pipelib.model import GPTConfig
    from pipelib.recipe import Recipe

    n = ctx.world
    config = GPTConfig(vocab_size=16 * n, block_size=4 * n, n_layer=2 * n, n_head=n, n_embd=ctx.sizes.width * n)
    return Recipe(config, batch_size=4 * n, steps=ctx.sizes.train_steps, dtype=dtype, optimizer=optimizer)


def mlp_recipe(ctx: Context):
    """The float32 MLP recipe of the ZeRO-3 race (FSDP2's twin wraps it layer by layer; the
    GPT's tied embedding and head would be two of FSDP2's groups sharing a parameter)."""
    from pipelib.model import MLPConfig
    from pipelib.recipe import Recipe

    config = MLPConfig(in_features=16, hidden=8 * ctx.sizes.width, out_features=8, num_layers=4)
    return Recipe(config, batch_size=4 * ctx.world, steps=ctx.sizes.train_steps)


def _raced(ctx: Context, measured: Measured, race) -> Measured:
    """`measured` with pipelib's and torch's median step times from `race(ctx)` -> (pipelib's
    seconds, torch's seconds); a race that raises leaves its error in the measurement."""
    try:
        ours, theirs = race(ctx)
    except Exception as e:  # the twin's crash is this row's failure, and the table goes on
        return dataclasses.replace(measured, error=f"race against torch's twin: {error_line(e)}")
    return dataclasses.replace(measured, pipelib_s=statistics.median(ours), torch_s=statistics.median(theirs))


# ------------------------------------------------------------------ the races
def race_ddp(ctx: Context) -> tuple[list, list]:
    """pipelib's overlapped DDP on its own ring against torch's DistributedDataParallel (gloo or
    NCCL), the GPT in fp32 (`data_parallel.versus`)."""
    from pipelib.data_parallel.versus import run_versus

    times = run_versus(ctx.cluster, gpt_recipe(ctx).model, sides=("torch", "overlap_ring"),
                       steps=ctx.sizes.race_steps, batch=4)["times"]
    return times["overlap_ring"], times["torch"]


def race_zero3(ctx: Context) -> tuple[list, list]:
    """pipelib's ZeRO-3 against torch's FSDP2 on the MLP (`data_parallel.zero_bench`)."""
    from pipelib.data_parallel.zero_bench import zero_bench_setup, zero_bench_times

    ctx.cluster.run(zero_bench_setup, mlp_recipe(ctx))
    times = ctx.cluster.run(zero_bench_times, ("zero3", "fsdp2"), ctx.sizes.race_steps)[0]
    return times["zero3"], times["fsdp2"]


def race_tp(ctx: Context) -> tuple[list, list]:
    """pipelib's tensor and sequence parallelism against DTensor's on the whole GPT
    (`tensor_parallel.dtensor_twin.timed_tp_steps`)."""
    from pipelib.tensor_parallel.dtensor_twin import timed_tp_steps

    config = gpt_recipe(ctx).model
    out = ctx.cluster.run(timed_tp_steps, config, 4, config.block_size, ctx.world, ("pipelib", "dtensor"),
                          steps=ctx.sizes.race_steps, sequence_parallel=True, whole=True)
    times = out[0].stats["times"]
    return times["pipelib"], times["dtensor"]


def _race_pipeline(schedule: str):
    def race(ctx: Context) -> tuple[list, list]:
        """pipelib's executor against torch.distributed.pipelining's schedule of the same name,
        the same MLP cut the same way (`pipeline.torch_twin`; their gradients must agree)."""
        from pipelib.model import MLPConfig
        from pipelib.pipeline.torch_twin import run_compare_step_times

        n = ctx.world
        config = MLPConfig(in_features=16, hidden=8 * ctx.sizes.width, out_features=8, num_layers=2 * n)
        out = run_compare_step_times(ctx.cluster, schedule, n, 2 * n, config, steps=ctx.sizes.race_steps)
        return out["pipelib"]["steps_s"], out["torch"]["steps_s"]
    return race


# ------------------------------------------------------------------ the checks
def check_ddp(ctx: Context) -> Measured:
    from pipelib.plan import Plan

    row = spine_row(ctx, gpt_recipe(ctx), Plan(dp=ctx.world, data="ddp_overlap"))
    return _raced(ctx, row, race_ddp)


def check_zero3(ctx: Context) -> Measured:
    from pipelib.plan import Plan

    row = spine_row(ctx, gpt_recipe(ctx, torch.float32, "sgd"), Plan(dp=ctx.world, data="zero3"))
    return _raced(ctx, row, race_zero3)


def check_tp_sp(ctx: Context) -> Measured:
    from pipelib.plan import Plan, TensorOptions

    row = spine_row(ctx, gpt_recipe(ctx), Plan(tp=ctx.world, tensor=TensorOptions(sequence_parallel=True)))
    return _raced(ctx, row, race_tp)


def check_pipeline(schedule: str, ctx: Context) -> Measured:
    from pipelib.plan import PipelineOptions, Plan

    n = ctx.world
    row = spine_row(ctx, gpt_recipe(ctx), Plan(pp=n, pipeline=PipelineOptions(schedule, microbatches=2 * n)))
    return _raced(ctx, row, _race_pipeline(schedule))


def check_ring_attention(ctx: Context) -> Measured:
    from pipelib.plan import Plan

    return spine_row(ctx, gpt_recipe(ctx), Plan(cp=ctx.world))


def check_recompute(ctx: Context) -> Measured:
    from pipelib.plan import Plan

    return spine_row(ctx, gpt_recipe(ctx), Plan(dp=ctx.world, recompute="full"))
