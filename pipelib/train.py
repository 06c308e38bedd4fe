"""Single-process training loops and the saved-activation meter (chapters 02 and 03).

These are the reference runs every parallel strategy is later checked against: same seed, same
batches, same losses. They never touch torch's global random state: batches come from a private
torch.Generator, and dropout runs inside `torch.random.fork_rng` seeded from `seed`, so two calls
with the same arguments give the same loss curve bit for bit (on the same machine and thread
count), and the caller's random state is left as it was.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pipelib.runtime.place import rng_devices


def train_gpt(model, data, steps: int, lr: float = 1e-3, batch_size: int = 32,
              block_size: int | None = None, seed: int = 0,
              weight_decay: float = 0.0) -> list[float]:
    """AdamW on next-token prediction; returns the training loss of every step.

    `data` is anything with `get_batch(split, batch_size, block_size, generator)` returning
    (x, y) token ids: a `CharCorpus` or a `MarkovChain`.
    """
    T = block_size or model.config.block_size
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    model.train()
    with torch.random.fork_rng(devices=rng_devices()):
        torch.manual_seed(seed)  # dropout masks
        for _ in range(steps):
            x, y = data.get_batch("train", batch_size, T, g)  # (B, T), (B, T)
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate_gpt(model, data, split: str = "val", batch_size: int = 64,
                 block_size: int | None = None, num_batches: int = 4, seed: int = 1234) -> float:
    """Mean cross-entropy (nats per token) over `num_batches` fixed batches, in eval mode."""
    T = block_size or model.config.block_size
    g = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(num_batches):
        x, y = data.get_batch(split, batch_size, T, g)
        total += model(x, y)[1].item()
    model.train(was_training)
    return total / num_batches


def train_mlp(model, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float = 1e-2,
              batch_size: int | None = None, seed: int = 0) -> list[float]:
    """Adam on cross-entropy over (x, y); full batch unless batch_size is given."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        if batch_size is None:
            xb, yb = x, y
        else:
            ix = torch.randint(len(x), (batch_size,), generator=g)  # (B,)
            xb, yb = x[ix], y[ix]  # (B, in_features), (B,)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def accuracy(model, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of rows whose largest logit is the true class."""
    return (model(x).argmax(dim=-1) == y).float().mean().item()


class SavedActivations:
    """Bytes autograd saves for backward inside the `with` block, counted by storage.

    Uses torch.autograd.graph.saved_tensors_hooks: every tensor an op saves passes through the
    pack hook. Two saved views of one tensor share a storage and count once; a saved view of a
    large tensor counts the whole storage (that memory is really held). Storages of `exclude`
    (the model's parameters and buffers) are model state, not activations.

        with SavedActivations(model) as meter:
            _, loss = model(x, y)
        meter.nbytes, meter.records  # total, and (shape, dtype, bytes) per storage

    Measured here in chapter 03, predicted by `pipelib.memory.gpt_activation_bytes`.
    """

    def __init__(self, model=None, exclude=()):
        tensors = list(exclude)
        if model is not None:
            tensors += list(model.parameters()) + list(model.buffers())
        self._excluded = {t.untyped_storage().data_ptr() for t in tensors}
        self._seen: dict[int, int] = {}
        self.records: list[tuple[tuple[int, ...], torch.dtype, int]] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self._excluded and key not in self._seen:
            self._seen[key] = storage.nbytes()
            self.records.append((tuple(t.shape), t.dtype, storage.nbytes()))
        return t

    @property
    def nbytes(self) -> int:
        return sum(self._seen.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def train_steps(model, batches, optimizer, loss_fn) -> tuple[list[float], dict]:
    """The plainest loop, one optimizer step per (x, y) of `batches`: (every step's loss, the
    last step's gradients by parameter name). `pipelib.recipe.Recipe.reference` runs on it: the
    single process every parallel strategy is checked against (chapter 15)."""
    losses, grads = [], {}
    for x, y in batches:
        loss = loss_fn(model, x, y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        losses.append(loss.item())
    return losses, grads
