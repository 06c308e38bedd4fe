"""One forward (and backward) pass of the MoE GPT on a dp x ep mesh with its compute on the
timeline, and the share of it the all-to-alls take.

    cluster.run(timed_forward, recipe, spec, dp=4, ep=4, profile="h100")
    cluster.run(timed_step, recipe, spec, dp=4, ep=4)   # forward and backward
    all_to_all_share(cluster.trace())        # {rank: share of the pass in the MoE all-to-alls}

The MoE forward alternates compute and communication: attention, the router, the counts, the
dispatch all-to-all, the experts, the combine all-to-all. `timed_forward` records every module
that does math (embedding, layer norms, attention, router, each expert, head) as one COMPUTE event,
timed on the device profile from its FLOPs (`Device.compute`), so the trace holds the forward's
timeline: compute bars and the all-to-alls between them (COLLECTIVE events, their time from the
link's alpha and beta). On a simulated device that is the modelled timeline of a real run: the
order and the bytes are what ran.

`timed_step` adds the backward: each timed module's backward is one COMPUTE event ("attn 0
backward"), charged when autograd hands it its output's gradient (a hook on the output), for
twice its forward's time (the input's and the weights' gradients: two matmuls per forward one),
and the backward's all-to-alls (combine's reverse, then dispatch's, labelled "... backward")
fall between them where autograd ran them.

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


def time_modules(model, dev, *, backward: bool = False) -> list:
    """Forward hooks that run each of `_timed_modules` inside `dev.compute(name)`; with
    `backward`, a hook on each output charges "<name> backward" for twice the forward's time
    (module docstring). Returns the hook handles (remove them when done)."""
    open_scopes: dict = {}

    def before(name):
        def hook(module, args):
            open_scopes[name] = dev.compute(name), dev.clock.now()
            open_scopes[name][0].__enter__()
        return hook

    def after(name):
        def hook(module, args, output):
            scope, start = open_scopes.pop(name)
            scope.__exit__(None, None, None)
            if backward and isinstance(output, torch.Tensor) and output.requires_grad:
                seconds = 2 * (dev.clock.now() - start)  # the forward's time, twice
                output.register_hook(lambda grad: _charge(dev, f"{name} backward", seconds))
        return hook

    handles = []
    for name, module in _timed_modules(model):
        handles += [module.register_forward_pre_hook(before(name)), module.register_forward_hook(after(name))]
    return handles


def _charge(dev, label: str, seconds: float) -> None:
    with dev.compute(label, duration=seconds):
        pass


def timed_step(recipe, spec, dp: int, ep: int, *, profile=None) -> float | None:
    """One forward and backward of step 0's batch (`moe_loss`: cross-entropy and the Switch
    terms) on the dp x ep mesh, compute and all-to-alls of both on the trace (module docstring);
    returns this rank's time, None on ranks beyond dp. No gradient is reduced, no step taken."""
    return _timed_moe_pass(recipe, spec, dp, ep, profile, backward=True)


def timed_forward(recipe, spec, dp: int, ep: int, *, profile=None) -> float | None:
    """One forward of step 0's batch on the dp x ep mesh, compute and all-to-alls on the trace
    (module docstring), under `profile` when given; returns this rank's forward time, None on
    ranks beyond dp."""
    return _timed_moe_pass(recipe, spec, dp, ep, profile, backward=False)


def _timed_moe_pass(recipe, spec, dp: int, ep: int, profile, *, backward: bool) -> float | None:
    from pipelib.expert_parallel.gpt import moe_loss
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh
    from pipelib.runtime.place import to_rank_device
    from pipelib.topology import Topology

    mesh = Mesh(Topology(dp=dp, ep=ep))
    if not mesh.contains:
        return None
    dev = current()
    model = to_rank_device(moe_gpt(recipe, spec))
    apply_expert_parallel(model, mesh["ep"])
    x, y = to_rank_device(recipe.batch(0, mesh.local_rank("dp"), dp))
    handles = time_modules(model, dev, backward=backward)
    try:
        with dev.overrides(profile=profile) if profile is not None else contextlib.nullcontext(), \
                torch.enable_grad() if backward else torch.no_grad():
            start = dev.clock.now()
            if backward:
                moe_loss(model, x, y).backward()
            else:
                model(x, y)
            return dev.clock.now() - start
    finally:
        for h in handles:
            h.remove()


def by_role(trace):
    """`trace` with each timed module's COMPUTE label replaced by its role, for a figure with four
    compute colours rather than one per module: "experts" and "experts backward" for the
    experts, "forward" and "backward" for every other module; other events unchanged."""
    from dataclasses import replace

    from pipelib.trace import Trace

    def role(label: str) -> str:
        expert, back = label.startswith("expert "), label.endswith(" backward")
        if expert:
            return "experts backward" if back else "experts"
        return "backward" if back else "forward"

    return Trace([replace(e, label=role(e.label)) if e.kind == Kind.COMPUTE else e for e in trace],
                 world_size=trace.world_size)


def all_to_all_share(trace, prefix: str = "all_to_all") -> dict[int, float]:
    """{rank: time in COLLECTIVE events whose label starts with `prefix` / the rank's span}."""
    out = {}
    for rank in sorted({e.rank for e in trace}):
        events = [e for e in trace if e.rank == rank]
        span = max(e.end for e in events) - min(e.start for e in events)
        comm = sum(e.duration for e in events if e.kind == Kind.COLLECTIVE and e.label.startswith(prefix))
        out[rank] = comm / span if span > 0 else 0.0
    return out
