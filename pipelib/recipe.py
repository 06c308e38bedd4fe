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

Pure of any process group: `Recipe` is a frozen value that prints and round-trips through JSON,
so the book prints it, a checkpoint stores it, and `python -m pipelib train` reads it.
Introduced in chapter 15; chapters 07-09 and 14 run their strategies on it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from pipelib.model import GPT, MLP, GPTConfig, MLPConfig

OPTIMIZERS = MappingProxyType({"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD})
DTYPES = MappingProxyType({"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16})


def build_model(config, seed: int = 0):
    """The book's GPT or MLP from its config (`pipelib.model`), seeded."""
    return GPT(config, seed=seed) if isinstance(config, GPTConfig) else MLP(config, seed=seed)


def global_batch(config, batch: int, step: int, seed: int = 0):
    """Step `step`'s global batch (x, y), the same on every rank and in the single process:
    random token windows for the GPT (B, T), random points and classes for the MLP (B, in)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    if isinstance(config, GPTConfig):
        xy = torch.randint(config.vocab_size, (batch, config.block_size + 1), generator=g)  # (B, T + 1)
        return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
    x = torch.randn(batch, config.in_features, generator=g)  # (B, in)
    return x, torch.randint(config.out_features, (batch,), generator=g)  # (B,)


def loss_of(model, x, y):
    """The mean loss of `model` (or its wrapper) on (x, y): the GPT's own for token targets
    (B, T), cross-entropy of the MLP's logits for class targets (B,)."""
    if y.dim() == 2:
        return model(x, y)[1]
    return torch.nn.functional.cross_entropy(model(x), y)


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

    def __post_init__(self):
        from pipelib.checks import check_int

        for name in ("batch_size", "steps"):
            check_int(getattr(self, name), name, context="Recipe")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Recipe: optimizer={self.optimizer!r}; use one of {list(OPTIMIZERS)}")
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        _dtype_key(self.dtype)
        if not isinstance(self.model, (GPTConfig, MLPConfig)):
            raise ValueError(f"Recipe: model={self.model!r}; pass a pipelib.model.GPTConfig or MLPConfig")

    # ------------------------------------------------------------------ the pieces
    def build(self) -> torch.nn.Module:
        """The whole model, the same on every rank (same seed) and in the reference."""
        return build_model(self.model, self.seed).to(self.dtype)

    def global_batch(self, step: int):
        x, y = global_batch(self.model, self.batch_size, step, self.data_seed)
        return (x.to(self.dtype) if x.is_floating_point() else x), y

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
    def reference(self):
        """One process trains the whole batch for `steps` steps: a `StepResult` with the last
        loss, every step's loss, the last step's gradients and the parameters afterwards."""
        from pipelib.results import StepResult
        from pipelib.train import train_steps

        model = self.build()
        batches = (self.global_batch(s) for s in range(self.steps))
        losses, grads = train_steps(model, batches, self.make_optimizer(model.parameters()), loss_of)
        params = {k: p.detach().clone() for k, p in model.named_parameters()}
        return StepResult(loss=torch.tensor(losses[-1]), grads=grads, losses=tuple(losses), params=params)

    # ------------------------------------------------------------------ printing, JSON
    def to_dict(self) -> dict:
        kind = "gpt" if isinstance(self.model, GPTConfig) else "mlp"
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["model"] = {"kind": kind, **dataclasses.asdict(self.model)}
        d["dtype"] = _dtype_key(self.dtype)
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
