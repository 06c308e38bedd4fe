"""`Plan`: where every parameter lives and how each strategy is set, one value for every user.

    plan = Plan(dp=2, tp=2, pp=2, data="zero1", tensor=TensorOptions(sequence_parallel=True),
                pipeline=PipelineOptions("interleaved_1f1b", microbatches=4))
    print(plan)                                   # Plan(dp=2 x tp=2 x pp=2: zero1; interleaved_1f1b, ...)
    Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    plan.check(recipe, world_size=8)              # every value that does not fit, before any engine

The degrees of the axes (dp, tp, pp, cp; ep spreads the experts over dp ranks) and the order of
the grid are the plan's own fields; every strategy's options live in its own frozen section
(`plan.data`, `plan.tensor`, `plan.pipeline`, `plan.context`), as torchtitan's job config and
Megatron-Core's `TransformerConfig` group theirs. A section may be given by its most common
value: `data="zero1"` is `DataOptions(kind="zero1")`, `pipeline="gpipe"` is
`PipelineOptions(schedule="gpipe")`. `parallelize` applies it, the trainer runs it, a
checkpoint's manifest stores it and the torchrun CLI reads it from JSON (a flat JSON of the
earlier layout, `{"data_parallel": "zero1", "microbatches": 4, ...}`, is read too, each key into
its section).

Pure: no torch (the recipe's dtype is read by name). Introduced in chapter 15.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

from pipelib.checks import check_int, is_int_at_least
from pipelib.data_parallel.kinds import DATA_PARALLEL
from pipelib.pipeline.schedules import resolve_schedule, schedule_info
from pipelib.recompute.registry import policy_info
from pipelib.topology import DEFAULT_ORDER, Topology


@dataclass(frozen=True)
class DataOptions:
    """Data parallelism over the dp axis: the kind (a key of `data_parallel.kinds.DATA_PARALLEL`:
    DDP's buckets, ZeRO 1-3), DDP's bucket size in bytes, and HSDP's replicas: with `replicate`
    > 1 a sharding kind shards within groups of dp / replicate ranks (`mesh["dp_shard"]`, one
    node in practice) and all-reduces across the `replicate` copies (`mesh["dp_replicate"]`), as
    FSDP2 on a 2-D mesh and MiCS do."""

    kind: str = "ddp"
    bucket_bytes: int = 25 << 20
    replicate: int = 1

    def __post_init__(self):
        if self.kind not in DATA_PARALLEL:
            raise ValueError(f"Plan: data kind {self.kind!r}; use one of {list(DATA_PARALLEL)}")
        check_int(self.bucket_bytes, "bucket_bytes", context="Plan.data", hint="bytes per DDP bucket")
        check_int(self.replicate, "replicate", context="Plan.data", hint="HSDP's replicas; 1: no HSDP")
        if self.replicate > 1 and not DATA_PARALLEL[self.kind].shards_optimizer:
            raise ValueError(f"Plan.data: replicate={self.replicate} with kind {self.kind!r}: HSDP replicates "
                             f"shards, and {self.kind!r} shards nothing; use a ZeRO kind ('zero1'-'zero3')")


@dataclass(frozen=True)
class TensorOptions:
    """Tensor parallelism over the tp axis: Megatron's sequence parallelism (layer norms and
    dropouts on sequence shards) and the vocabulary-parallel embedding and head."""

    sequence_parallel: bool = False
    vocab_parallel: bool = True


@dataclass(frozen=True)
class PipelineOptions:
    """Pipeline parallelism over the pp axis: the schedule (a name in the schedules' registry),
    the microbatches per step, the stages per rank of a looped schedule (`virtual`, None: the
    schedule's own default) and, for uneven stages, the blocks of each stage (`layers`, one count
    per stage; None: equal counts)."""

    schedule: str = "1f1b"
    microbatches: int = 2
    virtual: int | None = None
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        schedule_info(self.schedule)  # an unknown name: a ValueError listing the schedules
        check_int(self.microbatches, "microbatches", context="Plan.pipeline", hint="microbatches per step")
        if self.virtual is not None:
            check_int(self.virtual, "virtual", context="Plan.pipeline", hint="stages per rank")
            if not schedule_info(self.schedule).chunked and self.virtual != 1:
                raise ValueError(f"Plan.pipeline: virtual={self.virtual} with schedule={self.schedule!r}, which "
                                 f"runs one stage per rank; use a looped schedule (e.g. 'interleaved_1f1b') "
                                 f"or virtual=None")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            if not self.layers or not all(is_int_at_least(n, 1) for n in self.layers):
                raise ValueError(f"Plan.pipeline: layers={self.layers!r}; give one block count >= 1 per stage")

    def schedule_for(self, pp: int):
        """The `Schedule` of `pp` ranks (a ValueError where the schedule does not take them)."""
        return resolve_schedule(self.schedule, pp, self.microbatches, self.virtual or 2)


@dataclass(frozen=True)
class ContextOptions:
    """Context parallelism over the cp axis: ring attention, each rank holding the layout's
    chunks of every sequence ("zigzag" balances the causal work)."""

    layout: str = "zigzag"

    def __post_init__(self):
        from pipelib.context_parallel.layouts import layout_info

        layout_info(self.layout)  # an unknown layout: a ValueError listing them


_SECTIONS = MappingProxyType({"data": (DataOptions, "kind"), "tensor": (TensorOptions, None),
                              "pipeline": (PipelineOptions, "schedule"), "context": (ContextOptions, "layout")})
# a section's option by its flat name: the earlier JSON layout and the CLI's flags
_FLAT = MappingProxyType({
    "data_parallel": ("data", "kind"), "bucket_bytes": ("data", "bucket_bytes"), "replicate": ("data", "replicate"),
    "sequence_parallel": ("tensor", "sequence_parallel"), "vocab_parallel": ("tensor", "vocab_parallel"),
    "schedule": ("pipeline", "schedule"), "microbatches": ("pipeline", "microbatches"),
    "virtual": ("pipeline", "virtual"), "layout": ("context", "layout")})
PLAN_FLAGS = frozenset({"dp", "tp", "pp", "cp", "ep", "recompute", *_FLAT})  # what `Plan.replace` takes by name


@dataclass(frozen=True)
class Plan:
    """The degrees of every axis, the grid's order (outermost first), each strategy's options
    in its own section, and the recomputation policy: small, frozen, printable, JSON."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1                        # experts spread over ep of the dp ranks (divides dp)
    data: DataOptions = field(default_factory=DataOptions)
    tensor: TensorOptions = field(default_factory=TensorOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    context: ContextOptions = field(default_factory=ContextOptions)
    recompute: str = "none"            # a policy of pipelib.recompute.registry
    order: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self):
        for name, (cls, first) in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, str) and first is not None:
                value = cls(**{first: value})
            elif isinstance(value, dict):
                value = cls(**value)
            if not isinstance(value, cls):
                raise TypeError(f"Plan: {name}={value!r}; pass a {cls.__name__}"
                                + (f" or its {first} as a string" if first else ""))
            object.__setattr__(self, name, value)
        object.__setattr__(self, "order", tuple(self.order))
        self.topology()  # degrees and order checked, errors name the values
        policy_info(self.recompute)  # an unknown policy: a ValueError listing them
        kind = DATA_PARALLEL[self.data.kind]
        if self.cp > 1 and (self.pp > 1 or self.tensor.sequence_parallel or not policy_info(self.recompute).keeps_all
                            or not kind.microbatched):
            raise ValueError(f"Plan: cp={self.cp} composes with dp and tp, not yet with pp={self.pp}, "
                             f"sequence_parallel={self.tensor.sequence_parallel}, recompute={self.recompute!r} or "
                             f"data kind {self.data.kind!r} (it must reduce after the backward: 'ddp' "
                             f"or 'zero1'); use those with cp=1")
        if self.ep > 1 and (self.tp > 1 or self.pp > 1 or self.cp > 1 or kind.shards_optimizer):
            raise ValueError(f"Plan: ep={self.ep} composes with dp and a DDP kind, not yet with tp={self.tp}, "
                             f"pp={self.pp}, cp={self.cp} or data kind {self.data.kind!r} (the experts' gradients "
                             f"are reduced over their own group, outside the kind's buffers); use ep=1 with those")
        if self.pp > 1 and not kind.microbatched:
            raise ValueError(f"Plan: data kind {self.data.kind!r} with pp={self.pp}: it reduces each "
                             f"gradient as backward produces it, once per microbatch; use 'ddp' or 'zero1' "
                             f"with a pipeline (as Megatron-LM's distributed optimizer and DeepSpeed do)")
        if self.pp > 1:
            stages = self.pipeline.schedule_for(self.pp).num_stages
            if self.pipeline.layers is not None and len(self.pipeline.layers) != stages:
                raise ValueError(f"Plan.pipeline: layers={self.pipeline.layers} gives {len(self.pipeline.layers)} "
                                 f"stages, but pp={self.pp} with {self.pipeline.schedule!r} cuts {stages}; give "
                                 f"{stages} counts")

    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep,
                        dp_replicate=self.data.replicate, order=self.order)

    def check(self, recipe, world_size: int | None = None) -> None:
        """Every check that needs no engine: the plan against the recipe and the cluster."""
        from pipelib.model import GPTConfig

        if world_size is not None:
            self.topology().check_world(world_size)
        m = self.pipeline.microbatches if self.pp > 1 else 1
        rows = recipe.batch_size // self.dp
        if recipe.batch_size % self.dp or rows % m:
            raise ValueError(f"Plan: batch_size={recipe.batch_size} does not split into dp={self.dp} ranks"
                             + (f" x {m} microbatches" if self.pp > 1 else "") + f"; use a multiple of {self.dp * m}")
        if self.dp > 1 and DATA_PARALLEL[self.data.kind].shards_optimizer and str(recipe.dtype) != "torch.float32":
            raise ValueError(f"Plan: data kind {self.data.kind!r} keeps fp32 flat buffers, but the recipe's "
                             f"dtype is {recipe.dtype}; use Recipe(dtype=torch.float32) or data='ddp'")
        experts = getattr(recipe, "experts", None)
        if self.ep > 1 and (experts is None or experts.num_experts % self.ep):
            raise ValueError(f"Plan: ep={self.ep} spreads the experts over {self.ep} ranks, but the recipe has "
                             + ("no experts; use Recipe(..., experts=MoESpec(...))" if experts is None else
                                f"num_experts={experts.num_experts}; use an ep that divides it"))
        if experts is not None and (self.tp > 1 or self.pp > 1 or self.cp > 1):
            raise ValueError(f"Plan: a recipe with experts runs on dp and ep; tp={self.tp}, pp={self.pp}, "
                             f"cp={self.cp} do not yet carry the experts' Switch loss; use them without experts")
        if (self.tp > 1 or self.pp > 1 or self.cp > 1) and not isinstance(recipe.model, GPTConfig):
            raise ValueError("Plan: tp, pp and cp split the GPT's blocks or its sequence; use a GPTConfig recipe")
        seq_len = recipe.seq_len or getattr(recipe.model, "block_size", 0)
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ValueError(f"Plan: cp={self.cp} cuts each sequence into {2 * self.cp} zigzag chunks, but "
                             f"the recipe's sequences are {seq_len} tokens; use a multiple of {2 * self.cp}")
        if self.pp > 1:
            stages, layers = self.pipeline.schedule_for(self.pp).num_stages, self.pipeline.layers
            n = recipe.model.n_layer
            if layers is not None and sum(layers) != n:
                raise ValueError(f"Plan.pipeline: layers={layers} sum to {sum(layers)} blocks but the GPT has "
                                 f"n_layer={n}; give counts that sum to {n}")
            if n < stages:  # an interleaved schedule cuts 2 stages per rank
                raise ValueError(f"Plan: pp={self.pp} with {self.pipeline.schedule!r} cuts {stages} stages but the "
                                 f"GPT has n_layer={n} blocks; every stage needs one: use n_layer >= {stages}")

    def __str__(self) -> str:
        degrees = " x ".join(f"{a}={getattr(self, a)}" for a in ("dp", "tp", "pp", "cp") if getattr(self, a) > 1)
        degrees += f" (ep={self.ep})" if self.ep > 1 else ""
        extra = [self.data.kind + (f", HSDP {self.data.replicate} x {self.dp // self.data.replicate}"
                                   if self.data.replicate > 1 else "")] if self.dp > 1 else []
        if self.pp > 1:
            p = self.pipeline
            extra += [f"{p.schedule}, m={p.microbatches}" + (f", v={p.virtual}" if p.virtual else "")
                      + (f", layers {'/'.join(map(str, p.layers))}" if p.layers else "")]
        extra += ["sequence parallel"] if self.tensor.sequence_parallel and self.tp > 1 else []
        extra += [f"recompute {self.recompute}"] if self.recompute != "none" else []
        return f"Plan({degrees or '1 rank'}{': ' + '; '.join(extra) if extra else ''})"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["order"] = list(self.order)
        if d["pipeline"]["layers"] is not None:
            d["pipeline"]["layers"] = list(d["pipeline"]["layers"])
        return d

    def replace(self, **changes) -> Plan:
        """A copy with `changes`: fields (`dp=4`, `data="zero3"`) or a section's option by its flat
        name (`microbatches=8`, `schedule="gpipe"`, `sequence_parallel=True`: the CLI's flags)."""
        d = self.to_dict()
        for k, v in changes.items():
            if k in _FLAT:
                section, name = _FLAT[k]
                d[section] = {**d[section], name: v}
            else:
                d[k] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
        return Plan.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """The plan of `to_dict`'s JSON; a flat dict of the earlier layout is read too."""
        if not isinstance(d, dict):
            raise TypeError(f"Plan.from_dict: pass a dict (a plan's JSON object), not {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known - set(_FLAT)
        if unknown:
            raise ValueError(f"Plan.from_dict: unknown keys {sorted(unknown)}; use some of {sorted(known)}")
        out = {k: v for k, v in d.items() if k in known}
        for key, (section, name) in _FLAT.items():
            if key in d:
                current = out.get(section, {})
                if not isinstance(current, dict):
                    raise ValueError(f"Plan.from_dict: both {section!r} and the flat key {key!r}; give one")
                out[section] = {**current, name: d[key]}
        for name, (section, _) in _SECTIONS.items():
            if isinstance(out.get(name), dict):
                fields = {f.name for f in dataclasses.fields(section)}
                extra = set(out[name]) - fields
                if extra:
                    raise ValueError(f"Plan.from_dict: unknown keys {sorted(extra)} in {name!r}; use some of "
                                     f"{sorted(fields)}")
        return cls(**out)
