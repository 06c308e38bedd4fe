"""The ways to reduce gradients over the data-parallel axis, as `pipelib.parallelize` applies them.

    DATA_PARALLEL["zero1"].wrap(stage_module, mesh["dp"], plan.data, optimizer)

`apply_data_parallel(modules, group, options, optimizer, names)` wraps each module this rank
holds and returns what the kind leaves on the rank (`pipelib.applied.Applied`): its backward,
its reduction once a module's gradients are in, and, for a kind that shards the optimizer, the
optimizer and the gathered shards. One entry per kind: DDP's buckets (chapter 07) or ZeRO stage
1, 2 or 3 (chapter 08). Every wrapper answers the same calls (`backward`, `finish_gradients`,
`close`), and a kind that shards the optimizer (ZeRO) also steps it (`optimizer_step`,
`zero_grad`) and gathers its shards for the check (`full`). `microbatched` says whether its
reduction can wait for a pipeline stage's last microbatch (ZeRO-2 and -3 reduce each gradient as
backward produces it).

Introduced in chapter 15.
"""
from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

from pipelib.applied import Applied


class DataParallelKind(NamedTuple):
    """One way to reduce gradients over the dp axis. `wrap(module, group, options, optimizer)`
    (options: the plan's `DataOptions`)
    returns an object with `backward(loss)` (timed), `finish_gradients()` (the reduction, once
    per step), `close()`; with `shards_optimizer`, also `optimizer_step()`, `zero_grad()` and
    `full(what)` ({name in the module: whole tensor}), since it steps its own shards."""

    name: str
    wrap: Callable
    shards_optimizer: bool
    microbatched: bool  # its reduction can wait for a pipeline stage's last microbatch
    doc: str


def _ddp(step: str):
    """A DDP step of chapter 07 (`steps.DDP_STEPS`) on the dp group, the plan's bucket size."""
    def wrap(module, group, options, optimizer, replicate_group=None, ignore=frozenset()):
        from pipelib.data_parallel.steps import DDP_STEPS

        return DDP_STEPS[step].wrap(module, group, comm="pipelib", bucket_bytes=options.bucket_bytes, ignore=ignore)
    return wrap


class ZeROReducer:
    """ZeRO over the dp axis behind the reducer's calls (its optimizer over this rank's shards)."""

    def __init__(self, module, group, stage, optimizer, replicate_group=None):
        from pipelib.data_parallel.zero import ZeRO
        from pipelib.runtime.device import current

        self.dev = current()
        self.zero = ZeRO(module, group, stage, optimizer=optimizer, replicate_group=replicate_group)

    def backward(self, loss) -> None:
        with self.dev.compute("B"):
            loss.backward()

    def finish_gradients(self) -> None:
        """ZeRO reduces at its step (stages 2-3 also during backward)."""

    def optimizer_step(self) -> None:
        self.zero.step()

    def zero_grad(self) -> None:
        self.zero.zero_grad()

    def full(self, what: str) -> dict:
        return self.zero.full_gradients() if what == "grad" else self.zero.full_parameters()

    def close(self) -> None:
        """Nothing to stop."""


def _zero(stage):
    return lambda module, group, options, optimizer, replicate_group=None: ZeROReducer(
        module, group, stage, optimizer, replicate_group)


DATA_PARALLEL = MappingProxyType({k.name: k for k in (
    DataParallelKind("ddp", _ddp("buckets"), False, True,
                     "DDP's buckets, all-reduced once a stage's gradients are in (chapter 07)"),
    DataParallelKind("ddp_overlap", _ddp("overlap"), False, False,
                     "DDP's buckets all-reduced from gradient hooks during backward (chapter 07)"),
    DataParallelKind("zero1", _zero(1), True, True, "ZeRO-1: optimizer state sharded (chapter 08)"),
    DataParallelKind("zero2", _zero(2), True, False, "ZeRO-2: gradients reduce-scattered in backward"),
    DataParallelKind("zero3", _zero(3), True, False, "ZeRO-3: parameters gathered per unit, then freed"),
)})


class Owned:
    """The optimizers that data-parallel kinds own (ZeRO's, over each module's shards), stepped
    as one."""

    def __init__(self, owners):
        self.owners = owners

    def step(self) -> None:
        for r in self.owners:
            r.optimizer_step()

    def zero_grad(self, set_to_none: bool = False) -> None:
        for r in self.owners:
            r.zero_grad()


def apply_data_parallel(modules, group, options, optimizer: Callable, names: dict, replicate_group=None,
                        ignore=frozenset()) -> Applied:
    """Wrap each of `modules` (the model, or this rank's pipeline stages) with the data-parallel
    kind of `options` (a plan's `DataOptions`) over `group`; `names` maps id(parameter) to its
    monolith name (for ZeRO's gathered shards). The record's `after_backward(module)` reduces
    that module's gradients. HSDP: `group` is the shard group and `replicate_group` the ranks
    holding the same shard (a sharding kind only). `ignore`: monolith names of parameters another
    strategy reduces over its own group (experts over edp; DDP kinds only)."""
    info = DATA_PARALLEL[options.kind]
    extra = {} if replicate_group is None else {"replicate_group": replicate_group}
    if ignore:
        extra["ignore"] = frozenset(ignore)
    reducers = {id(m): info.wrap(m, group, options, optimizer, **extra) for m in modules}
    first = reducers[id(modules[0])]

    def whole(what: str) -> dict:
        out = {}
        for m in modules:
            mine = {n: names[id(p)] for n, p in m.named_parameters()}
            out.update({mine[n]: t for n, t in reducers[id(m)].full(what).items()})
        return out

    def close() -> None:
        for r in reducers.values():
            r.close()

    return Applied(axis="dp", backward=first.backward,
                   after_backward=lambda module: reducers[id(module)].finish_gradients(),
                   optimizer=Owned(list(reducers.values())) if info.shards_optimizer else None,
                   whole=whole if info.shards_optimizer else None, close=close)
