"""Tensor-parallel styles: each one an object that checks a module and splits it, by name.

    STYLES["colwise"]                  # ColwiseParallel(), as in torch's and torchtitan's plans
    style_of("rowwise").validate(linear, t=2, where="plan['mlp.c_proj']")
    plan = {"blocks.*.mlp.c_fc": "colwise", "blocks.*.mlp.c_proj": RowwiseParallel()}

A `ParallelStyle` (torch.distributed.tensor.parallel's name; torchtitan's plans are made of
`ColwiseParallel()`, `RowwiseParallel()`, `SequenceParallel()`) knows which modules it fits and
what t must divide (`validate`, pure: it reads `in_features`, `n_head`, ... duck-typed, so the
notebook raises before any engine works), and how it swaps the module for its parallel twin
(`apply`: `pipelib.tensor_parallel.layers` and `vocab`, imported when a style is applied).
`STYLES` registers each one under the name a plan writes, so a plan stays a dict of strings
that prints; a plan may hold the objects too. This module is the only place where a style's
name is compared or mapped (a test greps the rest of pipelib): a new style is one class here,
its entry in `STYLES`, and its tests. The styles (Megatron-LM §3; Korthikanti et al. 2022):

- ``colwise``: a Linear split by output features; its input replicated (`f`) or, under sequence
  parallelism, all-gathered along the sequence;
- ``colwise_qkv``: the same for attention's fused `c_attn`, split inside each of q, k and v;
- ``rowwise``: a Linear split by input features; its partial sums all-reduced (`g`) or, under
  sequence parallelism, reduce-scattered along the sequence;
- ``heads``: an attention module whose `n_head` becomes n_head / t;
- ``vocab_embedding``: an Embedding split by vocabulary rows (Megatron's VocabParallelEmbedding);
- ``vocab_head``: the language-model head split by vocabulary, sharing the embedding's shard;
- ``sequence``: a LayerNorm run on the rank's sequence shard; its gradients summed after backward
  (a plan with one is sequence parallel);
- ``position_shard``: the position Embedding, keeping this rank's positions.

Introduced in chapter 09.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar


@dataclass
class Applying:
    """What the styles of one `apply_tensor_parallel` call share: the group, whether the plan is
    sequence parallel, and the embedding shards a tied head reuses (id(full weight) -> (shard,
    first row))."""

    comm: object
    sequence_parallel: bool
    tied: dict = field(default_factory=dict)
    gathered: set = field(default_factory=set)     # id of each module whose input is all-gathered
    sequence: list = field(default_factory=list)   # replicated parameters that see a sequence shard


def _set(model, name: str, module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def _divisible(what: str, value: int, t: int, where: str, hint: str) -> None:
    if value % t:
        ok = [d for d in range(1, value + 1) if value % d == 0 and d <= 64]
        raise ValueError(f"{where}: {what}={value} is not divisible by the tensor-parallel degree "
                         f"t={t}; {hint}. Choose t among {ok} or change {what}")


@dataclass(frozen=True)
class ParallelStyle:
    """How one module is split over the t ranks of the tensor-parallel group."""

    name: ClassVar[str]
    order: ClassVar[int]                      # apply order: the embedding before its tied head
    marks_sequence_parallel: ClassVar[bool] = False

    def validate(self, module, name: str, t: int, where: str) -> None:
        """A ValueError naming the values if `module` (`name` in the model) cannot take this style
        on t ranks; `where` says which plan entry asked."""

    def apply(self, model, name: str, module, ctx: Applying) -> None:
        """Split `module` (named `name` in `model`) in place for this rank of `ctx.comm`."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


class _LinearStyle(ParallelStyle):
    def validate(self, module, name, t, where):
        if not hasattr(module, "in_features"):
            raise ValueError(f"{where}: this style splits a Linear; {name} is a {type(module).__name__}")


@dataclass(frozen=True)
class ColwiseParallel(_LinearStyle):
    """Y_r = X A_r^T: rank r's output features (`ColumnParallelLinear`)."""

    name: ClassVar[str] = "colwise"
    order: ClassVar[int] = 3
    fused: ClassVar[int] = 1

    def validate(self, module, name, t, where):
        super().validate(module, name, t, where)
        _divisible("out_features", module.out_features, t, where, "each rank holds out_features / t outputs")

    def apply(self, model, name, module, ctx):
        from pipelib.tensor_parallel.layers import ColumnParallelLinear

        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        _set(model, name, ColumnParallelLinear(module, ctx.comm, fused=self.fused, label=name,
                                               sequence_parallel=ctx.sequence_parallel,
                                               gathered=id(parent) in ctx.gathered))


@dataclass(frozen=True)
class ColwiseQKVParallel(ColwiseParallel):
    """Attention's fused q, k, v Linear, column-split inside each of the three."""

    name: ClassVar[str] = "colwise_qkv"
    order: ClassVar[int] = 4
    fused: ClassVar[int] = 3

    def validate(self, module, name, t, where):
        _LinearStyle.validate(self, module, name, t, where)
        _divisible("out_features / 3", module.out_features // 3, t, where,
                   "each rank holds a t-th of q, k and v (n_embd / t channels each)")


@dataclass(frozen=True)
class RowwiseParallel(_LinearStyle):
    """Y = sum_r X_r B_r^T: rank r's input features, partial sums reduced (`RowParallelLinear`)."""

    name: ClassVar[str] = "rowwise"
    order: ClassVar[int] = 5

    def validate(self, module, name, t, where):
        super().validate(module, name, t, where)
        _divisible("in_features", module.in_features, t, where, "each rank holds in_features / t inputs")

    def apply(self, model, name, module, ctx):
        from pipelib.tensor_parallel.layers import RowParallelLinear

        _set(model, name, RowParallelLinear(module, ctx.comm, sequence_parallel=ctx.sequence_parallel, label=name))


@dataclass(frozen=True)
class HeadsParallel(ParallelStyle):
    """An attention module running n_head / t heads (its c_attn and c_proj split by their own
    styles); under sequence parallelism its input is all-gathered first (it reads T from it)."""

    name: ClassVar[str] = "heads"
    order: ClassVar[int] = 2

    def validate(self, module, name, t, where):
        if not hasattr(module, "n_head"):
            raise ValueError(f"{where}: 'heads' needs an attention module with n_head; "
                             f"{name} is a {type(module).__name__}")
        _divisible("n_head", module.n_head, t, where, "each rank must hold whole heads, n_head / t of them")

    def apply(self, model, name, module, ctx):
        from pipelib.tensor_parallel.layers import gather_sequence_before

        module.n_head //= ctx.comm.size
        if ctx.sequence_parallel:
            gather_sequence_before(module, ctx.comm, name)
            ctx.gathered.add(id(module))


class _EmbeddingStyle(ParallelStyle):
    def validate(self, module, name, t, where):
        if not hasattr(module, "num_embeddings"):
            raise ValueError(f"{where}: this style splits an Embedding; "
                             f"{name} is a {type(module).__name__}")


@dataclass(frozen=True)
class VocabEmbeddingParallel(_EmbeddingStyle):
    """Rows [r V/t, (r+1) V/t) of the token embedding; partial lookups summed (`VocabParallelEmbedding`)."""

    name: ClassVar[str] = "vocab_embedding"
    order: ClassVar[int] = 0

    def validate(self, module, name, t, where):
        super().validate(module, name, t, where)
        _divisible("vocab_size", module.num_embeddings, t, where,
                   "each rank holds vocab_size / t rows; pad the vocabulary, e.g. GPTConfig(vocab_size=...) "
                   "a multiple of t")

    def apply(self, model, name, module, ctx):
        from pipelib.tensor_parallel.vocab import VocabParallelEmbedding

        new = VocabParallelEmbedding(module, ctx.comm, sequence_parallel=ctx.sequence_parallel, label=name)
        ctx.tied[id(module.weight)] = (new.weight, new.start)
        _set(model, name, new)


@dataclass(frozen=True)
class PositionShardParallel(_EmbeddingStyle):
    """The position embedding, this rank's T/t positions (`PositionShard`)."""

    name: ClassVar[str] = "position_shard"
    order: ClassVar[int] = 1

    def apply(self, model, name, module, ctx):
        from pipelib.tensor_parallel.vocab import PositionShard

        _set(model, name, PositionShard(module, ctx.comm))


@dataclass(frozen=True)
class SequenceParallel(ParallelStyle):
    """A LayerNorm on the rank's sequence shard; its replicated weights' gradients are summed
    over the group after backward (`apply.sync_sequence_grads`)."""

    name: ClassVar[str] = "sequence"
    order: ClassVar[int] = 6
    marks_sequence_parallel: ClassVar[bool] = True

    def validate(self, module, name, t, where):
        if not hasattr(module, "normalized_shape"):
            raise ValueError(f"{where}: 'sequence' runs a LayerNorm on sequence shards; "
                             f"{name} is a {type(module).__name__}")

    def apply(self, model, name, module, ctx):
        ctx.sequence.extend(module.parameters())


@dataclass(frozen=True)
class VocabHeadParallel(_LinearStyle):
    """The tied head: logits of this rank's V/t tokens from the embedding's shard (`VocabParallelHead`)."""

    name: ClassVar[str] = "vocab_head"
    order: ClassVar[int] = 7

    def validate(self, module, name, t, where):
        super().validate(module, name, t, where)
        _divisible("vocab_size", module.out_features, t, where,
                   "each rank holds vocab_size / t rows; pad the vocabulary (Megatron pads to a multiple of "
                   "128 t), e.g. GPTConfig(vocab_size=...)")

    def apply(self, model, name, module, ctx):
        from pipelib.tensor_parallel.vocab import VocabParallelHead

        if id(module.weight) not in ctx.tied:
            raise ValueError(f"plan[{name!r}] = 'vocab_head' needs its weight tied to an embedding the plan "
                             f"splits with 'vocab_embedding' (the GPT's wte); none found")
        weight, start = ctx.tied[id(module.weight)]
        _set(model, name, VocabParallelHead(weight, start, ctx.comm, sequence_parallel=ctx.sequence_parallel,
                                            label=name))


STYLES: MappingProxyType[str, ParallelStyle] = MappingProxyType({s.name: s for s in (
    ColwiseParallel(), ColwiseQKVParallel(), RowwiseParallel(), HeadsParallel(), VocabEmbeddingParallel(),
    VocabHeadParallel(), SequenceParallel(), PositionShardParallel(),
)})


def style_of(style) -> ParallelStyle:
    """The style object for a plan's value: a registered name, or a `ParallelStyle` itself."""
    if isinstance(style, ParallelStyle):
        return style
    found = STYLES.get(style) if isinstance(style, str) else None
    if found is None:
        raise ValueError(f"unknown tensor-parallel style {style!r}; use one of {tuple(STYLES)} or a ParallelStyle")
    return found
