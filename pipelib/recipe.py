"""One recipe: the model, the data, the seed and the optimizer, and the one single-process run.

    recipe = Recipe(GPTConfig(n_layer=2), batch=8, steps=3)
    x, y = recipe.batch(step=0, dp_rank=1, dp_size=2)    # rank 1's rows of step 0's global batch
    ref = recipe.reference()                             # one process, the whole batch: a StepResult
    check_against_reference(results, ref)                # every strategy, against the same run

Every strategy is checked against the same run: same model (built from `model` and `seed`),
same batches, same losses. `batch(step, dp_rank, dp_size)` is a pure function of (data_seed,
step): the global batch of a step is drawn from a private generator, and data-parallel rank r
takes the r-th contiguous slice, so a run resumed at step k (chapter 18) or re-laid out on
other ranks sees the same rows. The reference runs on `pipelib.train.train_steps`, the loop of
chapters 02-03.

`first_step()` is the reference of a single step (one forward and backward of step 0's batch,
no optimizer step). Every chapter from 07 on checks its strategy against one of the two: DDP
and ZeRO (07-08) and context parallelism (17) over training runs, tensor parallelism and the
pipelines (09-14) over one step; the batches all come from `pipelib.batches.global_batch`.

Pure of any process group: `Recipe` is a frozen value that prints and round-trips through JSON,
so the book prints it, a checkpoint stores it, and `python -m pipelib train` reads it.
Introduced with the spine (chapter 15).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from pipelib.batches import check_data, global_batch
from pipelib.expert_parallel.gpt import moe_gpt, moe_layers, moe_loss
from pipelib.expert_parallel.layer import MoESpec
from pipelib.model import GPT, MLP, GPTConfig, MLPConfig

OPTIMIZERS = MappingProxyType({"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD})
DTYPES = MappingProxyType({"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16})


def build_model(config, seed: int = 0):
    """The book's GPT or MLP from its config (`pipelib.model`), seeded."""
    return GPT(config, seed=seed) if isinstance(config, GPTConfig) else MLP(config, seed=seed)


def loss_of(model, x, y):
    """The mean loss of `model` (or its wrapper) on (x, y): the GPT's own for token targets
    (B, T), plus its MoE layers' Switch losses times their coefficient (`moe_loss`) when it has
    experts; cross-entropy of the MLP's logits for class targets (B,)."""
    if y.dim() == 2:
        return moe_loss(model, x, y) if isinstance(model, torch.nn.Module) and moe_layers(model) else model(x, y)[1]
    logits = model(x)  # (B, classes): bf16 logits are compared in fp32, as mixed precision does
    return torch.nn.functional.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), y)


def as_dtype(dtype) -> torch.dtype:
    """A torch.dtype from one or from its name ("float64"): the one spelling of a dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; use a torch.dtype or one of {list(DTYPES)}")
    return DTYPES[dtype]


def _dtype_key(dtype: torch.dtype) -> str:
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPES)}")


@dataclass(frozen=True)
class Recipe:
    """What is trained, on what, for how long: the same for every strategy and the reference."""

    model: GPTConfig | MLPConfig = field(default_factory=GPTConfig)
    batch_size: int = 8          # rows of the global batch, split over the dp ranks
    steps: int = 3               # optimizer steps
    seed: int = 0                # the model's initial weights
    data_seed: int = 0           # the batches
    optimizer: str = "adam"      # a key of OPTIMIZERS
    lr: float = 1e-2
    dtype: torch.dtype = torch.float32
    seq_len: int | None = None   # tokens per row of a GPT batch (None: the model's block_size)
    data: str = "random"         # a key of pipelib.batches.DATA
    mixed_precision: bool = False  # bf16 compute, fp32 master weights in the optimizer (Adam)
    experts: MoESpec | None = None  # a mixture of experts in place of the GPT's MLPs (chapter 16)

    def __post_init__(self):
        from pipelib.checks import check_int

        for name in ("batch_size", "steps"):
            check_int(getattr(self, name), name, context="Recipe")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Recipe: optimizer={self.optimizer!r}; use one of {list(OPTIMIZERS)}")
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        _dtype_key(self.dtype)
        check_data(self.data)
        if self.seq_len is not None:
            check_int(self.seq_len, "seq_len", context="Recipe")
        if self.mixed_precision and (self.dtype != torch.float32 or OPTIMIZERS[self.optimizer] is not torch.optim.Adam):
            raise ValueError(f"Recipe: mixed_precision=True with dtype={self.dtype}, optimizer={self.optimizer!r}: "
                             f"mixed precision keeps fp32 master weights for torch's Adam; use "
                             f"dtype=torch.float32 and optimizer='adam'")
        if not isinstance(self.model, (GPTConfig, MLPConfig)):
            raise ValueError(f"Recipe: model={self.model!r}; pass a pipelib.model.GPTConfig or MLPConfig")
        if isinstance(self.experts, dict):  # from JSON
            spec = dict(self.experts)
            spec["layers"] = None if spec.get("layers") is None else tuple(spec["layers"])
            object.__setattr__(self, "experts", MoESpec(**spec))
        if self.experts is not None and (not isinstance(self.experts, MoESpec) or not isinstance(self.model, GPTConfig)
                                         or self.mixed_precision):
            raise ValueError(f"Recipe: experts={self.experts!r} with a {type(self.model).__name__} (mixed_precision="
                             f"{self.mixed_precision}); experts are a MoESpec replacing a GPTConfig's MLPs, in the "
                             f"recipe's dtype")

    def replace(self, **changes) -> Recipe:
        """The same recipe with `changes` (`dataclasses.replace`): `SMALL.replace(steps=1, batch_size=32)`."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ the pieces
    def build(self) -> torch.nn.Module:
        """The whole model, the same on every rank (same seed) and in the reference; with
        `experts`, its MLPs replaced by MoE layers (`expert_parallel.gpt.moe_gpt`)."""
        if self.experts is not None:
            return moe_gpt(self, self.experts)
        return build_model(self.model, self.seed).to(self.dtype)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the forward and backward: bf16 under mixed precision, else `dtype`."""
        return torch.bfloat16 if self.mixed_precision else self.dtype

    @functools.cached_property
    def _corpus(self):
        from pipelib.data import char_corpus

        return char_corpus()  # loaded once per recipe, not per step

    def __getstate__(self):  # the loaded corpus stays here: engines load their own
        return {k: v for k, v in self.__dict__.items() if k != "_corpus"}

    def global_batch(self, step: int):
        """Step `step`'s whole batch (`pipelib.batches.global_batch`), inputs in `compute_dtype`."""
        x, y = global_batch(self.model, self.batch_size, step, self.data_seed, seq_len=self.seq_len,
                            data=self.data, corpus=lambda: self._corpus)
        return (x.to(self.compute_dtype) if x.is_floating_point() else x), y

    def batch(self, step: int, dp_rank: int = 0, dp_size: int = 1):
        """Data-parallel rank `dp_rank`'s rows of step `step`'s global batch (x, y), copies of
        their own: a rank holds its rows, not the whole batch a view would keep alive."""
        if self.batch_size % dp_size:
            raise ValueError(f"Recipe: batch_size={self.batch_size} does not split over dp={dp_size} "
                             f"ranks; use a multiple of {dp_size}")
        rows = self.batch_size // dp_size
        x, y = self.global_batch(step)
        mine = slice(dp_rank * rows, (dp_rank + 1) * rows)
        return x[mine].clone(), y[mine].clone()

    def loss(self, model, x, y):
        return loss_of(model, x, y)

    def make_optimizer(self, params):
        return OPTIMIZERS[self.optimizer](params, lr=self.lr)

    # ------------------------------------------------------------------ the reference
    def first_step(self, keep_logits: bool = False):
        """One forward and backward of step 0's whole batch in one process, no optimizer step: a
        `StepResult` with the loss and the gradients, the reference of a single step (chapters
        09-14 check one step of a strategy against it); `keep_logits`: also the model's output,
        as `stats["logits"]` (chapter 09 compares tensor parallelism's gathered logits with it)."""
        from pipelib.results import StepResult

        model = self.build().to(self.compute_dtype)
        x, y = self.global_batch(0)
        out = model(x, y) if y.dim() == 2 else (model(x), None)  # the GPT: (logits, loss)
        loss = out[1] if y.dim() == 2 else loss_of(lambda _: out[0], x, y)
        loss.backward()
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
        return StepResult(loss=loss.detach(), grads=grads, stats={"logits": out[0].detach()} if keep_logits else {})

    def reference(self, device=None, *, shards: int = 1):
        """One process trains the whole batch for `steps` steps: a `StepResult` with the last
        loss, every step's loss, the last step's gradients and the parameters afterwards, on the
        CPU. `device` (e.g. "cuda:0") runs it there instead: a GPU run is checked against one
        process on the same kind of GPU, whose kernels round as its ranks' do. With `experts`,
        routing (capacity, the Switch loss) is per data-parallel shard: `shards` (the plan's dp)
        runs each step's dp shards one after the other, each loss divided by `shards`
        (`expert_parallel.training.moe_reference`); a dense model needs no shards."""
        from pipelib.results import StepResult
        from pipelib.train import train_steps

        if self.experts is not None:
            from pipelib.expert_parallel.training import moe_reference

            if device is not None:
                raise ValueError("Recipe.reference: a recipe with experts runs its reference on the CPU; "
                                 "leave device=None")
            return moe_reference(self, self.experts, dp=shards)

        model = self.build().to(device or "cpu")
        batches = (tuple(t.to(device or "cpu") for t in self.global_batch(s)) for s in range(self.steps))
        if self.mixed_precision:
            from pipelib.data_parallel.mixed_precision import MasterWeightAdam

            opt = MasterWeightAdam(model, lr=self.lr)  # makes the model bf16
        else:
            opt = self.make_optimizer(model.parameters())
        losses, grads = train_steps(model, batches, opt, loss_of)
        grads = {k: g.float().cpu() for k, g in grads.items()} if self.mixed_precision else \
            {k: g.cpu() for k, g in grads.items()}
        params = opt.master_parameters() if self.mixed_precision else \
            {k: p.detach().clone() for k, p in model.named_parameters()}
        params = {k: p.cpu() for k, p in params.items()}
        return StepResult(loss=torch.tensor(losses[-1], dtype=self.dtype), grads=grads, losses=tuple(losses),
                          params=params)

    # ------------------------------------------------------------------ printing, JSON
    def to_dict(self) -> dict:
        kind = "gpt" if isinstance(self.model, GPTConfig) else "mlp"
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["model"] = {"kind": kind, **dataclasses.asdict(self.model)}
        d["dtype"] = _dtype_key(self.dtype)
        if self.experts is not None:
            d["experts"] = {**dataclasses.asdict(self.experts),
                            "layers": None if self.experts.layers is None else list(self.experts.layers)}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Recipe:
        d = dict(d)
        model = dict(d.pop("model", {"kind": "gpt"}))
        kind = model.pop("kind", "gpt")
        config = {"gpt": GPTConfig, "mlp": MLPConfig}.get(kind)
        if config is None:
            raise ValueError(f"Recipe.from_dict: model kind {kind!r}; use 'gpt' or 'mlp'")
        if "hidden" in model and isinstance(model["hidden"], list):
            model["hidden"] = tuple(model["hidden"])
        return cls(model=config(**model), **d)
