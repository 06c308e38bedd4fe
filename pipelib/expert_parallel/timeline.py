"""One forward pass of the MoE GPT on a dp x ep mesh with its compute on the timeline, and the
share of it the all-to-alls take.

    cluster.run(timed_forward, recipe, spec, dp=4, ep=4, profile="h100")
    all_to_all_share(cluster.trace())        # {rank: share of the forward in the MoE all-to-alls}

The MoE forward alternates compute and communication: attention, the router, the counts, the
dispatch all-to-all, the experts, the combine all-to-all. `timed_forward` records every module
that does math (embedding, layer norms, attention, router, each expert, head) as one COMPUTE event,
timed on the device profile from its FLOPs (`Device.compute`), so the trace holds the forward's
timeline: compute bars and the all-to-alls between them (COLLECTIVE events, their time from the
link's alpha and beta). On a simulated device that is the modelled timeline of a real run: the
order and the bytes are what ran. The backward (twice the FLOPs, the same all-to-alls reversed)
is not timed here.

A strategy run on plain torch.distributed; the mesh from `pipelib.runtime.mesh`. Chapter 16.
"""
from __future__ import annotations

import contextlib

import torch

from pipelib.expert_parallel.gpt import apply_expert_parallel, moe_gpt, moe_layers
from pipelib.trace import Kind


def _timed_modules(model) -> list[tuple[str, torch.nn.Module]]:
    """The modules that do math and send nothing, none inside another."""
    out = [("embed", model.embed)]
    for i, block in enumerate(model.blocks):
        out += [(f"ln_1 {i}", block.ln_1), (f"attn {i}", block.attn), (f"ln_2 {i}", block.ln_2)]
        if block.mlp not in moe_layers(model):
            out.append((f"mlp {i}", block.mlp))
    for moe in moe_layers(model):
        out.append((f"router {moe.layer}", moe.router))
        out += [(f"expert {moe.layer}.{key}", expert) for key, expert in moe.experts.items()]
    return out + [("head", model.head)]


def time_modules(model, dev) -> list:
    """Forward hooks that run each of `_timed_modules` inside `dev.compute(name)`; returns the
    hook handles (remove them when done)."""
    open_scopes: dict = {}

    def before(name):
        def hook(module, args):
            open_scopes[name] = dev.compute(name)
            open_scopes[name].__enter__()
        return hook

    def after(name):
        def hook(module, args, output):
            open_scopes.pop(name).__exit__(None, None, None)
        return hook

    handles = []
    for name, module in _timed_modules(model):
        handles += [module.register_forward_pre_hook(before(name)), module.register_forward_hook(after(name))]
    return handles


def timed_forward(recipe, spec, dp: int, ep: int, *, profile=None) -> float | None:
    """One forward of step 0's batch on the dp x ep mesh, compute and all-to-alls on the trace
    (module docstring), under `profile` when given; returns this rank's forward time, None on
    ranks beyond dp."""
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh
    from pipelib.topology import Topology

    mesh = Mesh(Topology(dp=dp, ep=ep))
    if not mesh.contains:
        return None
    dev = current()
    model = apply_expert_parallel(moe_gpt(recipe, spec), mesh["ep"])
    x, y = recipe.batch(0, mesh.local_rank("dp"), dp)
    handles = time_modules(model, dev)
    try:
        with dev.overrides(profile=profile) if profile is not None else contextlib.nullcontext(), torch.no_grad():
            start = dev.clock.now()
            model(x, y)
            return dev.clock.now() - start
    finally:
        for h in handles:
            h.remove()


def all_to_all_share(trace, prefix: str = "all_to_all") -> dict[int, float]:
    """{rank: time in COLLECTIVE events whose label starts with `prefix` / the rank's span}."""
    out = {}
    for rank in sorted({e.rank for e in trace}):
        events = [e for e in trace if e.rank == rank]
        span = max(e.end for e in events) - min(e.start for e in events)
        comm = sum(e.duration for e in events if e.kind == Kind.COLLECTIVE and e.label.startswith(prefix))
        out[rank] = comm / span if span > 0 else 0.0
    return out
