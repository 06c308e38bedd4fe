"""Save and load one run's training state: a parallelized model, its optimizer, step, data, randomness.

    save_training(par, opt, root, step, recipe=recipe, keep=2)     # every rank
    step = load_training(par, opt, root, recipe=recipe)            # every rank, any layout

What a resumed run needs to go on as if nothing happened: the parameters and the optimizer
state (as pieces of the monolith's tensors: `pipelib.checkpoint.state`), the number of steps
done, the data position (the recipe's batches are a pure function of (data_seed, step), so the
position is the step itself) and every random state of the rank (`pipelib.checkpoint.rng`).

The manifest stores the plan and the mesh it was saved on (degrees, order, each parameter's
placement) and the recipe. What may change across a resume: the degrees (dp, tp, pp, ZeRO's
stage, the pipeline split): the pieces are cut again for the new layout. What may not, and is
refused with an error naming both values (`fixed_settings`): the global batch (the loss of a
step is the mean over its rows: another batch is another run), the data order (data_seed), the
model (its config; names and shapes are checked too), the optimizer and the dtype.

Random states are restored only when the layout is the one saved (same world and plan): on
other ranks they would describe other streams. Introduced in chapter 18.
"""
from __future__ import annotations

import dataclasses

from pipelib.checkpoint.rng import rng_states, set_rng_states
from pipelib.checkpoint.sharded import load_sharded, save_sharded
from pipelib.checkpoint.state import capture, optimizer_groups, restore, wanted_pieces


def fixed_settings(recipe) -> dict:
    """What may not change across a resume, from the recipe (JSON values)."""
    d = recipe.to_dict()
    return {"global_batch": d["batch_size"], "data_seed": d["data_seed"], "model": d["model"],
            "optimizer": d["optimizer"], "dtype": d["dtype"]}


def _layout(par) -> dict:
    return {"plan": par.plan.to_dict(), "order": list(par.mesh.topology.order),
            "placements": {n: dataclasses.asdict(p) for n, p in sorted(par.placements.items())}}


def grid_group(mesh):
    """The group of the mesh's ranks when its grid uses only the first ranks of the world (None:
    the whole world): `mesh.grid_group()`, made with the mesh by every rank of the world."""
    return mesh.grid_group()


def save_training(par, opt, root: str, step: int, *, recipe=None, keep: int | None = 2, fault=None,
                  algorithm: str = "crc32", group=None):
    """Every rank of `par`'s mesh: save the training state after `step` optimizer steps as
    `root/step-NNNNNNNN` (`pipelib.checkpoint.sharded.save_sharded`); this rank's SaveResult.
    `group`: the ranks saving (`grid_group(mesh)` when the grid is smaller than the world)."""
    extra = {"step": step, "rng": rng_states(),
             "data": {"next_step": step, **({"data_seed": recipe.data_seed} if recipe is not None else {})}}
    meta = {**_layout(par), "optimizer_groups": optimizer_groups(par, opt),
            "recipe": recipe.to_dict() if recipe is not None else None}
    return save_sharded(root, step, capture(par, opt), extra=extra, meta=meta,
                        fixed=fixed_settings(recipe) if recipe is not None else {}, keep=keep, fault=fault,
                        algorithm=algorithm, group=group)


def load_training(par, opt, root: str, *, recipe=None, step: int | None = None) -> int:
    """Every rank: load the checkpoint of `step` (default the latest committed) under `root`
    into `par` and `opt`, whatever layout saved it; returns the step to run next."""
    from pipelib.checkpoint.manifest import read_manifest

    manifest = read_manifest(root, step)
    wanted = wanted_pieces(par, opt, manifest)
    expected = {f"model/{n}" for n, _ in par.model.named_parameters()}  # every stage's: the whole model
    loaded = load_sharded(root, wanted, step=manifest.step, expected=expected,
                          fixed=fixed_settings(recipe) if recipe is not None else None)
    restore(par, opt, loaded.tensors, loaded.manifest)
    same_layout = loaded.manifest.meta.get("plan") == par.plan.to_dict()
    if same_layout and loaded.extra is not None:
        set_rng_states(loaded.extra["rng"])
    return loaded.manifest.step

