"""The trainer's loop with checkpoints: resume from the latest committed step, save every k steps.

    out = train_resumable(recipe, plan, root, stop=6, save_every=2)   # on every rank
    out.start, out.losses, out.params                                 # where it began, what it did

There is one training loop, the trainer's (`pipelib.trainer.train_plan`): this rank's rows of
the recipe's global batch for that step (`Recipe.batch(step, dp_rank, dp)`: the data position
is the step), `Parallel.forward_backward`, one optimizer step, the loss averaged over dp (and
cp). Checkpoints enter it through its hooks (`Checkpointing`). Before the first step it loads
the latest committed checkpoint under `root` if there is one (any layout: `load_training`
reshards), so a run killed at any moment and started again with the same call goes on from the
last save; the losses and final parameters equal an uninterrupted run's bit for bit (the tests
check it for DDP, ZeRO and a pipeline).

Introduced in chapter 18.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from pipelib.checkpoint.manifest import committed_steps
from pipelib.checkpoint.nonfinite import agree_finite, poison, skip_step
from pipelib.checkpoint.training import grid_group, load_training, save_training
from pipelib.trainer import StepHooks


@dataclass(frozen=True)
class ResumeResult:
    """One rank's run: the first step it ran, the global loss of each step it ran, the steps it
    saved, the whole parameters at the end (`Parallel.unshard("data")`, on every rank), and
    the steps skipped because a rank's gradients were not finite."""

    start: int
    losses: tuple[float, ...]
    saved: tuple[int, ...]
    params: dict
    skipped: tuple[int, ...] = ()


class Checkpointing(StepHooks):
    """The trainer's hooks (`pipelib.trainer.StepHooks`) that make a run resumable: load the
    latest committed checkpoint before the first step, save after every `save_every` steps,
    and (for the tests and the chapter) inject a crash, a kill or a NaN; it records what it did."""

    def __init__(self, recipe, root: str, group, *, stop: int, save_every: int, keep: int | None,
                 crash_after: int | None, kill_rank: int | None, nan_at: tuple[int, int] | None, skip_steps):
        self.recipe, self.root, self.group, self.stop = recipe, root, group, stop
        self.save_every, self.keep, self.crash_after, self.kill_rank = save_every, keep, crash_after, kill_rank
        self.nan_at, self.skip_steps = nan_at, tuple(skip_steps)
        self.start, self.losses, self.saved, self.skipped = 0, [], [], []

    def begin(self, par, opt, start: int) -> int:
        if committed_steps(self.root):
            start = load_training(par, opt, self.root, recipe=self.recipe)
        self.start = start
        return start

    def update(self, step: int, par, opt) -> bool:
        if self.kill_rank is not None and step == self.crash_after and par.mesh.global_rank == self.kill_rank:
            os._exit(1)  # a kill in the middle of a step: no finally, no flush
        if self.nan_at is not None:
            if self.nan_at == (step, par.mesh.global_rank):
                poison(par)
            if not agree_finite(par, self.group):  # the same verdict on every rank
                self.skipped.append(step)
                skip_step(par, opt)
                return False
        return step not in self.skip_steps

    def after_step(self, step: int, par, opt, loss: float) -> None:
        self.losses.append(loss)
        if (step + 1) % self.save_every == 0 or step + 1 == self.stop:
            save_training(par, opt, self.root, step + 1, recipe=self.recipe, keep=self.keep, group=self.group)
            self.saved.append(step + 1)
        if self.crash_after is not None and self.kill_rank is None and step + 1 == self.crash_after:
            raise RuntimeError(f"crash injected after step {step + 1} (crash_after={self.crash_after})")


def train_resumable(recipe, plan, root: str, *, stop: int | None = None, save_every: int = 1,
                    keep: int | None = 2, mesh=None, crash_after: int | None = None,
                    kill_rank: int | None = None, nan_at: tuple[int, int] | None = None,
                    skip_steps=()) -> ResumeResult | None:
    """On every rank: train `recipe` under `plan` up to step `stop` (default `recipe.steps`),
    starting from the latest checkpoint under `root` if any, saving after every `save_every`
    steps: the trainer (`pipelib.trainer.train_plan`) with `Checkpointing` hooks.
    `crash_after=k` raises `RuntimeError` right after step k (its save done, if due): a failure
    in the middle of a run, for the tests and the chapter. With `kill_rank=r`, global rank r
    instead dies (`os._exit`, no cleanup) in the middle of step k + 1, after its forward and
    backward, before its optimizer step: a process lost, the others left waiting.
    `nan_at=(step, rank)`: a NaN in that rank's gradients at that step; every rank then agrees
    to skip it (`pipelib.checkpoint.nonfinite`). `skip_steps`: steps whose optimizer step is
    skipped on every rank regardless (the reference of the NaN check)."""
    from pipelib.runtime.mesh import Mesh
    from pipelib.trainer import train_plan

    mesh = Mesh(plan.topology()) if mesh is None else mesh
    group = grid_group(mesh)  # every rank of the world, before those off the grid leave
    if not mesh.contains:
        return None
    stop = recipe.steps if stop is None else stop
    hooks = Checkpointing(recipe, root, group, stop=stop, save_every=save_every, keep=keep,
                          crash_after=crash_after, kill_rank=kill_rank, nan_at=nan_at, skip_steps=skip_steps)
    out = train_plan(recipe, plan, mesh=mesh, stop=stop, hooks=hooks, group=group)
    return ResumeResult(hooks.start, tuple(hooks.losses), tuple(hooks.saved), dict(out.params),
                        tuple(hooks.skipped))


def equal_state(a: dict, b: dict) -> list[str]:
    """The names whose tensors differ in any bit between two {name: tensor} (empty: identical)."""
    names = sorted(set(a) | set(b))
    return [n for n in names if n not in a or n not in b or a[n].shape != b[n].shape
            or not torch.equal(a[n], b[n])]


def load_params(recipe, plan, root: str, *, step: int | None = None, mesh=None) -> dict | None:
    """On every rank: build `recipe`'s model under `plan`, load the checkpoint under `root` into
    it (any saved layout) and return the parameters this rank holds, whole (`Parallel.unshard`);
    None off the grid. What a resharded resume starts from."""
    from pipelib.parallelize import parallelize
    from pipelib.runtime.mesh import Mesh

    mesh = Mesh(plan.topology()) if mesh is None else mesh
    if not mesh.contains:
        return None
    par = parallelize(recipe.build().to(mesh.dev.torch_device), mesh, plan, optimizer=recipe.make_optimizer)
    try:
        load_training(par, par.make_optimizer(recipe.make_optimizer), root, recipe=recipe, step=step)
        return {k: t.cpu() for k, t in par.unshard("data").items()}
    finally:
        par.close()
