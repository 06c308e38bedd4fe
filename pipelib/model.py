"""The two models of the book, written to be read: a monolith MLP and a tiny GPT.

Nothing here knows about parallelism (DESIGN.md section 7): the pipeline, tensor-parallel,
recomputation and ZeRO chapters take these modules apart from the outside. So every layer can be
reached and run on its own:

- `MLP.layers` is a ModuleList run in order (chapter 02; chapters 10-12 split it into stages);
- `GPT.layer_list()` is `[embed, *blocks, head]`, each a module mapping one tensor to one tensor
  (chapter 03; later chapters split, shard and recompute these pieces).

The GPT follows Karpathy's nanoGPT (github.com/karpathy/nanoGPT): the Transformer of Vaswani et
al. 2017 with pre-LayerNorm blocks, learned positions and a head tied to the token embedding as in
GPT-2 (Radford et al. 2019). Attention is written out by default (q, k, v, scores, mask, softmax,
weighted sum) so the saved activations and FLOPs that `pipelib.memory` predicts are exactly the
ones autograd keeps; `GPTConfig(flash=True)` calls F.scaled_dot_product_attention instead.

Weights are initialised from an explicit seed (a private torch.Generator), never from the global
random state (which building a model leaves untouched), so two ranks building
`GPT(config, seed=0)` hold identical weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipelib.checks import check_int


# ----------------------------------------------------------------------------- the MLP
@dataclass(frozen=True)
class MLPConfig:
    """A stack of `num_layers` Linear layers, ReLU between them (chapter 02)."""

    in_features: int = 2
    hidden: int = 64
    out_features: int = 3
    num_layers: int = 4
    bias: bool = True

    def __post_init__(self):
        for name in ("in_features", "hidden", "out_features", "num_layers"):
            check_int(getattr(self, name), name, context="MLPConfig", hint="a zero-width layer trains nothing")

    @property
    def dims(self) -> list[int]:
        """Feature sizes between layers: layer i maps dims[i] -> dims[i + 1]."""
        return [self.in_features] + [self.hidden] * (self.num_layers - 1) + [self.out_features]


class MLP(nn.Module):
    """The monolith: `layers[i]` is Linear+ReLU, the last one a bare Linear giving logits."""

    def __init__(self, config: MLPConfig, seed: int = 0):
        super().__init__()
        self.config = config
        d = config.dims
        self.layers = nn.ModuleList()
        with torch.random.fork_rng(devices=[]):  # torch's default init must not move global RNG
            for i in range(config.num_layers):
                linear = nn.Linear(d[i], d[i + 1], bias=config.bias)
                last = i == config.num_layers - 1
                self.layers.append(linear if last else nn.Sequential(linear, nn.ReLU()))
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int) -> None:
        """He initialisation (He et al. 2015) for ReLU layers, zero biases; seeded."""
        g = torch.Generator().manual_seed(seed)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu", generator=g)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in_features)
        for layer in self.layers:
            x = layer(x)  # (B, hidden) ... then (B, out_features)
        return x  # (B, out_features) logits


# ----------------------------------------------------------------------------- the tiny GPT
@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the tiny GPT. Names follow nanoGPT; C = n_embd, T <= block_size."""

    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm (GPT-2 has them)
    flash: bool = False  # F.scaled_dot_product_attention instead of the written-out attention

    def __post_init__(self):
        # 0 blocks or no vocabulary: a shape the formulas count one part with; GPT(config) refuses it
        for name, least in (("vocab_size", 0), ("block_size", 1), ("n_layer", 0), ("n_head", 1), ("n_embd", 1)):
            check_int(getattr(self, name), name, minimum=least, context="GPTConfig")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ValueError(f"GPTConfig: dropout={self.dropout!r}; pass a probability in [0, 1)")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}: each head gets "
                f"n_embd // n_head channels; change one of them"
            )

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, softmax(q k^T / sqrt(hs)) v (Vaswani et al. 2017)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        C = config.n_embd
        self.n_head, self.flash, self.dropout = config.n_head, config.flash, config.dropout
        self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(C, C, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # True above the diagonal: position t may not look at positions after t.
        bs = config.block_size
        future = torch.ones(bs, bs, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("future", future.view(1, 1, bs, bs), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        B, T, _ = x.shape
        # Shapes come from c_attn's output, not from C: a tensor-parallel rank (chapter 09) holds
        # n_head / t heads, and its c_attn gives 3 * C / t channels.
        q, k, v = self.c_attn(x).chunk(3, dim=2)  # 3 x (B, T, nh * hs)
        nh = self.n_head
        hs = q.size(-1) // nh
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        y = self.core(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, nh * hs)  # (B, T, nh * hs), heads side by side
        return self.resid_dropout(self.c_proj(y))  # (B, T, C)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core, softmax(q k^T / sqrt(hs)) v on (B, nh, T, hs): no parameters, and
        the (B, nh, T, T) scores that selective recomputation (chapter 14) chooses not to keep."""
        T, hs = q.size(-2), q.size(-1)
        if self.flash:
            p = self.dropout if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att.masked_fill(self.future[:, :, :T, :T], float("-inf"))  # (B, nh, T, T)
        att = F.softmax(att, dim=-1)  # (B, nh, T, T), rows sum to 1
        att = self.attn_dropout(att)  # (B, nh, T, T)
        return att @ v  # (B, nh, T, hs)


class FeedForward(nn.Module):
    """Position-wise MLP, C -> 4C -> C with GELU (the 'MLP' of nanoGPT)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        C = config.n_embd
        self.c_fc = nn.Linear(C, 4 * C, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * C, C, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        x = self.gelu(self.c_fc(x))  # (B, T, 4C)
        return self.dropout(self.c_proj(x))  # (B, T, C)


class Block(nn.Module):
    """Pre-LN Transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (GPT-2 ordering)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return x


class Embedding(nn.Module):
    """Token embedding plus learned position embedding: token ids -> vectors."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.block_size = config.block_size
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:  # (B, T) int64
        """`positions` (T,): the global position of each of idx's columns, for a shard of a longer
        sequence (context parallelism, chapter 17: zigzag and striped shards are not contiguous);
        None: 0..T-1, the whole sequence."""
        B, T = idx.shape
        if positions is None:
            if T > self.block_size:
                raise ValueError(f"sequence length T={T} exceeds block_size={self.block_size}; "
                                 f"crop the input or build a GPTConfig with a larger block_size")
            pos = torch.arange(T, device=idx.device)  # (T,)
        else:
            pos = positions.to(idx.device)  # (T,) global positions
            if pos.shape != (T,) or int(pos.min()) < 0 or int(pos.max()) >= self.block_size:
                raise ValueError(f"positions must be ({T},) and lie in 0..{self.block_size - 1} "
                                 f"(block_size), got shape {tuple(pos.shape)}, range "
                                 f"{int(pos.min())}..{int(pos.max())}; pass one global position per column")
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C) + (T, C) -> (B, T, C)
        return self.drop(x)  # (B, T, C)


class Head(nn.Module):
    """Final LayerNorm and the language-model head, whose weight is the token embedding."""

    def __init__(self, config: GPTConfig, wte: nn.Embedding):
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = wte.weight  # weight tying (Press & Wolf 2017; GPT-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return self.lm_head(self.ln_f(x))  # (B, T, V) logits


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats: logits (B, T, V), targets (B, T) -> scalar."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))  # ()


class GPT(nn.Module):
    """The tiny GPT: `embed`, `blocks[0..n_layer-1]`, `head`, run one after the other."""

    def __init__(self, config: GPTConfig, seed: int = 0):
        super().__init__()
        for name in ("n_layer", "vocab_size"):  # 0 is for counting formulas only
            check_int(getattr(config, name), name, context="GPT(config)", hint="a model needs one at least")
        self.config = config
        with torch.random.fork_rng(devices=[]):  # torch's default init must not move global RNG
            self.embed = Embedding(config)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.head = Head(config, self.embed.wte)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer); seeded."""
        g = torch.Generator().manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():  # shared head weight appears once, as wte
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, proj_std, generator=g)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02, generator=g)
            elif ".ln_" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def layer_list(self) -> list[nn.Module]:
        """Every unit in order, each mapping one tensor to the next: split points for stages."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) -> (logits (B, T, V), loss or None), as in nanoGPT."""
        x = self.embed(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        logits = self.head(x)  # (B, T, V)
        loss = None if targets is None else cross_entropy(logits, targets)  # ()
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample `max_new_tokens` after idx (B, T); same generator seed -> same text (a CPU
        generator draws on the CPU whatever the model's device, so the text is the same there too)."""
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size:]  # (B, <=block_size)
            logits = self(ctx)[0][:, -1, :] / temperature  # (B, V)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]  # (B, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))  # (B, V)
            probs = F.softmax(logits, dim=-1)  # (B, V)
            if generator is not None and generator.device != probs.device:  # a CPU generator, a GPU model:
                probs = probs.to(generator.device)  # drawn where the generator is, the same text on every device
            nxt = torch.multinomial(probs, 1, generator=generator).to(idx.device)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)  # (B, T + 1)
        self.train(was_training)
        return idx
