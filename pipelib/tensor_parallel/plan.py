"""Tensor-parallel plans: which module of the unaware model gets which parallel style.

A plan is a plain dict, module name (a glob: `blocks.*.attn.c_attn`) -> style, in the manner of
torchtitan's `parallelize_module` plans (`ColwiseParallel()`, `RowwiseParallel()`, ...), so the
chapter can print it and a reader can edit it. A style is written by its name (``"colwise"``)
or as the object (`ColwiseParallel()`); each one, with what it fits and how it splits, is an
entry of `pipelib.tensor_parallel.styles.STYLES` (``colwise``, ``colwise_qkv``, ``rowwise``,
``heads``, ``vocab_embedding``, ``vocab_head``, ``sequence``, ``position_shard``).

Pure: duck-typed on the model (`named_modules`, `n_head`, `in_features`, ...), no torch, so
`validate_plan` raises its errors in the notebook before any engine works. Introduced in
chapter 09.
"""
from __future__ import annotations

from fnmatch import fnmatchcase

from pipelib.checks import check_int
from pipelib.tensor_parallel.styles import STYLES, ParallelStyle, style_of

__all__ = ["STYLES", "ParallelStyle", "style_of", "gpt_tp_plan", "is_sequence_parallel", "validate_plan",
           "check_sequence_divisible"]


def gpt_tp_plan(*, vocab: bool = True, sequence_parallel: bool = False) -> dict[str, str]:
    """The plan for `pipelib.model.GPT` (Megatron-LM §3; with `sequence_parallel`, Korthikanti
    et al. 2022 §4.2.2). `vocab=False` keeps the embedding and head replicated (only the blocks
    are split, as in the DTensor comparison)."""
    plan = {}
    if vocab:
        plan["embed.wte"] = "vocab_embedding"
        if sequence_parallel:
            plan["embed.wpe"] = "position_shard"
    block = {"attn": "heads", "attn.c_attn": "colwise_qkv", "attn.c_proj": "rowwise",
             "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}
    if sequence_parallel:
        block = {"ln_1": "sequence", **block, "ln_2": "sequence"}
    plan.update({f"blocks.*.{k}": v for k, v in block.items()})
    if vocab:
        if sequence_parallel:
            plan["head.ln_f"] = "sequence"
        plan["head.lm_head"] = "vocab_head"
    return plan


def is_sequence_parallel(plan: dict) -> bool:
    """Whether a style of `plan` shards the sequence (``sequence``: Korthikanti et al.)."""
    return any(style_of(style).marks_sequence_parallel for style in plan.values())


def _plan_matches(plan: dict, names: list[str], model_name: str) -> dict[str, list[str]]:
    unknown = {k: v for k, v in plan.items() if not isinstance(v, ParallelStyle) and v not in STYLES}
    if unknown:
        raise ValueError(f"plan styles {unknown} are unknown; use one of {tuple(STYLES)} or a ParallelStyle")
    out = {}
    for pattern in plan:
        hits = [n for n in names if fnmatchcase(n, pattern)]
        if not hits:
            near = [n for n in names if n.split(".")[-1] == pattern.split(".")[-1]][:4] or names[:6]
            raise ValueError(f"plan key {pattern!r} matches no module of {model_name}; modules "
                             f"include {near}: correct the name or remove the entry")
        out[pattern] = hits
    return out


def validate_plan(model, plan: dict, t: int) -> dict[str, list[str]]:
    """Check `plan` against `model` for t ranks; return {plan key: matching module names}.

    Raises a ValueError naming the values for: a key matching no module, an unknown style,
    and what each style's `validate` refuses (heads, features or vocabulary not divisible by t,
    a style on a module of the wrong kind)."""
    check_int(t, "t", context="validate_plan", hint="the tensor-parallel degree, the group's size")
    modules = dict(model.named_modules())
    matched = _plan_matches(plan, [n for n in modules if n], type(model).__name__)
    for pattern, names in matched.items():
        style = style_of(plan[pattern])
        for name in names:
            m = modules[name]
            style.validate(m, name, t, f"plan[{pattern!r}] = {str(style)!r} on {name} ({type(m).__name__})")
    return matched


def check_sequence_divisible(seq_len: int, t: int) -> None:
    """Sequence parallelism cuts the sequence into t equal shards."""
    if seq_len % t:
        raise ValueError(f"sequence parallelism: sequence length {seq_len} is not divisible by "
                         f"t={t}; each rank holds seq_len / t positions: pick a length multiple of {t}")
