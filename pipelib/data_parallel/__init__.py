"""pipelib.data_parallel: every rank holds the model (or a shard of its state) and a slice of the batch.

- `replicas`: `check_same_parameters` (one broadcast-and-compare at wrap time: which parameter
  differs, on which ranks) and `broadcast_parameters` (copy group rank 0's weights);
- `buckets`: pure (no torch): `plan_buckets` (gradients grouped in backward's order into
  buckets of `bucket_bytes`), `ring_bytes_per_rank` (exact bytes of a bucket's ring all-reduce);
- `overlap`: `CommStream` (a communication lane: all-reduces launched from hooks, waited before
  the step; a second virtual clock on a simulated device) and `BackwardTimer` (backward in laps);
- `ddp`: DDP from first principles in four steps: `AllReduceGrads`, `BucketedGrads`,
  `OverlappedGrads`, `DDP` (no_sync and its misuse);
- `runner`: `run_ddp` (train k steps with any step, or torch's DistributedDataParallel, on a
  group of a cluster, arguments checked first), `reference_step` (one process, whole batch);
- `versus`: `run_versus`: the steps and torch's DDP built once, timed step by step in turn
  (bench/data_parallel.py);
- `efficiency`: pure: the DDP step's compute and all-reduce times from FLOPs and the alpha-beta
  link model (`ddp_step_model`), communication efficiency, when 2 ranks lose to 1, devices
  scaled to stand for a bigger batch (`scaled_profile`), a measured step's parts (`step_parts`).

- `zero`: `ZeRO`, stages 0-3 around a real Adam: optimizer state, then gradients (by
  reduce-scatter), then parameters (gathered per layer before use, freed after) sharded;
- `zero_units`: `FlatUnit`, the flat, padded, sharded buffer of one layer's parameters;
- `zero_formulas`: pure (no torch): ZeRO's bytes per rank and bytes sent, the paper's table;
- `zero_runner`: `train_zero`, k steps of a stage on a cluster group beside one process's Adam;
- `mixed_precision`: `MasterWeightAdam`, bf16 parameters and gradients with fp32 master weights;
- `fsdp_twin`: the same model and data under torch's FSDP2 (`fully_shard`);
- `deepspeed_twin`: the same under DeepSpeed's ZeRO, launcher-free, no compiled op;
- `zero_bench`: the step functions bench/data_parallel_zero.py times side by side.

Chapter 07 (DDP: `replicas` to `efficiency`) and chapter 08 (ZeRO 1/2/3, FSDP, DeepSpeed: `zero`
to `zero_bench`, and `replicas`).

The runtime layer (DESIGN.md section 2), except `buckets`, `efficiency` and `zero_formulas`. Importing this
package imports nothing; each name below is imported from its module on first use.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "check_same_parameters": "replicas",
    "broadcast_parameters": "replicas",
    "Bucket": "buckets",
    "plan_buckets": "buckets",
    "check_bucket_bytes": "buckets",
    "ring_bytes_per_rank": "buckets",
    "CommStream": "overlap",
    "CommWork": "overlap",
    "BackwardTimer": "overlap",
    "COMMS": "overlap",
    "AllReduceGrads": "ddp",
    "BucketedGrads": "ddp",
    "OverlappedGrads": "ddp",
    "DDP": "ddp",
    "DEFAULT_BUCKET_BYTES": "ddp",
    "STEPS": "runner",
    "run_ddp": "runner",
    "ddp_train": "runner",
    "reference_step": "runner",
    "global_batch": "runner",
    "build_model": "runner",
    "run_versus": "versus",
    "versus_steps": "versus",
    "DDPStep": "efficiency",
    "ddp_step_model": "efficiency",
    "all_reduce_time": "efficiency",
    "scaled_profile": "efficiency",
    "two_ranks_slower": "efficiency",
    "crossover_params": "efficiency",
    "step_parts": "efficiency",
    "ZeRO": "zero",
    "FlatUnit": "zero_units",
    "build_units": "zero_units",
    "layer_units": "zero_units",
    "STAGES": "zero_formulas",
    "ADAM_STEP_BYTES": "zero_formulas",
    "check_stage": "zero_formulas",
    "element_bytes": "zero_formulas",
    "padded_numel": "zero_formulas",
    "zero_state_bytes": "zero_formulas",
    "zero_comm_bytes": "zero_formulas",
    "milestone_table": "zero_formulas",
    "zero_train": "zero_runner",
    "train_zero": "zero_runner",
    "reference_adam": "zero_runner",
    "zero_model": "zero_runner",
    "zero_batches": "zero_runner",
    "zero_loss": "zero_runner",
    "check_world": "zero_runner",
    "MasterWeightAdam": "mixed_precision",
    "fsdp_train": "fsdp_twin",
    "train_fsdp": "fsdp_twin",
    "run_deepspeed": "deepspeed_twin",
    "deepspeed_config": "deepspeed_twin",
    "config_json": "deepspeed_twin",
    "zero_bench_setup": "zero_bench",
    "zero_bench_step": "zero_bench",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
