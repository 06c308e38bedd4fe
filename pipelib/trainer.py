"""One trainer for every plan: build, parallelize, train `steps` steps, measure, one StepResult.

    results = run(cluster, Recipe(GPTConfig(), batch_size=8), Plan(dp=2, tp=2))
    print(check_against_reference(results, recipe.reference(), shared=True))

On every engine `train_plan(recipe, plan)` builds the recipe's model (the same seed everywhere),
hands it to `pipelib.parallelize.parallelize` with the plan's mesh, and runs the steps: this
rank's rows of each global batch (`Recipe.batch` at its dp coordinate), forward and backward
with every reduction, one optimizer step over what this rank holds. Measurement has one owner:
the run is one `Device.measure(fresh_memory=True)` scope (a new model counted from zero) and
each step one `Device.measure()` inside it, so `StepResult.times` is each step's time on the
device's clock, `bytes_sent` each step's payload bytes, and `peak_bytes` the run's peak: the
parameters and buffers this rank holds, its gradients (kept between steps), the optimizer's
state, and the activations autograd saves (ZeRO counts its own shards). No strategy resets a
counter or touches the tracker.

The reported loss of a step is the mean over the dp (and cp) ranks of their losses (a raw gloo
all-reduce, off the trace), returned by one rank (dp = tp = 0, on the last pipeline stage).
Gradients (the last step's, before its optimizer step) and parameters (after the last step) are
gathered whole on every rank (`Parallel.unshard`), so `check_against_reference(...,
shared=True)` also checks that replicas agree.

It is the one training loop: chapter 18's checkpoints enter it through `StepHooks` (a start
step found in a checkpoint, an optimizer step skipped when a rank's gradients are not finite,
a save after each step: `pipelib.checkpoint.resume.Checkpointing`), not through a second loop.

Introduced in chapter 15.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.results import StepResult


class StepHooks:
    """What a loop built on the trainer adds to it, at three points of every run (all optional:
    this base class changes nothing). Chapter 18's checkpoints are one (`pipelib.checkpoint.resume`).

    - `begin(par, opt, start)`: once, after the model and optimizer are built and before the
      first step; returns the step to run first (a checkpoint loaded: the step after its last);
    - `update(step, par, opt)`: after the step's forward and backward, before its optimizer
      step; False skips the optimizer step (a rank's gradients were not finite);
    - `after_step(step, par, opt, loss)`: after the optimizer step, with the step's global loss
      (on every rank), e.g. to save a checkpoint."""

    def begin(self, par, opt, start: int) -> int:
        return start

    def update(self, step: int, par, opt) -> bool:
        return True

    def after_step(self, step: int, par, opt, loss: float) -> None:
        return None


def train_plan(recipe, plan, *, mesh=None, start: int = 0, stop: int | None = None,
               hooks: StepHooks | None = None, group=None) -> StepResult | None:
    """On every engine: train `recipe` under `plan`, steps `start` to `stop` (default
    `recipe.steps`); this rank's StepResult (None off the grid). `hooks` (a `StepHooks`) may move
    the start, skip an optimizer step and act after each step; `group`: the grid's ranks, for
    the barrier that starts each timed step on real devices (None: the world)."""
    from pipelib.parallelize import parallelize
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh

    mesh = Mesh(plan.topology()) if mesh is None else mesh
    if not mesh.contains:
        return None
    hooks = StepHooks() if hooks is None else hooks
    stop = recipe.steps if stop is None else stop
    dev = current()
    with dev.measure(fresh_memory=True) as run_scope:
        par = parallelize(recipe.build().to(dev.torch_device), mesh, plan, optimizer=recipe.make_optimizer)
        params = par.parameters()
        opt = par.make_optimizer(recipe.make_optimizer)
        numel = sum(p.numel() for p in params)
        dp_rank, losses, times, sent, grads = mesh.local_rank("dp"), [], [], [], {}
        try:
            start = hooks.begin(par, opt, start)
            for step in range(start, stop):
                x, y = (t.to(dev.torch_device) for t in recipe.batch(step, dp_rank, plan.dp))
                if not dev.modelled:
                    dist.barrier(group=group)  # real devices: every rank starts the timed step together
                with dev.measure() as m:
                    loss = par.forward_backward(x, y)
                    if step == stop - 1:
                        grads = par.unshard("grad")  # torch's own gathers: no modelled time, no events
                    if hooks.update(step, par, opt):
                        with dev.compute("optimizer", nbytes=28 * numel):
                            opt.step()  # Adam reads p, g, m, v and writes p, m, v: 28 bytes per fp32 parameter
                    par.after_step()
                    if isinstance(opt, torch.optim.Optimizer):  # ZeRO's counts its own shards
                        dev.memory.update_optimizer(opt)
                    opt.zero_grad(set_to_none=False)
                times.append(m.time)
                sent.append(m.bytes_sent)
                losses.append(global_loss(loss, mesh, par))
                hooks.after_step(step, par, opt, losses[-1])
        finally:
            par.close()
        final = par.unshard("data")
    reports = _reports_loss(mesh, par)
    grads, final = _on_cpu(grads), _on_cpu(final)
    last = torch.tensor(losses[-1], dtype=recipe.dtype) if reports and losses else None  # the recipe's dtype
    return StepResult(loss=last, grads=grads, params=final, losses=tuple(losses) if reports else (),
                      times=tuple(times), bytes_sent=tuple(sent), peak_bytes=run_scope.peak_bytes)


def run(cluster, recipe, plan, *, reset: bool = True) -> list:
    """Check `plan` against `recipe` and the cluster in the notebook, then train on every engine:
    one StepResult per rank (None for ranks outside the plan's grid)."""
    plan.check(recipe, cluster.world_size)
    if reset:
        cluster.reset()
    return cluster.run(train_plan, recipe, plan)


def _on_cpu(tensors: dict) -> dict:
    """What a rank returns to the notebook lives on the CPU (a CUDA tensor would pickle as one)."""
    return {k: t.cpu() for k, t in tensors.items()}


def _reports_loss(mesh, par) -> bool:
    c = mesh.coords
    return c.dp == 0 and c.tp == 0 and c.cp == 0 and par.reports_loss


def global_loss(loss, mesh, par) -> float:
    """The global loss of a step: the mean of the dp ranks' losses (raw gloo, off the trace),
    sent from the rank that computed it to the others of its pipeline (also raw)."""
    value = torch.tensor([float(loss) if loss is not None else 0.0], dtype=torch.float64,
                         device=mesh.dev.torch_device)  # NCCL reduces GPU tensors only
    if mesh.size("pp") > 1:
        dist.all_reduce(value, group=mesh["pp"])  # one stage holds it, the others add 0
    if mesh.size("loss") > 1:  # dp x cp; equal token counts: the mean of the shards' and replicas' means
        dist.all_reduce(value, group=mesh["loss"])
    return value.item() / mesh.size("loss")
