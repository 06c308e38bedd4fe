"""Every random state of a rank, taken and put back, so that a resumed run draws what it would have.

    states = rng_states()        # {"torch": ByteTensor, "cuda": [...], "python": ..., "numpy": ...}
    set_rng_states(states)

A run resumed bit for bit needs the generators where they were: torch's CPU generator (dropout,
`torch.randn` in a model or a loss), every CUDA device's generator where CUDA is initialised,
Python's `random` and, when numpy is loaded, its global generator. The book's data need none of
them: `Recipe.batch(step, ...)` draws from a private generator seeded by (data_seed, step), so
the data position is the step. Everything here is a tensor, a number or a tuple of them, so a
checkpoint holding it loads with `torch.load(weights_only=True)`.

Introduced in chapter 18.
"""
from __future__ import annotations

import random
import sys

import torch


def rng_states() -> dict:
    """This process's random states (torch CPU, CUDA where initialised, Python, numpy if loaded)."""
    out = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out["numpy"] = (kind, torch.from_numpy(key.astype("int64")), int(pos), int(has_gauss), float(cached))
    return out


def set_rng_states(states: dict) -> None:
    """Put back what `rng_states` took (a missing entry leaves that generator alone)."""
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    np = sys.modules.get("numpy")
    if "numpy" in states and np is not None:
        kind, key, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((kind, key.numpy().astype("uint32"), pos, has_gauss, cached))
