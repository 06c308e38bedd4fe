"""Tensor-parallel plans: which module of the unaware model gets which parallel style.

A plan is a plain dict, module name (a glob: `blocks.*.attn.c_attn`) -> style, in the manner of
torchtitan's `parallelize_module` plans (`ColwiseParallel()`, `RowwiseParallel()`, ...), so the
chapter can print it and a reader can edit it. Styles:

- ``colwise``: a Linear split by output features (Megatron's column-parallel `A = [A_1 ... A_t]`);
  its input is replicated (`f`) or, under sequence parallelism, all-gathered along the sequence;
- ``colwise_qkv``: the same for attention's fused `c_attn`, split inside each of q, k and v, so
  rank r holds q, k and v of heads r n_head/t ... (r+1) n_head/t - 1;
- ``rowwise``: a Linear split by input features (`B = [B_1; ...; B_t]`); its partial sums are
  all-reduced (`g`) or, under sequence parallelism, reduce-scattered along the sequence;
- ``heads``: an attention module whose `n_head` becomes n_head / t (model.py reads head shapes
  from c_attn's output, so nothing else changes);
- ``vocab_embedding``: an Embedding split by vocabulary rows (Megatron's VocabParallelEmbedding);
- ``vocab_head``: the language-model head split by vocabulary, sharing the embedding's shard
  (the GPT's tie), its logits left sharded for `vocab_parallel_cross_entropy`;
- ``sequence``: a LayerNorm run on the rank's sequence shard (Korthikanti et al. 2022); its
  weights are replicated and their gradients summed over the group after the backward pass;
- ``position_shard``: the position Embedding, keeping this rank's positions (sequence parallel).

Pure: duck-typed on the model (`named_modules`, `n_head`, `in_features`, ...), no torch, so
`validate_plan` raises its errors in the notebook before any engine works. Introduced in
chapter 09.
"""
from __future__ import annotations

from fnmatch import fnmatchcase

from pipelib.checks import check_int

STYLES = ("colwise", "colwise_qkv", "rowwise", "heads", "vocab_embedding", "vocab_head",
          "sequence", "position_shard")


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
    return any(style == "sequence" for style in plan.values())


def _plan_matches(plan: dict, names: list[str], model_name: str) -> dict[str, list[str]]:
    unknown = {k: v for k, v in plan.items() if v not in STYLES}
    if unknown:
        raise ValueError(f"plan styles {unknown} are unknown; use one of {STYLES}")
    out = {}
    for pattern in plan:
        hits = [n for n in names if fnmatchcase(n, pattern)]
        if not hits:
            near = [n for n in names if n.split(".")[-1] == pattern.split(".")[-1]][:4] or names[:6]
            raise ValueError(f"plan key {pattern!r} matches no module of {model_name}; modules "
                             f"include {near}: correct the name or remove the entry")
        out[pattern] = hits
    return out


def _tp_divisible(what: str, value: int, t: int, where: str, hint: str) -> None:
    if value % t:
        ok = [d for d in range(1, value + 1) if value % d == 0 and d <= 64]
        raise ValueError(f"{where}: {what}={value} is not divisible by the tensor-parallel degree "
                         f"t={t}; {hint}. Choose t among {ok} or change {what}")


def validate_plan(model, plan: dict, t: int) -> dict[str, list[str]]:
    """Check `plan` against `model` for t ranks; return {plan key: matching module names}.

    Raises a ValueError naming the values for: a key matching no module, an unknown style,
    heads, features or vocabulary not divisible by t, a style on a module of the wrong kind."""
    check_int(t, "t", context="validate_plan", hint="the tensor-parallel degree, the group's size")
    modules = dict(model.named_modules())
    matched = _plan_matches(plan, [n for n in modules if n], type(model).__name__)
    for pattern, names in matched.items():
        style = plan[pattern]
        for name in names:
            m = modules[name]
            kind = type(m).__name__
            where = f"plan[{pattern!r}] = {style!r} on {name} ({kind})"
            if style in ("colwise", "colwise_qkv", "rowwise", "vocab_head"):
                if not hasattr(m, "in_features"):
                    raise ValueError(f"{where}: this style splits a Linear; {name} is a {kind}")
                if style == "rowwise":
                    _tp_divisible("in_features", m.in_features, t, where, "each rank holds in_features / t inputs")
                elif style == "colwise_qkv":
                    _tp_divisible("out_features / 3", m.out_features // 3, t, where,
                               "each rank holds a t-th of q, k and v (n_embd / t channels each)")
                elif style == "vocab_head":
                    _tp_divisible("vocab_size", m.out_features, t, where,
                               "each rank holds vocab_size / t rows; pad the vocabulary (Megatron "
                               "pads to a multiple of 128 t), e.g. GPTConfig(vocab_size=...)")
                else:
                    _tp_divisible("out_features", m.out_features, t, where, "each rank holds out_features / t outputs")
            elif style == "heads":
                if not hasattr(m, "n_head"):
                    raise ValueError(f"{where}: 'heads' needs an attention module with n_head; {name} is a {kind}")
                _tp_divisible("n_head", m.n_head, t, where, "each rank must hold whole heads, n_head / t of them")
            elif style in ("vocab_embedding", "position_shard"):
                if not hasattr(m, "num_embeddings"):
                    raise ValueError(f"{where}: this style splits an Embedding; {name} is a {kind}")
                if style == "vocab_embedding":
                    _tp_divisible("vocab_size", m.num_embeddings, t, where,
                               "each rank holds vocab_size / t rows; pad the vocabulary, e.g. "
                               "GPTConfig(vocab_size=...) a multiple of t")
            elif style == "sequence" and not hasattr(m, "normalized_shape"):
                raise ValueError(f"{where}: 'sequence' runs a LayerNorm on sequence shards; {name} is a {kind}")
    return matched


def check_sequence_divisible(seq_len: int, t: int) -> None:
    """Sequence parallelism cuts the sequence into t equal shards."""
    if seq_len % t:
        raise ValueError(f"sequence parallelism: sequence length {seq_len} is not divisible by "
                         f"t={t}; each rank holds seq_len / t positions: pick a length multiple of {t}")
