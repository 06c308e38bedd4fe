"""pipelib.recompute: activation recomputation, applied from outside to the unaware model.

- `policies`: `apply_recompute(model, policy, k)` (none, full, every_k, selective) and the one
  autograd.Function under them, `RerunForward`: keep a piece's inputs, rerun it in backward
  under the forward's random state and saved-tensor hooks; the plans (`segment_plan`, `chen_k`);
- `registry`: pure: one entry per policy (its k, apply, formula and torch's twin); the
  prediction for a policy (`predict_policy`) and the best segment length (`best_k`);
- `formulas`: pure (no torch): what each policy keeps, its peak saved-activation bytes and its
  extra FLOPs, Korthikanti et al.'s selective headline at GPT-3 scale, for
  attention written out or fused (FlashAttention: `fused_layer_bytes`);
- `offload`: pure: offloading activations to host memory against recomputing them, for a model,
  a device profile and a host link (`offload_vs_recompute`);
- `measure`: one step under a policy, measured: bytes kept and at their peak (the memory
  tracker), FLOPs (torch's formulas), memory over compute done (`OpClock`);
- `against_torch`: the same model through torch.utils.checkpoint (full, the core, and the
  selective activation checkpoint API), gradients compared;
- `pipeline`: the GPT pipeline step (chapter 12) with a policy on each stage module.

Chapter 14. `formulas` and `offload` are the pure layer; the rest is the runtime layer. Import each name from
its module (`from pipelib.recompute.policies import apply_recompute`); importing the package
imports nothing.
"""
