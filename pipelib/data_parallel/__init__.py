"""pipelib.data_parallel: every rank holds the model (or a shard of its state) and a slice of the batch.

- `replicas`: `check_same_parameters` (one broadcast-and-compare at wrap time: which parameter
  differs, on which ranks) and `broadcast_parameters` (copy group rank 0's weights);
- `buckets`: pure (no torch): `plan_buckets` (gradients grouped in backward's order into
  buckets of `bucket_bytes`), `ring_bytes_per_rank` (exact bytes of a bucket's ring all-reduce);
- `overlap`: `CommStream` (a communication lane: all-reduces launched from hooks, waited before
  the step; a second virtual clock on a simulated device) and `BackwardTimer` (backward in laps);
- `ddp`: DDP from first principles in four steps: `AllReduceGrads`, `BucketedGrads`,
  `OverlappedGrads`, `DDP` (no_sync and its misuse);
- `comm_hooks`: `CommHook`, `COMM_HOOKS`: what a bucket becomes on the wire (bf16, fp16) and back;
- `ddp_order`: `ScrambledNet`, `ddp_orders`: bucket-index order, rebuilt buckets and unused
  parameters on the ranks, as torch's DDP rules them;
- `kinds`: the ways `pipelib.parallelize` reduces over the dp axis (DDP's buckets, ZeRO 1-3);
- `steps`: the registry of DDP steps (`DDP_STEPS`), torch's DDP behind the same four calls;
- `runner`: `run_ddp` (train k steps with any step, or torch's DistributedDataParallel, on a
  group of a cluster, arguments checked first, against `Recipe.reference()`);
- `versus`: `run_versus`: the steps and torch's DDP built once, timed step by step in turn
  (bench/data_parallel.py);
- `efficiency`: pure: the DDP step's compute and all-reduce times from FLOPs and the alpha-beta
  link model (`ddp_step_model`), communication efficiency, when 2 ranks lose to 1, devices
  scaled to stand for a bigger batch (`scaled_profile`), a measured step's parts (`step_parts`).

- `zero`: `ZeRO`, stages 0-3 around a real Adam: optimizer state, then gradients (by
  reduce-scatter), then parameters (gathered per layer before use, freed after) sharded;
- `zero_units`: `FlatUnit`, the flat, padded, sharded buffer of one layer's parameters;
- `zero_gather`: ZeRO-3's gathering: parameters all-gathered before use, freed after, prefetched;
- `zero_precision`: what reducing gradients in bf16 costs, against fp32 reduction;
- `zero_family`: pure: the ZeRO family (ZeRO-R, Offload, Infinity, ZeRO++, MiCS) in one table;
- `zero_shards`, `zero_memory`: ZeRO's shards of the optimizer and gradients, and its bytes;
- `zero_formulas`: pure (no torch): ZeRO's bytes per rank and bytes sent, the paper's table;
- `zero_runner`: `train_zero`, k steps of a stage on a cluster group beside one process's Adam;
- `mixed_precision`: `MasterWeightAdam`, bf16 parameters and gradients with fp32 master weights;
- `fsdp_twin`: the same model and data under torch's FSDP2 (`fully_shard`);
- `deepspeed_twin`: the same under DeepSpeed's ZeRO, launcher-free, no compiled op;
- `zero_bench`: the step functions bench/data_parallel_zero.py times side by side.

Chapter 07 (DDP: `replicas` to `efficiency`) and chapter 08 (ZeRO 1/2/3, FSDP, DeepSpeed: `zero`
to `zero_bench`, and `replicas`).

The runtime layer (DESIGN.md section 2), except `buckets`, `efficiency` and `zero_formulas`
(pure). Import each name from its module (`from pipelib.data_parallel.ddp import DDP`);
importing the package imports nothing.
"""
