"""Cutting a model into pipeline stages, and one stage's four compute ops: F, B, I, W.

A pipeline stage is a contiguous slice of the model's layers (GPipe, Huang et al. 2019). The
model knows nothing of this (DESIGN.md section 7): `split_into_stages(model.layers, p)` takes
its layers from the outside and returns p `nn.Sequential`s.

A `Stage` runs one slice on one microbatch at a time and keeps, per microbatch, what backward
needs (the *stash*: the stage input, each layer's output and the autograd graph). Its ops:

- F `forward`: stage input -> stage output (the last stage also computes the loss);
- B `backward`: gradient of the output -> gradient of the input, weight gradients accumulated;
- I `backward_input` and W `backward_weight`: B split in two, as in Zero Bubble (Qi et al.
  2023). I computes only the input gradient (the one the previous stage waits for) and keeps
  the gradient at each layer's output (or module's: `per_module`); W later turns those into
  weight gradients, so the matmuls of B are split between I and W exactly once each.
Introduced in chapter 10 (split, F, B) and chapter 13 (I, W).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from pipelib.checks import check_int, is_int_at_least
from pipelib.runtime.device import current

BALANCES = ("layers", "cost")


# ----------------------------------------------------------------------------- partitioning
def _even(n: int, p: int) -> list[int]:
    """Layers per stage, as equal as can be; the first n % p stages get one more."""
    return [n // p + (1 if i < n % p else 0) for i in range(p)]


def _min_max(costs: Sequence[float], p: int) -> list[int]:
    """Contiguous split of `costs` into p non-empty parts minimising the largest part's sum.

    Dynamic programming over (layers used, stages used), O(n^2 p): the book's models have tens
    of layers. Among equally good splits the first one found wins (deterministic).
    """
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(p + 1)]  # best[k][i]: first i layers in k stages
    cut = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    for k in range(1, p + 1):
        for i in range(k, n - (p - k) + 1):
            for j in range(k - 1, i):
                worst = max(best[k - 1][j], prefix[i] - prefix[j])
                if best[k][i] == inf or worst < best[k][i] * (1 - 1e-12):
                    best[k][i], cut[k][i] = worst, j
    sizes, i = [], n
    for k in range(p, 0, -1):
        sizes.append(i - cut[k][i])
        i = cut[k][i]
    return sizes[::-1]


def layer_cost(layer: nn.Module) -> int:
    """A layer's cost for balancing: its parameter count (a Linear's FLOPs per sample are 2x that)."""
    return sum(p.numel() for p in layer.parameters())


def partition(num_layers: int, num_stages: int, balance="layers",
              costs: Sequence[float] | None = None) -> list[range]:
    """Which layers each stage gets: a list of `num_stages` contiguous, non-empty ranges.

    `balance`: "layers" (equal layer counts), "cost" (minimise the most expensive stage under
    `costs`, one number per layer), or a list of layer counts per stage (torchgpipe's
    `balance=`).
    """
    check_int(num_stages, "num_stages")
    if num_stages > num_layers:
        raise ValueError(f"cannot split {num_layers} layers into num_stages={num_stages} stages: "
                         f"every stage needs at least one layer; use num_stages <= {num_layers} "
                         f"or a model with more layers")
    if isinstance(balance, str):
        if balance == "layers":
            sizes = _even(num_layers, num_stages)
        elif balance == "cost":
            if costs is None or len(costs) != num_layers:
                raise ValueError(f"balance='cost' needs one cost per layer: got "
                                 f"{None if costs is None else len(costs)} costs for {num_layers} layers")
            sizes = _min_max(list(costs), num_stages)
        else:
            raise ValueError(f"balance={balance!r}; use one of {BALANCES} or a list of layer "
                             f"counts per stage")
    else:
        sizes = list(balance)
        if (len(sizes) != num_stages or sum(sizes) != num_layers
                or not all(is_int_at_least(s) for s in sizes)):
            raise ValueError(f"balance={sizes} must list num_stages={num_stages} positive layer "
                             f"counts summing to num_layers={num_layers}")
    bounds, start = [], 0
    for size in sizes:
        bounds.append(range(start, start + size))
        start += size
    return bounds


def split_into_stages(layers, num_stages: int, balance="layers") -> list[nn.Sequential]:
    """Cut a list of modules run in order (e.g. `MLP.layers`) into `num_stages` `nn.Sequential`s.

    The modules are shared, not copied: stage k's parameters *are* the model's. With
    balance="cost" the stages get about equal parameter counts (see `partition`).
    """
    layers = list(layers)
    costs = [layer_cost(layer) for layer in layers] if balance == "cost" else None
    return [nn.Sequential(*layers[r.start:r.stop])
            for r in partition(len(layers), num_stages, balance, costs)]


def stage_modules(model_config, num_stages: int, *, model_seed: int = 0, balance="layers",
                  dtype=None) -> tuple[list[range], list[nn.Sequential]]:
    """The seeded MLP cut into `num_stages` stages: (layer ranges, one nn.Sequential each).

    Every rank builds the same model (same seed) and cuts it the same way, so stage k is the
    same on every rank and in `pipelib.pipeline.torch_twin` (which hands these modules to torch).
    """
    from pipelib.model import MLP  # the model knows nothing of stages: imported here, not there

    model = MLP(model_config, seed=model_seed)
    if dtype is not None:
        model = model.to(dtype)
    bounds = partition(len(model.layers), num_stages, balance,
                       [layer_cost(layer) for layer in model.layers])
    return bounds, split_into_stages(model.layers, num_stages, [len(b) for b in bounds])


def stage_grads(bounds: list[range], index: int, module: nn.Module) -> dict:
    """Stage `index`'s gradients under the monolith's names: '1.0.weight' -> 'layers.5.0.weight'."""
    grads = {}
    for name, prm in module.named_parameters():
        k, _, rest = name.partition(".")
        grads[f"layers.{bounds[index].start + int(k)}.{rest}"] = prm.grad
    return grads


# ----------------------------------------------------------------------------- one stage
@dataclass
class _Stash:
    """What one microbatch leaves on a stage between its F and its backward."""

    input: torch.Tensor                  # the stage input (requires grad unless stage 0)
    outputs: list[torch.Tensor]          # each layer's output, in order
    root: torch.Tensor                   # what backward starts from: the output, or the loss
    output_grads: dict[int, torch.Tensor] = field(default_factory=dict)  # set by I, used by W
    units: list | None = None            # per_module: (own parameters, output) of each call


class Stage:
    """One pipeline stage: a module, its place in the pipeline, and the per-microbatch stash.

    `module` is run layer by layer when it is an `nn.Sequential` (so W can compute each layer's
    weight gradient on its own), else as one layer. `per_module=True` splits B at every module
    that holds parameters of its own instead (each call's output is kept, by forward hooks):
    W then differentiates each such module alone. An MoE layer needs it: W of the layer as a
    whole would pass back through its combine all-to-all, a collective that I already ran
    (chapter 16); per module, I runs every all-to-all of the backward and W none.
    """

    def __init__(self, module: nn.Module, index: int, num_stages: int, *, per_module: bool = False):
        if not 0 <= index < num_stages:
            raise ValueError(f"stage index {index} is outside 0..{num_stages - 1}")
        self.module, self.index, self.num_stages, self.per_module = module, index, num_stages, per_module
        self.layers = list(module) if isinstance(module, nn.Sequential) else [module]
        self.stash: dict[int, _Stash] = {}

    def __repr__(self) -> str:
        return (f"Stage({self.index} of {self.num_stages}, {len(self.layers)} layers, "
                f"{len(self.stash)} microbatches stashed)")

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    def _take(self, microbatch: int, op: str, keep: bool = False) -> _Stash:
        if microbatch not in self.stash:
            raise RuntimeError(f"stage {self.index}: {op} of microbatch {microbatch} before its "
                               f"forward (stashed: {sorted(self.stash)})")
        return self.stash[microbatch] if keep else self.stash.pop(microbatch)

    def forward(self, microbatch: int, x: torch.Tensor, target=None,
                loss_fn: Callable | None = None, scale: float = 1.0) -> torch.Tensor:
        """F: run the layers on `x`, stash what backward needs, return a detached output.

        The last stage returns `loss_fn(output, target) * scale` instead (scale = 1/m makes the
        step's loss the mean over microbatches). Saved activations are counted on this rank's
        memory tracker while they live.
        """
        if self.is_last and loss_fn is None:
            raise ValueError(f"stage {self.index} is the last stage: pass loss_fn (and target)")
        x = x.detach()
        if not self.is_first:
            x.requires_grad_(True)
        hooks = self._unit_hooks() if self.per_module else []
        try:
            with current().memory.saved_activations():
                h, outputs = x, []
                for layer in self.layers:
                    h = layer(h)
                    outputs.append(h)
                root = loss_fn(h, target) * scale if self.is_last else h
        finally:
            for hook, _ in hooks:
                hook.remove()
        units = [call for _, calls in hooks for call in calls] if self.per_module else None
        self.stash[microbatch] = _Stash(x, outputs, root, units=units)
        return root.detach()

    def _unit_hooks(self) -> list:
        """(hook handle, the calls it records) on every module with parameters of its own: each
        call's (parameters, output), when the output is a tensor that needs a gradient."""
        out = []
        for mod in self.module.modules():
            params = [p for p in mod.parameters(recurse=False) if p.requires_grad]
            if params:
                calls: list = []

                def record(m, args, y, calls=calls, params=params):
                    if isinstance(y, torch.Tensor) and y.requires_grad:
                        calls.append((params, y))
                out.append((mod.register_forward_hook(record), calls))
        return out

    def _check_grad(self, grad_output):
        if not self.is_last and grad_output is None:
            raise ValueError(f"stage {self.index}: backward needs the gradient of its output")
        return None if self.is_last else grad_output

    def backward(self, microbatch: int, grad_output: torch.Tensor | None = None):
        """B: input gradient (returned; None on stage 0) and weight gradients (into .grad)."""
        grad_output = self._check_grad(grad_output)
        st = self._take(microbatch, "B")
        torch.autograd.backward(st.root, grad_output)
        return None if self.is_first else st.input.grad

    def _weighted(self) -> list[tuple[int, list[nn.Parameter]]]:
        out = []
        for k, layer in enumerate(self.layers):
            params = [p for p in layer.parameters() if p.requires_grad]
            if params:
                out.append((k, params))
        return out

    def _units(self, st: _Stash) -> list[tuple[list[nn.Parameter], torch.Tensor]]:
        """(parameters, the output their gradient comes from): weighted layers, or modules."""
        if st.units is not None:
            return st.units
        return [(params, st.outputs[k]) for k, params in self._weighted()]

    def backward_input(self, microbatch: int, grad_output: torch.Tensor | None = None):
        """I: only the input gradient (returned); keeps the gradient at each weighted layer's output.

        One autograd pass from the root to the stage input and to the outputs of the layers
        that have weights: every matmul computes its input gradient only. The graph is kept
        (retain_graph) for W.
        """
        grad_output = self._check_grad(grad_output)
        st = self._take(microbatch, "I", keep=True)
        wanted = [] if self.is_first else [st.input]
        unit_ids = []
        for u, (_, out) in enumerate(self._units(st)):
            if out is st.root:  # the stage output itself: its gradient is grad_output
                st.output_grads[u] = grad_output
            else:
                unit_ids.append(u)
                wanted.append(out)
        # per module, a call may not reach the root (an expert no token chose): a zero gradient
        extra = {"allow_unused": True, "materialize_grads": True} if self.per_module else {}
        grads = (torch.autograd.grad(st.root, wanted, grad_output, retain_graph=True, **extra)
                 if wanted else ())
        skip = 0 if self.is_first else 1
        st.output_grads.update(zip(unit_ids, grads[skip:]))
        return None if self.is_first else grads[0]

    def backward_weight(self, microbatch: int) -> None:
        """W: weight gradients from what I kept, accumulated into .grad; frees the stash."""
        st = self._take(microbatch, "W")
        units = self._units(st)
        if not st.output_grads and units:
            raise RuntimeError(f"stage {self.index}: W of microbatch {microbatch} before its I")
        extra = {"allow_unused": True, "materialize_grads": True} if self.per_module else {}
        for u, (params, out) in enumerate(units):
            grads = torch.autograd.grad(out, params, st.output_grads[u], retain_graph=True, **extra)
            for p, g in zip(params, grads):
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
