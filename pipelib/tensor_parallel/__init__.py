"""pipelib.tensor_parallel: Megatron-LM tensor parallelism and sequence parallelism, applied from
outside to the unaware model (chapter 09).

- `ops`: the conjugate operators f and g (Shoeybi et al. 2019) and the sequence-parallel
  all-gather / reduce-scatter pair (Korthikanti et al. 2022) as autograd functions; `TPComm`, the
  group and backend (pipelib's traced ring collectives or torch's built-ins);
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, the parallel MLP and attention with
  the heads split;
- `overlap`: `TPLanes`, one rank's compute and communication lanes (chapter 07's `Device.lane`),
  and the column-parallel linear whose backward collective of dX runs while the weight
  gradient computes (Korthikanti et al. §6.2); a timed step charges FLOPs between collectives;
- `vocab`: the vocabulary-parallel embedding, the tied head, the cross-entropy that never
  gathers the logits, and the position shard of sequence parallelism;
- `styles`: pure: one `ParallelStyle` object per style (`ColwiseParallel`, `RowwiseParallel`,
  ...), each with its own `validate` and `apply`, registered by name (`STYLES`);
- `plan`: pure: plans as printable dicts (`gpt_tp_plan`, torchtitan style), `validate_plan` and its
  errors (unknown module, sizes not divisible by t) raised before any engine works;
- `apply`: `apply_tensor_parallel(model, group, plan)`, the sequence-parallel gradient sum, the
  gradients put back together under the unsharded names;
- `step`: the TP GPT's training step on the engines, the single-process reference, and a
  short AdamW training run on the character corpus (`tp_train`);
- `dtensor_twin`: the same GPT (whole, or its blocks) split by torch's DTensor
  (`ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`, `loss_parallel`) beside pipelib's,
  and the timed steps of the bench;
- `formulas`: pure: bytes per all-reduce 2 b s h (t-1)/t, per layer and per step, seed 003's
  milestone (`tp_milestone`), the time the backward overlap hides (`tp_overlap_hidden`),
  activation memory with and without sequence parallelism (Korthikanti's, and pipelib's block
  op by op).

Chapter 09. Runtime layer except `plan` and `formulas` (pure). Import each name from its module
(`from pipelib.tensor_parallel.layers import ColumnParallelLinear`); importing the package
imports nothing.
"""
