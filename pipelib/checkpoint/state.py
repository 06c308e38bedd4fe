"""A parallelized model's training state as pieces of the monolith's tensors, and back.

    tensors = capture(par, opt)                    # {key: (local tensor, Piece)} of this rank
    wanted = wanted_pieces(par, opt, manifest)     # {key: Piece} this layout needs
    restore(par, opt, loaded.tensors, manifest)    # parameters and optimizer state put in place

Keys are the monolith's names (`pipelib.parallelize.Parallel`'s placements name every
parameter as the single-process model does): `model/NAME` and `optim/NAME/STATE` (Adam's
`exp_avg`, `exp_avg_sq`, `step`). A parameter this rank holds is a `Piece`: tensor
parallelism's split from its `Placement` (axis, dim, fused pieces) and this rank's coordinate
on that axis; under ZeRO, the elements of it that this rank's flat shard holds (its optimizer
updates only those: `FlatUnit.pieces`). Optimizer state shaped like its parameter is cut the
same way; a scalar (Adam's step count) is whole, the same on every rank holding the parameter.

So DDP, ZeRO-1/2/3, TP and pipeline stages all save in one vocabulary, and any of them loads
what any other saved. Introduced in chapter 18.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelib.checkpoint.pieces import Piece, Split, global_shape


@dataclass(frozen=True)
class _Held:
    """One parameter this rank holds: its monolith name, piece, and where its values live."""

    name: str
    param: torch.nn.Parameter
    piece: Piece
    zero: object = None      # the ZeRO wrapper whose flat shard holds it (None: the parameter itself)
    unit: object = None
    at: int = 0              # where its elements sit in the unit's shard


def _split_of(par, name: str, p) -> Split | None:
    place = par.placements.get(name)
    axis = getattr(place, "axis", None)
    if axis is None or par.mesh.size(axis) == 1:
        return None
    return Split(dim=place.dim, fused=place.fused, index=par.mesh.local_rank(axis), count=par.mesh.size(axis))


def zero_wrappers(par) -> list:
    """The ZeRO wrappers of this rank's data-parallel kind, the owner of its optimizer (none under
    DDP or dp = 1: `data_parallel.kinds.Owned` holds one `ZeROReducer` per module)."""
    return [r.zero for a in par.applied if a.optimizer is not None for r in a.optimizer.owners]


def slots(par) -> list[_Held]:
    """Every parameter this rank holds, once (a tied weight under its first name)."""
    names = {}
    for n, p in par.model.named_parameters():
        names.setdefault(id(p), n)
    out, done = [], set()
    for zero in zero_wrappers(par):
        for u in zero.units:
            lo, hi = (0, u.padded) if zero.stage == 0 else (u.lo, u.hi)
            for (_, p), (_, start, stop, at) in zip(u.params, u.pieces(lo, hi)):
                name = names[id(p)]
                split = _split_of(par, name, p)
                flat = None if (start, stop) == (0, p.numel()) else (start, stop)
                out.append(_Held(name, p, Piece(global_shape(p.shape, split), split, flat), zero, u, at))
                done.add(id(p))
    for p in par.parameters():
        if id(p) not in done:
            name = names[id(p)]
            split = _split_of(par, name, p)
            out.append(_Held(name, p, Piece(global_shape(p.shape, split), split)))
            done.add(id(p))
    return out


def _values(s: _Held, source: torch.Tensor) -> torch.Tensor:
    """The slot's elements of `source` (a unit's flat shard, or a tensor shaped like the parameter)."""
    if s.zero is None:
        return source.detach()
    flat = source.detach()[s.at:s.at + s.piece.numel()]
    return flat if s.piece.flat is not None else flat.view(s.param.shape)  # a whole one keeps its shape


def _opt_state(s: _Held, opt) -> dict:
    if s.zero is not None:
        return s.zero.optimizer.state.get(s.unit.master, {})
    return opt.state.get(s.param, {}) if isinstance(opt, torch.optim.Optimizer) else {}


def capture(par, opt) -> dict:
    """{key: (tensor, Piece)}: this rank's parameters and optimizer state, as pieces."""
    out = {}
    for s in slots(par):
        if s.piece.numel() == 0:
            continue
        out[f"model/{s.name}"] = (_values(s, s.unit.master if s.zero is not None else s.param), s.piece)
        for k, v in _opt_state(s, opt).items():
            if not torch.is_tensor(v):
                continue
            if v.dim() == 0:
                out[f"optim/{s.name}/{k}"] = (v.detach(), Piece(()))
            else:
                out[f"optim/{s.name}/{k}"] = (_values(s, v), s.piece)
    return out


def optimizer_groups(par, opt) -> list[dict]:
    """The optimizer's hyperparameters per group (JSON), the same on every rank of one run."""
    groups = (zero_wrappers(par)[0].optimizer if zero_wrappers(par) else opt).state_dict()["param_groups"]
    return [{k: v for k, v in g.items() if k != "params"} for g in groups]


def wanted_pieces(par, opt, manifest) -> dict:
    """{key: Piece} this rank needs: its parameters' pieces in this layout, and the optimizer
    state the checkpoint has for them (scalars whole)."""
    out = {}
    for s in slots(par):
        out[f"model/{s.name}"] = s.piece
        prefix = f"optim/{s.name}/"
        for key, entry in manifest.tensors.items():
            if key.startswith(prefix):
                out[key] = Piece(()) if entry["shape"] == [] else s.piece
    return out


@torch.no_grad()
def restore(par, opt, tensors: dict, manifest) -> None:
    """Put loaded pieces into this rank's parameters and optimizer (ZeRO through its own
    `load_state_dict`, so that stages 1-2 gather the shards again)."""
    groups = manifest.meta.get("optimizer_groups")
    by_zero: dict[int, tuple] = {}
    plain: dict = {}
    for s in slots(par):
        if s.zero is None:
            s.param.copy_(tensors[f"model/{s.name}"].reshape(s.param.shape))
            plain[s.param] = _state_of(s, tensors)
            continue
        zero, shards, states = by_zero.setdefault(id(s.zero), (s.zero, {}, {}))
        u, n = s.unit, s.piece.numel()
        shard = shards.setdefault(u.index, torch.zeros_like(u.master))
        state = states.setdefault(u.index, {})
        if n:
            shard[s.at:s.at + n] = tensors[f"model/{s.name}"].reshape(-1)
        for k, v in _state_of(s, tensors).items():
            if v.dim() == 0:
                state.setdefault(k, v.clone())
            else:
                state.setdefault(k, torch.zeros_like(u.master))
                if n:
                    state[k][s.at:s.at + n] = v.reshape(-1)
    for zero, shards, states in by_zero.values():
        sd = zero.state_dict()
        sd["shards"] = [shards.get(u.index, torch.zeros_like(u.master)) for u in zero.units]
        sd["optimizer"] = with_groups({"state": {i: st for i, st in states.items() if st},
                                        "param_groups": sd["optimizer"]["param_groups"]}, groups)
        zero.load_state_dict(sd)
    if plain and isinstance(opt, torch.optim.Optimizer):
        order = [p for g in opt.param_groups for p in g["params"]]
        state = {i: plain[p] for i, p in enumerate(order) if plain.get(p)}
        opt.load_state_dict(with_groups({"state": state, "param_groups": opt.state_dict()["param_groups"]},
                                         groups))


def _state_of(s: _Held, tensors: dict) -> dict:
    prefix = f"optim/{s.name}/"
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def with_groups(sd: dict, saved: list | None) -> dict:
    """The saved hyperparameters in the live groups (torch's `load_state_dict` convention)."""
    if saved:
        sd["param_groups"] = [{**g, **{k: v for k, v in s.items() if k in g}}
                              for g, s in zip(sd["param_groups"], saved)]
    return sd
