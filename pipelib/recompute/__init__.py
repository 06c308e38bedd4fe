"""pipelib.recompute: activation recomputation, applied from outside to the unaware model.

- `policies`: `apply_recompute(model, policy, k)` (none, full, every_k, selective) and the one
  autograd.Function under them, `RerunForward`: keep a piece's inputs, rerun it in backward
  under the forward's random state and saved-tensor hooks; the plans (`segment_plan`, `chen_k`);
- `formulas`: pure (no torch): what each policy keeps, its peak saved-activation bytes and its
  extra FLOPs (`predict_policy`), Korthikanti et al.'s selective headline at GPT-3 scale;
- `measure`: one step under a policy, measured: bytes kept and at their peak (the memory
  tracker), FLOPs (torch's formulas), memory over compute done (`OpClock`);
- `against_torch`: the same model through torch.utils.checkpoint (full, the core, and the
  selective activation checkpoint API), gradients compared;
- `pipeline`: the GPT pipeline step (chapter 12) with a policy on each stage module.

Chapter 14. `formulas` is the pure layer; the rest is the runtime layer. Importing this package
imports nothing; each name below is imported from its module on first use.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "POLICIES": "policies", "RerunForward": "policies", "rerun": "policies",
    "apply_recompute": "policies", "check_policy": "policies", "recompute_policy": "policies",
    "segment_plan": "policies", "chen_k": "policies",
    "Shape": "formulas", "GPT3_175B": "formulas", "PolicyCost": "formulas",
    "core_activation_bytes": "formulas", "selective_layer_bytes": "formulas",
    "predict_policy": "formulas", "best_k": "formulas", "selective_headline": "formulas",
    "OpClock": "measure", "PolicyRun": "measure", "measure_policy": "measure", "step_tokens": "measure",
    "bitwise_equal": "measure", "max_abs_diff": "measure",
    "TORCH_MODES": "against_torch", "torch_checkpoint_step": "against_torch",
    "recompute_gpt_step": "pipeline", "run_recompute_gpt_step": "pipeline",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
