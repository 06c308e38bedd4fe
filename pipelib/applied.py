"""`Applied`: what one strategy leaves on this rank, the record every `apply_*` returns.

    tp = apply_tensor_parallel(model, mesh["tp"], gpt_tp_plan())   # an Applied (TensorParallel)
    tp.placements["blocks.0.mlp.c_fc.weight"]                        # {"axis": "tp", "dim": 0, "fused": 1}
    tp.forward_loss(model, x, y); tp.after_backward(model)           # its loss, its gradient sum

A strategy changes the model in place (it swaps modules, adds hooks) and hands back, as plain
values and functions, everything the rest of a step needs from it: where each parameter it
split lives, how it cuts the batch, how it computes the loss, what runs after backward, who
steps the optimizer. `pipelib.parallelize.Parallel` loops over these records in the fixed
order of `parallelize` and knows no strategy by name; nothing travels as attributes on the
model. A new strategy (a data-parallel kind such as DiLoCo, a precision format such as FP8) is
one `apply_*` that returns one of these, and one slot in `parallelize`'s order.

As torchtitan's `apply_*` functions and picotron's wrappers, but returning their effects
instead of leaving them on the model (DESIGN.md section 7). Introduced in chapter 15.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass
class Applied:
    """One strategy's effects on this rank; every field is optional (None: nothing to do).

    - `placements`: {monolith parameter name: the `Placement` fields it sets} ("axis", "dim",
      "fused" for a split; "stage" for a pipeline stage; "axis" "ep" and "expert" for an expert
      this rank holds), merged over the strategies;
    - `modules`: the pieces of the model this rank holds, when the strategy cuts it (pipeline
      stages); the whole model otherwise;
    - `shard_batch(x, y)`: this rank's part of its rows (context parallelism: its columns);
    - `forward_loss(model, x, y)`: the model's forward and loss when the strategy changes how it
      is computed (tensor parallelism: a vocabulary-parallel cross-entropy);
    - `wrap_loss(loss_fn)`: the same for a loss of logits (a pipeline's last stage);
    - `run_step(x, y, loss_fn, done)`: runs the forward and backward itself (the pipeline's
      executor), calling `done(module)` once a held module's gradients are complete;
    - `backward(loss)`: runs the backward (a data-parallel kind that times or hooks it);
    - `after_backward(module)`: once `module`'s gradients are complete on this rank, in the
      fixed order (tensor parallelism's sequence sums, context parallelism's mean, then the
      data-parallel reduction);
    - `after_step()`: after the optimizer step (DeepSeek-V3's balance bias moves by the global
      load);
    - `optimizer`: what steps this rank's parameters when the strategy owns the step (ZeRO's,
      over its shards); None: the recipe's optimizer over `Parallel.parameters()`;
    - `whole(what)`: {monolith name: whole tensor} of what the strategy keeps off the
      parameters (ZeRO's shards gathered), "grad" or "data";
    - `reports_loss`: False on a rank that holds no loss (a pipeline rank without the last stage);
    - `close()`: stop what the strategy started (DDP's communication thread)."""

    axis: str
    placements: Mapping[str, dict] = field(default_factory=dict)
    modules: list | None = None
    shard_batch: Callable | None = None
    forward_loss: Callable | None = None
    wrap_loss: Callable | None = None
    run_step: Callable | None = None
    backward: Callable | None = None
    after_backward: Callable | None = None
    after_step: Callable | None = None
    optimizer: object | None = None
    whole: Callable | None = None
    reports_loss: bool = True
    close: Callable | None = None
