"""pipelib.tensor_parallel: Megatron-LM tensor parallelism and sequence parallelism, applied from
outside to the unaware model (chapter 09).

- `ops`: the conjugate operators f and g (Shoeybi et al. 2019) and the sequence-parallel
  all-gather / reduce-scatter pair (Korthikanti et al. 2022) as autograd functions; `TPComm`, the
  group and backend (pipelib's traced ring collectives or torch's built-ins);
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, the parallel MLP and attention with
  the heads split;
- `vocab`: the vocabulary-parallel embedding, the tied head, the cross-entropy that never
  gathers the logits, and the position shard of sequence parallelism;
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
  milestone (`tp_milestone`), activation memory with and without sequence parallelism
  (Korthikanti's, and pipelib's block op by op).

Chapter 09. Runtime layer except `plan` and `formulas` (pure). Importing this package imports
nothing; each name below is imported from its module on first use.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "TPComm": "ops",
    "copy_to_tp": "ops",
    "reduce_from_tp": "ops",
    "gather_sequence": "ops",
    "scatter_sequence": "ops",
    "ColumnParallelLinear": "layers",
    "RowParallelLinear": "layers",
    "parallel_mlp": "layers",
    "parallel_attention": "layers",
    "tp_shard_rows": "layers",
    "VocabParallelEmbedding": "vocab",
    "VocabParallelHead": "vocab",
    "PositionShard": "vocab",
    "vocab_parallel_cross_entropy": "vocab",
    "STYLES": "plan",
    "gpt_tp_plan": "plan",
    "validate_plan": "plan",
    "check_sequence_divisible": "plan",
    "apply_tensor_parallel": "apply",
    "sync_sequence_grads": "apply",
    "tp_full_gradients": "apply",
    "tp_unshard": "apply",
    "tp_group": "step",
    "tp_batch": "step",
    "tp_forward": "step",
    "build_tp_gpt": "step",
    "tp_train_step": "step",
    "tp_reference_step": "step",
    "tp_train": "step",
    "tp_blocks_step": "dtensor_twin",
    "dtensor_tp_blocks_step": "dtensor_twin",
    "dtensor_tp_gpt_step": "dtensor_twin",
    "tp_blocks_reference": "dtensor_twin",
    "timed_tp_steps": "dtensor_twin",
    "tp_all_reduce_bytes": "formulas",
    "tp_layer_bytes": "formulas",
    "tp_step_counts": "formulas",
    "TPCounts": "formulas",
    "tp_milestone": "formulas",
    "TPMilestone": "formulas",
    "tp_activation_bytes": "formulas",
    "tp_layer_activation_bytes": "formulas",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
