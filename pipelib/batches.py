"""The one batch maker: every strategy's data, a pure function of (seed, step).

    x, y = global_batch(GPTConfig(), batch=8, step=0, seed=0)                 # random tokens
    x, y = global_batch(cfg, 8, step=2, seed=1, seq_len=32, data="counting")  # learnable rows

Step `step`'s global batch is drawn from a private generator seeded with seed * 100_003 + step:
the single-step chapters (09-14) draw step 0, a training run (07, 08, 15, 17) steps 0, 1, ...,
and a run resumed at step k (chapter 18) or laid out on other ranks sees the same rows as one
that never stopped. Every rank draws the whole global batch and keeps its own rows
(`pipelib.recipe.Recipe.batch`).

Data sources, one entry each in `DATA` (for the GPT; the MLP always gets random points):
- "random": uniform random token windows (B, T + 1) cut into inputs and next-token targets;
- "counting": rows that count modulo the vocabulary from a random start by a random stride
  (token t = start + stride t): predicting a token needs the two before it, so attention has
  something to learn and the loss falls in a few steps (chapter 17);
- "corpus": random windows of the book's character corpus (`pipelib.data.char_corpus`, no
  download): text a reader can read (chapter 08).
"""
from __future__ import annotations

from types import MappingProxyType

import torch


def _random(config, batch: int, seq_len: int, g: torch.Generator, corpus=None):
    xy = torch.randint(config.vocab_size, (batch, seq_len + 1), generator=g)  # (B, T + 1)
    return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()


def _counting(config, batch: int, seq_len: int, g: torch.Generator, corpus=None):
    start = torch.randint(config.vocab_size, (batch, 1), generator=g)
    stride = torch.randint(1, config.vocab_size, (batch, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % config.vocab_size  # (B, T + 1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _corpus(config, batch: int, seq_len: int, g: torch.Generator, corpus=None):
    from pipelib.data import char_corpus

    corpus = (corpus or char_corpus)()
    if corpus.vocab_size > config.vocab_size:
        raise ValueError(f"data='corpus' has {corpus.vocab_size} symbols but the model's vocab_size is "
                         f"{config.vocab_size}; use vocab_size >= {corpus.vocab_size}")
    return corpus.get_batch("train", batch, seq_len, generator=g)


DATA = MappingProxyType({"random": _random, "counting": _counting, "corpus": _corpus})


def check_data(data: str) -> str:
    if data not in DATA:
        raise ValueError(f"data={data!r}; use one of {list(DATA)}")
    return data


def global_batch(config, batch: int, step: int = 0, seed: int = 0, *, seq_len: int | None = None,
                 data: str = "random", corpus=None):
    """Step `step`'s global batch (x, y), the same on every rank and in the single process:
    token windows for a GPT config (B, T) and their next tokens (B, T), T = `seq_len` or the
    config's block_size; random points (B, in) and classes (B,) for an MLP config. `corpus`: a
    function returning the loaded `CharCorpus` for data="corpus" (default: load it)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    if hasattr(config, "vocab_size"):
        T = config.block_size if seq_len is None else seq_len
        return DATA[check_data(data)](config, batch, T, g, corpus)
    x = torch.randn(batch, config.in_features, generator=g)  # (B, in)
    return x, torch.randint(config.out_features, (batch,), generator=g)  # (B,)
