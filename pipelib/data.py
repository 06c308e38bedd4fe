"""Data for the book's models, built on the spot: nothing is downloaded.

Three sources (chapters 02 and 03):

- `char_corpus()`: a character-level corpus made of text every Python has, the Zen of Python and
  the source of a few pure-Python standard-library modules (`STDLIB_MODULES`). A tiny GPT trained
  on it writes Python-looking text, as nanoGPT's shakespeare_char writes Shakespeare. The text
  changes only when a Python release edits one of those files, so tests check properties (size,
  determinism, round trips), not a hash; `CharCorpus.fingerprint` tells two machines apart.
- `MarkovChain`: sequences from a random Markov chain of a given order whose best possible
  cross-entropy is known exactly (its entropy rate, Cover & Thomas ch. 4), so a training curve
  can be judged against a floor instead of against hope.
- `spirals()`: the classic two-dimensional spiral classification task for the MLP (CS231n).

Every random draw takes an explicit seed or torch.Generator: same seed, same data, on any rank.
"""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import importlib.util
import io
import math

import torch

STDLIB_MODULES = ("textwrap", "string", "heapq", "bisect", "functools", "fractions",
                  "difflib", "statistics", "random")
SPLITS = ("train", "val")


def zen_of_python() -> str:
    """PEP 20, from the `this` module (imported quietly: importing it prints the poem)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def stdlib_text(modules: tuple[str, ...] = STDLIB_MODULES) -> str:
    """The Zen of Python followed by the source files of `modules`, read from disk."""
    parts = [zen_of_python()]
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = getattr(spec, "origin", None) or ""
        if not origin.endswith(".py"):
            raise ValueError(f"module {name!r} has no source file (origin {origin!r}); pass "
                             f"modules= with pure-Python modules, or give char_corpus(text=...)")
        with open(origin, encoding="utf-8") as f:
            parts.append(f"# ---- {name}.py\n" + f.read())
    return "\n".join(parts)


class CharTokenizer:
    """One token per distinct character, ids in sorted character order."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        try:
            return [self.stoi[ch] for ch in s]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary of "
                             f"{self.vocab_size} characters this tokenizer was built from"
                             ) from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


class CharCorpus:
    """Encoded text with a contiguous split: the first (1 - val_fraction) is train, the rest val."""

    def __init__(self, text: str, val_fraction: float = 0.1):
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.text = text
        self.tokenizer = CharTokenizer(text)
        data = torch.tensor(self.tokenizer.encode(text), dtype=torch.long)  # (N,)
        n_train = int(len(data) * (1 - val_fraction))
        self.train, self.val = data[:n_train], data[n_train:]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def fingerprint(self) -> str:
        """First 12 hex digits of the text's SHA-256: equal fingerprints, equal corpora."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:12]

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator | None = None):
        """Random windows: x (B, T) token ids and y (B, T) the same windows shifted by one."""
        _check_split(split)
        data = self.train if split == "train" else self.val
        if len(data) <= block_size:
            raise ValueError(f"{split} split has {len(data)} tokens, fewer than block_size + 1 = "
                             f"{block_size + 1}; use a smaller block_size or more text")
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
        x = torch.stack([data[i:i + block_size] for i in ix.tolist()])  # (B, T)
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix.tolist()])  # (B, T)
        return x, y


def char_corpus(text: str | None = None, val_fraction: float = 0.1) -> CharCorpus:
    """The book's character corpus: `text` if given (e.g. the book's pages), else stdlib_text()."""
    return CharCorpus(stdlib_text() if text is None else text, val_fraction)


class MarkovChain:
    """Tokens from a random Markov chain of order k over V symbols, with a known loss floor.

    State = the last k tokens (V^k states). Each state's next-token distribution is
    softmax(sharpness * N(0, 1)) drawn once from `seed`: larger sharpness, lower entropy.
    Sequences start in the stationary distribution, so every position looks alike, and the
    best any model can do at position t >= k - 1 is the entropy rate
    H = sum_s pi(s) H(P(. | s)) nats per token.
    """

    def __init__(self, vocab_size: int = 8, order: int = 1, sharpness: float = 2.0, seed: int = 0):
        if vocab_size < 2 or order < 1 or vocab_size ** order > 4096:
            raise ValueError(f"need vocab_size >= 2, order >= 1 and vocab_size**order <= 4096 "
                             f"states, got vocab_size={vocab_size}, order={order}")
        self.vocab_size, self.order = vocab_size, order
        g = torch.Generator().manual_seed(seed)
        S = vocab_size ** order
        logits = sharpness * torch.randn(S, vocab_size, generator=g, dtype=torch.float64)
        self.transition = torch.softmax(logits, dim=-1)  # (S, V), rows sum to 1
        self.stationary = self._stationary()  # (S,)

    def _stationary(self) -> torch.Tensor:
        """pi with pi M = pi, sum(pi) = 1, M the (S, S) state-to-state matrix (least squares)."""
        S, V = self.transition.shape
        M = torch.zeros(S, S, dtype=torch.float64)
        nxt = (torch.arange(S)[:, None] * V + torch.arange(V)[None, :]) % S  # (S, V)
        M.scatter_add_(1, nxt, self.transition)
        f64 = torch.float64
        A = torch.cat([M.T - torch.eye(S, dtype=f64), torch.ones(1, S, dtype=f64)])  # (S+1, S)
        b = torch.cat([torch.zeros(S, dtype=f64), torch.ones(1, dtype=f64)])  # (S+1,)
        pi = torch.linalg.lstsq(A, b[:, None]).solution[:, 0]  # (S,)
        return pi.clamp_min(0) / pi.clamp_min(0).sum()

    @property
    def entropy_rate(self) -> float:
        """Nats per token: the cross-entropy of the true next-token distribution."""
        P = self.transition
        row_h = -(P * P.log()).sum(-1)  # (S,)
        return float((self.stationary * row_h).sum())

    def loss_floor(self, block_size: int) -> float:
        """Best mean cross-entropy over a block: positions t < k - 1 see fewer than k tokens."""
        k, V = self.order, self.vocab_size
        joint = self.stationary.view((V,) * k)  # p(x_0, ..., x_{k-1})

        def entropy(n: int) -> float:  # H(x_0 .. x_{n-1}) under the stationary start
            p = joint.sum(dim=tuple(range(n, k))) if n < k else joint
            p = p[p > 0]
            return float(-(p * p.log()).sum())

        h = [entropy(t + 2) - entropy(t + 1) if t < k - 1 else self.entropy_rate
             for t in range(block_size)]
        return sum(h) / block_size

    def sample(self, batch_size: int, length: int, generator: torch.Generator | None = None):
        """(B, length) int64 sequences, started from the stationary distribution."""
        k, V, S = self.order, self.vocab_size, self.vocab_size ** self.order
        state = torch.multinomial(self.stationary, batch_size, replacement=True,
                                  generator=generator)  # (B,)
        digits = [(state // V ** (k - 1 - j)) % V for j in range(k)]  # k x (B,)
        out = digits[:length]
        for _ in range(length - k):
            nxt = torch.multinomial(self.transition[state], 1, generator=generator)[:, 0]  # (B,)
            out.append(nxt)
            state = (state * V + nxt) % S  # (B,)
        return torch.stack(out, dim=1)  # (B, length)

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator | None = None):
        """Fresh sequences each call (the chain is an endless corpus; both splits draw alike)."""
        _check_split(split)
        seq = self.sample(batch_size, block_size + 1, generator)  # (B, T + 1)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # (B, T), (B, T)


def spirals(n_samples: int = 600, num_classes: int = 3, noise: float = 0.2, seed: int = 0):
    """Interleaved spiral arms in 2-D, one per class: x (N, 2) float32, y (N,) int64.

    Not linearly separable, so a network needs its hidden layers (chapter 02). Points are
    assigned to classes in turn, so every class has n_samples // num_classes points or one more.
    """
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n_samples) % num_classes  # (N,)
    r = torch.rand(n_samples, generator=g)  # (N,) radius in [0, 1)
    theta = (2 * math.pi * y / num_classes + 4.0 * r
             + noise * torch.randn(n_samples, generator=g))  # (N,) angle
    x = torch.stack([r * torch.sin(theta), r * torch.cos(theta)], dim=1)  # (N, 2)
    return x.float(), y
