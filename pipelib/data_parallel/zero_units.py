"""One unit's parameters as one flat buffer in N equal shards: the layout under every ZeRO stage.

A unit is the trainable parameters of one module (which modules: `unit_modules`), flattened
in order into one buffer of `padded` = ceil(numel / N) * N elements, so `tensor_split` cuts it
into N shards of `shard` elements: rank r owns [r shard, (r+1) shard). The module's parameters
become views of the buffer (`p.data = flat[o:o+k].view(shape)`), so the model runs unchanged.
The padding (fewer than N elements per unit) stays zero: its gradient is zero, so the
optimizer leaves it at zero (weight decay of zero is zero). Frozen parameters
(`requires_grad=False`) belong to no unit: they stay where they are, whole on every rank.

Stage 3 frees the buffer between uses by resizing its *storage* to zero bytes and gathers it
back into the same storage (what FairScale's and torch's first FSDP did): the parameters'
views, and any view autograd saved for backward (the transposed weight of a Linear), see the
gathered values again, without being re-created. Every buffer lives on the parameters' device.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def layer_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of the book's layers: `model.layer_list()` if it has one (pipelib's
    GPT), else the items of a `layers` ModuleList (pipelib's MLP), else the model."""
    names = {id(m): n for n, m in model.named_modules()}
    if hasattr(model, "layer_list"):
        mods = list(model.layer_list())
    elif isinstance(getattr(model, "layers", None), torch.nn.ModuleList):
        mods = list(model.layers)
    else:
        mods = [model]
    return [(names.get(id(m), "") or "model", m) for m in mods]


def _children_units(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules a forward calls one by one: the children holding parameters, with the
    items of a ModuleList/ModuleDict (containers nobody calls) taken one by one."""
    out = []
    for child in module.children():
        if isinstance(child, _CONTAINERS):
            out += _children_units(child)
        elif any(True for _ in child.parameters()):
            out.append(child)
    return out


def unit_modules(model: torch.nn.Module, units=None) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of the modules ZeRO gathers one at a time (stage 3) and reduces one at a
    time (stages 2-3), in the manner of FSDP's per-module wrapping:

    - None: the book's layers for the book's models (`layer_units`); for any other model its
      children, the items of ModuleLists taken one by one (a transformer's embedding, each
      block, its head), as torchtitan calls `fully_shard` on each block;
    - a list of modules or of their qualified names;
    - a policy, `units(module) -> bool`, asked of every module (FSDP's auto-wrap policy), e.g.
      ``lambda m: isinstance(m, Block)``.

    Whatever the choice, the model itself holds the parameters no chosen module holds. A
    parameter must be used inside the forward of the module whose unit holds it (as FSDP
    requires), since stage 3 gathers it only there."""
    names = {id(m): n for n, m in model.named_modules()}
    if units is None:
        if hasattr(model, "layer_list") or isinstance(getattr(model, "layers", None), torch.nn.ModuleList):
            return layer_units(model)
        mods = _children_units(model)
    elif callable(units) and not isinstance(units, torch.nn.Module):
        mods = [m for m in model.modules() if units(m)]
    else:
        mods = []
        for u in units:
            m = model.get_submodule(u) if isinstance(u, str) else u
            if id(m) not in names:
                raise ValueError(f"ZeRO units: {type(m).__name__} is not a submodule of the model; pass "
                                 f"modules of the wrapped model or their names ({list(names.values())[1:6]}...)")
            mods.append(m)
    return [(names[id(m)] or "model", m) for m in dict.fromkeys(mods)]


class FlatUnit:
    """The parameters of one unit in one flat, padded buffer; this rank's shard of it."""

    def __init__(self, index: int, name: str, params: list, world_size: int, rank: int, dtype):
        self.index, self.name, self.params = index, name, params  # [(qualified name, Parameter)]
        self.numel = sum(p.numel() for _, p in params)
        self.shard = -(-self.numel // world_size)
        self.padded = self.shard * world_size
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        self.dtype, device = dtype, params[0][1].device
        full32 = torch.zeros(self.padded, dtype=torch.float32, device=device)
        self.offsets = []
        off = 0
        for _, p in params:
            full32[off:off + p.numel()].copy_(p.detach().reshape(-1))
            self.offsets.append((off, p.numel()))
            off += p.numel()
        self.flat = full32 if dtype == torch.float32 else full32.to(dtype)
        # fp32 master weights start from the fp32 values, not from their 16-bit rounding
        self.init32 = None if dtype == torch.float32 else full32
        for (o, k), (_, p) in zip(self.offsets, params):
            p.data = self.flat[o:o + k].view(p.shape)
        self.gathered = True
        self.pending = len(params)  # gradients still to arrive in this backward (stages 2-3)

    @property
    def nbytes(self) -> int:
        """Bytes of the full buffer when gathered."""
        return self.padded * self.flat.element_size()

    def local(self) -> torch.Tensor:
        """This rank's shard of the full buffer (a view; valid while gathered)."""
        return self.flat[self.lo:self.hi]

    def release(self) -> int:
        """Free the full buffer's memory (stage 3); return the bytes freed."""
        if not self.gathered:
            return 0
        self.flat.untyped_storage().resize_(0)
        self.gathered = False
        return self.nbytes

    def restore(self, full: torch.Tensor) -> int:
        """Put the gathered `full` buffer back into the storage; return the bytes allocated."""
        if self.gathered:
            return 0
        self.flat.untyped_storage().resize_(self.nbytes)
        with torch.no_grad():
            self.flat.copy_(full)
        self.gathered = True
        return self.nbytes

    def flat_grads(self, dtype=None) -> torch.Tensor:
        """The parameters' gradients in one new padded buffer of `dtype` (the parameters' by
        default; torch.float32 upcasts them), zeros where a gradient is None."""
        out = torch.zeros(self.padded, dtype=dtype or self.dtype, device=self.flat.device)
        for (off, k), (_, p) in zip(self.offsets, self.params):
            if p.grad is not None:
                out[off:off + k].copy_(p.grad.reshape(-1))
        return out

    def pieces(self, lo: int, hi: int):
        """(name, start, stop, at) of each parameter overlapping [lo, hi) of the flat buffer:
        its elements [start, stop) (of p.view(-1)) sit at [at, at + stop - start) of that range
        (start = stop = 0 for a parameter outside the range)."""
        for (o, k), (name, _) in zip(self.offsets, self.params):
            a, b = max(o, lo), min(o + k, hi)
            yield (name, a - o, b - o, a - lo) if a < b else (name, 0, 0, 0)

    def unflatten(self, flat: torch.Tensor) -> dict:
        """{name: tensor} cut from a full buffer of this unit (cloned, fp32)."""
        return {n: flat[o:o + k].view(p.shape).float().clone()
                for (o, k), (n, p) in zip(self.offsets, self.params)}


def _own_params(mods: list, trainable: set) -> dict:
    """{module: [parameters]}: each chosen module's trainable parameters that no chosen module
    inside it holds (nesting allowed: a block and its own scale parameter, its Linears apart)."""
    chosen = {id(m) for m in mods}
    own = {}
    for m in mods:
        inner = {id(p) for sub in m.modules() if sub is not m and id(sub) in chosen for p in sub.parameters()}
        own[m] = [p for p in m.parameters() if id(p) in trainable and id(p) not in inner]
    return own


def build_units(model: torch.nn.Module, world_size: int, rank: int, dtype, units=None) -> tuple[list, dict]:
    """One FlatUnit per module of `unit_modules(model, units)`, each trainable parameter in the
    first that holds it (a tied weight, like the GPT's embedding reused by its head, belongs to
    the embedding's unit); parameters no chosen module holds form a last unit, "rest", the
    model's. Frozen parameters join no unit. Returns (units, {module: [units its forward
    uses]}) for the hooks."""
    names = {id(p): n for n, p in model.named_parameters()}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    layers = unit_modules(model, units)
    mods = [m for _, m in layers]
    own = _own_params(mods, trainable)
    taken, out = set(), []
    for name, mod in layers:
        params = [(names[id(p)], p) for p in own[mod] if id(p) not in taken]
        taken.update(id(p) for _, p in params)
        if params:
            out.append(FlatUnit(len(out), name, params, world_size, rank, dtype))
    rest = [(n, p) for n, p in model.named_parameters() if id(p) in trainable and id(p) not in taken]
    if rest:
        out.append(FlatUnit(len(out), "rest", rest, world_size, rank, dtype))
        own[model] = [p for _, p in rest]  # the root gathers only what no chosen module holds
        mods.append(model)
    unit_of = {id(p): u for u in out for _, p in u.params}
    uses = {}
    for mod in mods:
        used = list(dict.fromkeys(unit_of[id(p)] for p in own[mod]))
        if used:
            uses[mod] = used
    return out, uses
