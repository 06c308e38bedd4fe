"""One plan trained on every rank through the spine, held against one process.

`spine_row(ctx, recipe, plan)` checks the plan against the recipe in this process, trains it on
every engine with `pipelib.trainer.train_plan` (the trainer every chapter from 15 on uses), trains
the recipe in one process on rank 0's device (`Recipe.reference`: a GPU run is held against one
process on the same kind of GPU, whose kernels round as its ranks' do), and measures:

- the largest |difference| over the per-step losses, the last step's gradients and the final
  parameters, naming the tensor where it is (`max_difference`);
- the step time: the median over steps of the slowest rank's time (the trainer's, on the
  device's clock: wall time on real devices, each step started from a barrier);
- the peak memory of each rank over the run: the CUDA allocator's on a GPU (reset before the
  run), else the trainer's own tracker (`StepResult.peak_bytes`).
"""
from __future__ import annotations

import statistics

from pipelib.gpucheck.rows import Context, Measured


def with_allocator_peak(fn, *args, **kwargs) -> tuple:
    """On a rank: (fn(*args, **kwargs), the CUDA allocator's peak bytes during the call, or None
    off a GPU). The peak is reset first, so it is this call's alone."""
    import torch

    from pipelib.runtime.device import current

    cuda = current().kind == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    out = fn(*args, **kwargs)
    if not cuda:
        return out, None
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated()


def reference_on_rank(recipe):
    """On a rank: `recipe` trained in this one process on this rank's device; results on the CPU."""
    from pipelib.runtime.device import current

    return recipe.reference(current().torch_device)


def max_difference(results, ref) -> tuple[float, str]:
    """(largest |difference|, where) between the ranks' `StepResult`s and one process's: the
    per-step losses (one rank reports them), every gradient and every parameter under the
    monolith's names (replicas must agree: `pipelib.results.gather`). A missing or extra name,
    or a shape that differs, is a ValueError naming it."""
    import torch

    from pipelib.results import gather

    reported = [r.losses for r in results if r is not None and r.losses]
    if len(reported) != 1:
        raise ValueError(f"{len(reported)} ranks reported the per-step losses; exactly one should")
    pairs = [("the per-step losses", torch.tensor(reported[0], dtype=torch.float64),
              torch.tensor(list(ref.losses), dtype=torch.float64))]
    for key, what in (("grads", "gradient"), ("params", "parameter")):
        got, want = gather(results, key, shared=True), getattr(ref, key) or {}
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        if missing or extra:
            raise ValueError(f"{what}s: missing {missing}, not in the reference {extra}")
        pairs += [(f"{what} {name}", got[name], want[name]) for name in want]
    worst, where = 0.0, ""
    for name, a, b in pairs:
        if a.shape != b.shape:
            raise ValueError(f"{name}: shape {tuple(a.shape)}, one process's {tuple(b.shape)}")
        d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        if not d <= worst:  # a NaN is the worst of all
            worst, where = d, name
    return worst, where


def spine_row(ctx: Context, recipe, plan) -> Measured:
    """`plan` trained on every engine against `recipe` in one process (module docstring)."""
    from pipelib.trainer import train_plan

    plan.check(recipe, ctx.world)  # in this process first: a bad size is a ValueError naming it
    ctx.cluster.reset()
    out = ctx.cluster.run(with_allocator_peak, train_plan, recipe, plan)
    results = [r for r, _ in out]
    (ref,) = ctx.cluster.run_on([0], reference_on_rank, recipe)
    diff, worst = max_difference(results, ref)
    per_rank = [r.times for r in results if r is not None and r.times]
    steps = [max(ts) for ts in zip(*per_rank)]
    if ctx.device == "cuda":
        memory = tuple(peak for _, peak in out)
    else:
        memory = tuple(r.peak_bytes if r is not None else 0 for r in results)
    return Measured(diff=diff, worst=worst, pipelib_s=statistics.median(steps) if steps else None,
                       memory=memory)
