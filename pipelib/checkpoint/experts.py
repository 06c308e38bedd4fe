"""Experts in a checkpoint: saved under their global ids on the ep ranks, loaded at any ep degree.

    save_moe(model, opt, root, step, ep_group=mesh["ep"], recipe=recipe, spec=spec)   # every rank
    step = load_moe(model, opt, root, recipe=recipe, spec=spec)       # ep = 1 (one process) or any

An expert-parallel rank holds E / ep experts of each MoE layer (`expert_parallel.experts.
expert_range`). The failure users of the production stacks report is a checkpoint that names
them by their local index (expert 0 of this rank): loaded at another ep degree, every rank's
expert 0 lands on the same global expert, one rank's weights copied to all. Here a tensor's key
is its global name (`blocks.L.mlp.experts.E.c_fc.weight`: `MoE.shard` keeps the global ids as the
`ModuleDict`'s keys), and the manifest's placement record of every expert tensor says where it
was: the ep axis, its layer, its global expert id, the ep rank that held it and the ep degree.
`load_moe` checks each record against the name and against `expert_range` (the rank that held
it must be the rank that owns that id) before it reads a byte, so a checkpoint written with
local ids is refused, naming the tensor, instead of loaded wrong.

Each expert is held whole by one ep rank (and alike by the expert-data-parallel ranks beside
it, written once: `sharded.save_sharded` deduplicates), so loading at ep = 1 reads each from
the file of the rank that held it; at another ep degree each rank asks for its own experts only.
Optimizer state (Adam's step, exp_avg, exp_avg_sq) goes with its parameter under the same
global name; the MoE layers' balance bias (a buffer: DeepSeek-V3's bias is state) too.
Introduced in chapter 18.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.checkpoint.errors import IncompatibleCheckpointError
from pipelib.checkpoint.pieces import Piece
from pipelib.checkpoint.sharded import load_sharded, save_sharded


def expert_id(name: str) -> tuple[int, int] | None:
    """(layer, global expert id) of an expert parameter's name, None for any other."""
    parts = name.split(".")
    if "experts" not in parts or parts[0] != "blocks":
        return None
    return int(parts[1]), int(parts[parts.index("experts") + 1])


def expert_placements(model, ep_group=None) -> dict:
    """{name: record} of every expert parameter this rank holds: the axis, layer, global expert
    id, the ep rank holding it and the ep degree (ep_group None: one process, ep = 1)."""
    ep_rank = dist.get_rank(ep_group) if ep_group is not None else 0
    ep_size = dist.get_world_size(ep_group) if ep_group is not None else 1
    out = {}
    for name, _ in model.named_parameters():
        ids = expert_id(name)
        if ids is not None:
            out[name] = {"axis": "ep", "layer": ids[0], "expert": ids[1], "ep_rank": ep_rank, "ep_size": ep_size}
    return out


def merge_records(everyone: list[dict]) -> dict:
    """One placement record per expert tensor from every rank's (`expert_placements`): the
    expert-data-parallel ranks holding one alike agree; two ep ranks claiming one global name
    are a model that names its experts by local index, refused before anything is written."""
    merged, clash = {}, []
    for theirs in everyone:
        for name, record in theirs.items():
            first = merged.setdefault(name, record)
            if first["ep_rank"] != record["ep_rank"]:
                clash.append(f"{name} on ep ranks {first['ep_rank']} and {record['ep_rank']}")
    if clash:
        raise IncompatibleCheckpointError(
            f"save: {len(clash)} expert tensors held by two ep ranks under one name ({'; '.join(clash[:3])}): "
            f"the experts are named by a rank's local index, and loading would copy one rank's to all. "
            f"Keep the global expert ids in the names (MoE.shard does)")
    return dict(sorted(merged.items()))


def moe_state(model, opt) -> dict:
    """{key: tensor}: parameters, optimizer state and MoE buffers under their global names."""
    out = {}
    for name, p in model.named_parameters():
        out[f"model/{name}"] = p.detach()
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v):
                out[f"optim/{name}/{k}"] = v.detach()
    for name, b in model.named_buffers():
        if name.endswith("balance_bias"):
            out[f"buffer/{name}"] = b.detach()
    return out


def save_moe(model, opt, root: str, step: int, *, ep_group=None, group=None, recipe=None, spec=None,
             keep: int | None = 2):
    """Every rank of the run (`group`, default the world): save its experts and the replicated
    rest (written once) as step `step` under `root`; its `SaveResult`."""
    import dataclasses

    tensors = {k: (t, Piece(tuple(t.shape))) for k, t in moe_state(model, opt).items()}
    places = expert_placements(model, ep_group)
    everyone = [places]
    if dist.is_initialized() and (dist.get_world_size(group) > 1):
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, places, group=group)
    merged = merge_records(everyone)
    ep = next(iter(merged.values()))["ep_size"] if merged else 1
    layers = sorted({r["layer"] for r in merged.values()})
    num_experts = {str(n): len({r["expert"] for r in merged.values() if r["layer"] == n}) for n in layers}
    fixed = {"model": recipe.to_dict()["model"], "moe": dataclasses.asdict(spec) if spec is not None else None}
    meta = {"plan": {"ep": ep}, "num_experts": num_experts, "placements": merged,
            "optimizer_groups": [{k: v for k, v in g.items() if k != "params"}
                                 for g in opt.state_dict()["param_groups"]]}
    return save_sharded(root, step, tensors, meta=meta, fixed=fixed if recipe is not None else {}, keep=keep,
                        group=group)


def check_expert_records(manifest) -> None:
    """Raise naming every expert tensor whose placement record disagrees with its global name or
    with the rank that, at the saved ep degree, owns that expert (a checkpoint of local ids)."""
    from pipelib.expert_parallel.experts import expert_range

    records, wrong = manifest.meta.get("placements", {}), []
    for key in manifest.tensors:
        if not key.startswith("model/") or expert_id(key[len("model/"):]) is None:
            continue
        name = key[len("model/"):]
        layer, e = expert_id(name)
        r = records.get(name)
        if r is None:
            wrong.append(f"{name}: no placement record")
            continue
        num = manifest.meta.get("num_experts", {}).get(str(layer), 0)
        if (r["layer"], r["expert"]) != (layer, e) or num % r["ep_size"] or \
                e not in expert_range(num, r["ep_size"], r["ep_rank"]):
            wrong.append(f"{name}: recorded as layer {r['layer']} expert {r['expert']} on ep rank "
                         f"{r['ep_rank']} of {r['ep_size']}")
    if wrong:
        raise IncompatibleCheckpointError(
            f"checkpoint of step {manifest.step}: expert placements disagree with the global expert ids: "
            + "; ".join(wrong[:4]) + (f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else "")
            + ". Experts must be saved under their global ids (blocks.L.mlp.experts.E...), not a rank's local index")


@torch.no_grad()
def load_moe(model, opt, root: str, *, step: int | None = None, recipe=None, spec=None) -> int:
    """This rank (any ep degree, one process included): load its parameters, their optimizer
    state and the MoE buffers from the checkpoint of `step` (default the latest committed)
    under `root`; returns the step to run next."""
    import dataclasses

    from pipelib.checkpoint.manifest import read_manifest
    from pipelib.checkpoint.state import with_groups

    manifest = read_manifest(root, step)
    check_expert_records(manifest)
    mine = moe_state(model, opt)
    wanted = {k: Piece(tuple(t.shape)) for k, t in mine.items() if not k.startswith("optim/")}
    for key, entry in manifest.tensors.items():  # the optimizer state saved for this rank's parameters
        if key.startswith("optim/") and f"model/{key.split('/')[1]}" in wanted:
            wanted[key] = Piece(tuple(entry["shape"]))
    fixed = None if recipe is None else {"model": recipe.to_dict()["model"],
                                         "moe": dataclasses.asdict(spec) if spec is not None else None}
    loaded = load_sharded(root, wanted, step=manifest.step, fixed=fixed, rank=-1)
    named = dict(model.named_parameters())
    for key, t in loaded.tensors.items():
        kind, name = key.split("/")[0], key.split("/")[1]
        if kind == "model":
            named[name].copy_(t)
        elif kind == "buffer":
            dict(model.named_buffers())[name].copy_(t)
    order = [p for g in opt.param_groups for p in g["params"]]
    names = {id(p): n for n, p in named.items()}
    state = {}
    for i, p in enumerate(order):
        prefix = f"optim/{names[id(p)]}/"
        st = {k[len(prefix):]: v for k, v in loaded.tensors.items() if k.startswith(prefix)}
        if st:
            state[i] = st
    opt.load_state_dict(with_groups({"state": state, "param_groups": opt.state_dict()["param_groups"]},
                                     manifest.meta.get("optimizer_groups")))
    return manifest.step
