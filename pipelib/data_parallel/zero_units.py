"""One layer's parameters as one flat buffer in N equal shards: the layout under every ZeRO stage.

A unit is the parameters of one layer (`GPT.layer_list()`, the MLP's `layers`, or the whole
model), flattened in order into one buffer of `padded` = ceil(numel / N) * N elements, so
`tensor_split` cuts it into N shards of `shard` elements: rank r owns [r shard, (r+1) shard).
The module's parameters become views of the buffer (`p.data = flat[o:o+k].view(shape)`), so
the model runs unchanged. The padding (fewer than N elements per unit) stays zero: its gradient
is zero, so Adam leaves it at zero.

Stage 3 frees the buffer between uses by resizing its *storage* to zero bytes and gathers it
back into the same storage (what FairScale's and torch's first FSDP did): the parameters'
views, and any view autograd saved for backward (the transposed weight of a Linear), see the
gathered values again, without being re-created.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch


def layer_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of the layers ZeRO shards one by one: `model.layer_list()` if it has one
    (pipelib's GPT), else the items of a `layers` ModuleList (pipelib's MLP), else the model."""
    names = {id(m): n for n, m in model.named_modules()}
    if hasattr(model, "layer_list"):
        mods = list(model.layer_list())
    elif isinstance(getattr(model, "layers", None), torch.nn.ModuleList):
        mods = list(model.layers)
    else:
        mods = [model]
    return [(names.get(id(m), "") or "model", m) for m in mods]


class FlatUnit:
    """The parameters of one layer in one flat, padded buffer; this rank's shard of it."""

    def __init__(self, index: int, name: str, params: list, world_size: int, rank: int, dtype):
        self.index, self.name, self.params = index, name, params  # [(qualified name, Parameter)]
        self.numel = sum(p.numel() for _, p in params)
        self.shard = -(-self.numel // world_size)
        self.padded = self.shard * world_size
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        self.dtype = dtype
        full32 = torch.zeros(self.padded, dtype=torch.float32)
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

    def flat_grads(self) -> torch.Tensor:
        """The parameters' gradients in one new padded buffer (zeros where a gradient is None)."""
        out = torch.zeros(self.padded, dtype=self.dtype)
        for (off, k), (_, p) in zip(self.offsets, self.params):
            if p.grad is not None:
                out[off:off + k].copy_(p.grad.reshape(-1))
        return out

    def unflatten(self, flat: torch.Tensor) -> dict:
        """{name: tensor} cut from a full buffer of this unit (cloned, fp32)."""
        return {n: flat[o:o + k].view(p.shape).float().clone()
                for (o, k), (n, p) in zip(self.offsets, self.params)}


def build_units(model: torch.nn.Module, world_size: int, rank: int, dtype) -> tuple[list, dict]:
    """One FlatUnit per layer, each parameter in the first layer that holds it (a tied weight,
    like the GPT's embedding reused by its head, belongs to the embedding's unit); leftover
    parameters form a last unit. Returns (units, {module: [units it uses]}) for the hooks."""
    names = {id(p): n for n, p in model.named_parameters()}
    taken, units, uses = set(), [], {}
    layers = layer_units(model)
    for name, mod in layers:
        params = [(names[id(p)], p) for p in mod.parameters() if id(p) not in taken]
        taken.update(id(p) for _, p in params)
        if params:
            units.append(FlatUnit(len(units), name, params, world_size, rank, dtype))
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in taken]
    if rest:
        units.append(FlatUnit(len(units), "rest", rest, world_size, rank, dtype))
        layers = layers + [("model", model)]
    unit_of = {id(p): u for u in units for _, p in u.params}
    for _, mod in layers:
        uses[mod] = list(dict.fromkeys(unit_of[id(p)] for p in mod.parameters()))
    if rest:
        uses[model] = [units[-1]]  # the root gathers only what no layer holds
    return units, uses
