"""Activation recomputation: which activations to keep for backward, applied from outside.

    apply_recompute(model, "full")            # every block: keep its input, rerun it in backward
    apply_recompute(model, "every_k", k=3)    # Chen et al. 2016: keep every 3rd block's input
    apply_recompute(model, "selective")       # Korthikanti et al. 2022: rerun the attention core
    apply_recompute(model, "none")            # undo: the model as it was built

Backward needs what the forward computed. Autograd keeps it (the *saved tensors*, chapter 03),
and for a Transformer that is most of a training step's memory. Recomputation keeps less and
computes the rest again during backward: one more forward of the part it drops.

The machinery is one autograd.Function, `RerunForward`. Its forward runs a piece of the model
(a block, a segment of blocks, the attention core) without building a graph, and saves only the
piece's inputs through `ctx.save_for_backward` (so every saved-tensor hook sees them: the memory
tracker counts exactly what is kept). Its backward replays the random state the forward
started from (so dropout draws the same masks), reruns the piece with a graph, under the
saved-tensor hooks that were active in the forward (so the tracker counts the recomputed
activations while they live, during backward), and asks autograd for the gradients of the
inputs and of the piece's parameters, which are inputs of the Function too. Same ops on the
same numbers in the same order: the gradients are bitwise those of the model without it.

The model knows nothing (DESIGN.md section 7): a policy sets instance attributes that shadow
the class's methods (`block.forward`, `attn.core`); "none" deletes them. Parameter names, the
state dict and `model.layer_list()` are unchanged, so the same call works on a pipeline stage
(an `nn.Sequential` of blocks, chapter 12): apply it to each stage module after the cut.

Introduced in chapter 14.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from pipelib.recompute.registry import POLICIES, chen_k, policy_info

__all__ = ["POLICIES", "chen_k", "RerunForward", "rerun", "segment_plan", "check_policy", "apply_recompute",
           "keep_all", "rerun_segments", "rerun_core", "recompute_policy"]
class _Tagged:
    """A forward (or attention core) a policy put on a module, with the policy's name: what
    `recompute_policy` reads and `apply_recompute` removes (the module itself carries no tag)."""

    def __init__(self, fn, policy: str):
        self.fn, self.policy = fn, policy

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _tags(m: nn.Module) -> list[_Tagged]:
    return [v for k in ("forward", "core") if isinstance(v := m.__dict__.get(k), _Tagged)]


def _active_hooks():
    """The (pack, unpack) saved-tensor hooks active now, or None. torch keeps them on a stack
    (the innermost pair packs); reading its top is private API, stable in torch 2.x."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


class RerunForward(torch.autograd.Function):
    """out = run(*inputs), keeping only `inputs`; backward reruns `run` and differentiates it.

    apply(run, n_inputs, *inputs, *params): the params are passed so that autograd routes their
    gradients through this node (the inner graph is cut from the outer one)."""

    @staticmethod
    def forward(ctx, run, n_inputs, *args):
        inputs = args[:n_inputs]
        ctx.run, ctx.n_inputs, ctx.params = run, n_inputs, args[n_inputs:]
        ctx.rng = torch.get_rng_state()  # dropout inside `run` draws from here
        ctx.gpus = sorted({x.device.index for x in inputs if x.is_cuda})  # and on a GPU, here
        ctx.gpu_rng = [torch.cuda.get_rng_state(d) for d in ctx.gpus]
        ctx.hooks = _active_hooks()
        ctx.save_for_backward(*inputs)  # the only tensors kept: counted by any active hook
        return run(*inputs)  # grad mode is off inside an autograd.Function's forward

    @staticmethod
    def backward(ctx, grad_out):
        n = ctx.n_inputs
        need = ctx.needs_input_grad[2:]
        inputs = [x.detach().requires_grad_(bool(w) and x.is_floating_point())
                  for x, w in zip(ctx.saved_tensors, need[:n])]
        hooks = (torch.autograd.graph.saved_tensors_hooks(*ctx.hooks) if ctx.hooks
                 else contextlib.nullcontext())
        with torch.random.fork_rng(devices=ctx.gpus), torch.enable_grad(), hooks:
            torch.set_rng_state(ctx.rng)
            for d, state in zip(ctx.gpus, ctx.gpu_rng):
                torch.cuda.set_rng_state(state, d)
            # The piece sees a view of each leaf, not the leaf: module backward hooks (torch's
            # FlopCounterMode / ModuleTracker, which a simulated device's compute timing uses)
            # cannot watch a leaf during autograd.grad. Same values, same gradients.
            out = ctx.run(*[x.view_as(x) if x.requires_grad else x for x in inputs])
        leaves = [*inputs, *ctx.params]
        wanted = [i for i, t in enumerate(leaves) if need[i] and t.requires_grad]
        got = torch.autograd.grad(out, [leaves[i] for i in wanted], grad_out, allow_unused=True)
        del out  # the recomputed graph (and what it saved) dies here, before the next piece
        grads = [None] * len(leaves)
        for i, g in zip(wanted, got):
            grads[i] = g
        return (None, None, *grads)


def rerun(run, inputs, params=()):
    """`run(*inputs)` through `RerunForward`: keep `inputs`, recompute the rest in backward."""
    params = [p for p in params if p.requires_grad]
    return RerunForward.apply(run, len(inputs), *inputs, *params)


# ----------------------------------------------------------------------------- plans
def segment_plan(num_blocks: int, k: int) -> list[range]:
    """Blocks cut into consecutive segments of k (the last one may be shorter)."""
    return [range(i, min(i + k, num_blocks)) for i in range(0, num_blocks, k)]


def check_policy(policy: str, k=None, num_blocks: int | None = None) -> int | None:
    """The segment length a policy runs with: 1 for full, k (default `chen_k`) for every_k,
    None for none and selective; a ValueError naming the bad value otherwise
    (`policy_info(policy).segment_length`)."""
    return policy_info(policy).segment_length(k, num_blocks)


def _model_blocks(model: nn.Module) -> list[nn.Module]:
    from pipelib.model import Block

    return [m for m in model.modules() if isinstance(m, Block)]


def _attentions(model: nn.Module) -> list[nn.Module]:
    from pipelib.model import CausalSelfAttention

    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


def _clear(model: nn.Module) -> None:
    for m in model.modules():
        for key in ("forward", "core"):
            if isinstance(m.__dict__.get(key), _Tagged):
                del m.__dict__[key]


def _segment_forward(blocks: list[nn.Module]):
    """The first block's new forward: the whole segment, its inputs kept, rerun in backward."""
    runs = [type(b).forward.__get__(b) for b in blocks]  # the class's forward: no recursion
    params = [p for b in blocks for p in b.parameters()]

    def run(x):
        for f in runs:
            x = f(x)
        return x

    def forward(x):
        if not torch.is_grad_enabled():
            return run(x)
        return rerun(run, [x], params)

    return forward


def _pass_through(x):
    """Forward of a block whose segment ran in the segment's first block."""
    return x


def _core_forward(attn: nn.Module):
    core = type(attn).core.__get__(attn)

    def forward(q, k, v):
        if not torch.is_grad_enabled():
            return core(q, k, v)
        return rerun(core, [q, k, v])

    return forward


def keep_all(model: nn.Module, blocks: list[nn.Module], k: None, name: str) -> None:
    """none: nothing to change (`apply_recompute` has removed any earlier policy)."""


def rerun_segments(model: nn.Module, blocks: list[nn.Module], k: int, name: str) -> None:
    """full and every_k: segments of k blocks, each run by its first block under `rerun`."""
    for seg in segment_plan(len(blocks), k):
        members = [blocks[i] for i in seg]
        members[0].forward = _Tagged(_segment_forward(members), f"{name}:{k}")
        for b in members[1:]:
            b.forward = _Tagged(_pass_through, f"{name}:{k}")


def rerun_core(model: nn.Module, blocks: list[nn.Module], k: None, name: str) -> None:
    """selective: every attention core keeps q, k, v and is rerun in backward."""
    for attn in _attentions(model):
        attn.core = _Tagged(_core_forward(attn), name)


def apply_recompute(model: nn.Module, policy: str = "full", k: int | None = None) -> nn.Module:
    """Make `model` (a GPT, a stage, any module holding `pipelib.model.Block`s) recompute.

    - "none": keep everything (removes any earlier policy);
    - "full": each block keeps only its input and is rerun in backward;
    - "every_k": blocks cut into segments of k (default round(sqrt(n)), Chen et al. 2016); each
      segment keeps its input, and in backward reruns all k blocks at once. The segment runs
      inside its first block; the others pass their input through;
    - "selective": the attention core (scores, mask, softmax, dropout, @ v) of every block keeps
      q, k, v and is rerun (Korthikanti et al. 2022); everything else is kept.
    The policy is an entry of `pipelib.recompute.registry` (its k, its `apply`: the functions
    above). Returns the model (changed in place), the way torchtitan's apply_ac does.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_recompute: model={model!r:.60} is a {type(model).__name__}; pass the "
                        f"torch.nn.Module (a GPT, a pipeline stage) whose blocks should recompute")
    blocks = _model_blocks(model)
    info = policy_info(policy)
    k = info.segment_length(k, len(blocks))
    if not blocks and not info.keeps_all:
        raise ValueError(f"{type(model).__name__} holds no pipelib.model.Block to recompute")
    _clear(model)
    info.apply(model, blocks, k, info.name)
    return model


def recompute_policy(model: nn.Module) -> str:
    """The policy `model` runs under: "none", "full:1", "every_k:3" or "selective"."""
    tags = {t.policy for m in model.modules() for t in _tags(m)}
    return tags.pop() if len(tags) == 1 else ("none" if not tags else "mixed")
