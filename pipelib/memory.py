"""Analytic memory and FLOPs of the book's models: pure arithmetic, no torch.

Every count here is derived for pipelib's own models (`pipelib.model`) and checked against what
torch really does (tests/test_memory.py): parameter, gradient and optimizer bytes equal torch's
allocations exactly; activation bytes are what autograd saves for backward, counted per op; FLOPs
are the matrix products that torch.utils.flop_counter counts. Configs are duck-typed: anything
with the fields of `GPTConfig` (vocab_size, block_size, n_layer, n_head, n_embd, [bias, dropout,
flash]) or of `MLPConfig` (in_features, hidden, out_features, num_layers, [bias]) will do.

Four kinds of bytes live on a training device (chapter 03; ZeRO in chapter 08 splits them):
parameters, gradients, optimizer state (Adam keeps two moments per parameter, Kingma & Ba 2015)
and activations saved for the backward pass (Korthikanti et al. 2022). In mixed precision with
Adam a parameter costs 2 + 2 + 12 = 16 bytes before activations (Rajbhandari et al. 2020, ZeRO).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from pipelib.checks import check_int, check_ints

INDEX_BYTES = 8  # token ids and targets are int64
STATS_BYTES = 4  # LayerNorm keeps mean and 1/std in fp32
ZERO_K = 12  # fp32 master weights + Adam m + Adam v, bytes per parameter (ZeRO's K)


# ----------------------------------------------------------------------------- parameters
def gpt_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of `pipelib.model.GPT`, as `named_parameters()` lists them.

    The head is tied to `embed.wte`, so it adds no parameter (Press & Wolf 2017).
    """
    C, V, bias = cfg.n_embd, cfg.vocab_size, getattr(cfg, "bias", True)
    shapes = {"embed.wte.weight": (V, C), "embed.wpe.weight": (cfg.block_size, C)}

    def add(name, out, inp=None):
        shapes[f"{name}.weight"] = (out, inp) if inp else (out,)
        if bias:
            shapes[f"{name}.bias"] = (out,)

    for i in range(cfg.n_layer):
        b = f"blocks.{i}"
        add(f"{b}.ln_1", C)
        add(f"{b}.attn.c_attn", 3 * C, C)
        add(f"{b}.attn.c_proj", C, C)
        add(f"{b}.ln_2", C)
        add(f"{b}.mlp.c_fc", 4 * C, C)
        add(f"{b}.mlp.c_proj", C, 4 * C)
    add("head.ln_f", C)
    return shapes


def mlp_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of `pipelib.model.MLP` (layers[i] = Linear [+ ReLU])."""
    d = [cfg.in_features] + [cfg.hidden] * (cfg.num_layers - 1) + [cfg.out_features]
    shapes = {}
    for i in range(cfg.num_layers):
        name = f"layers.{i}" if i == cfg.num_layers - 1 else f"layers.{i}.0"
        shapes[f"{name}.weight"] = (d[i + 1], d[i])
        if getattr(cfg, "bias", True):
            shapes[f"{name}.bias"] = (d[i + 1],)
    return shapes


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Shapes for a GPT-like or MLP-like config (told apart by their fields)."""
    if hasattr(cfg, "n_layer"):
        return gpt_param_shapes(cfg)
    if hasattr(cfg, "num_layers"):
        return mlp_param_shapes(cfg)
    raise TypeError(f"{type(cfg).__name__} has neither n_layer (GPT) nor num_layers (MLP) fields")


def num_params(cfg, non_embedding: bool = False) -> int:
    """Number of parameters. non_embedding drops token and position embeddings (Kaplan 2020)."""
    shapes = param_shapes(cfg)
    skip = ("embed.wte.weight", "embed.wpe.weight") if non_embedding else ()
    return sum(prod(s) for name, s in shapes.items() if name not in skip)


# ----------------------------------------------------------------------------- model state
@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of parameters, gradients and optimizer state on one device."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def optimizer_state_bytes(n_params: int, n_tensors: int = 0, optimizer: str = "adam",
                          itemsize: int = 4, momentum: float = 0.0) -> int:
    """Bytes torch's optimizer keeps after its first step.

    Adam/AdamW: exp_avg and exp_avg_sq (2 x n_params), plus one fp32 `step` counter tensor per
    parameter tensor. SGD: one momentum buffer per parameter if momentum != 0, else nothing.
    """
    opt = optimizer.lower()
    if opt in ("adam", "adamw"):
        return 2 * n_params * itemsize + 4 * n_tensors
    if opt == "sgd":
        return n_params * itemsize if momentum else 0
    raise ValueError(f"unknown optimizer {optimizer!r}; choose 'adam', 'adamw' or 'sgd'")


def model_state_bytes(cfg, optimizer: str = "adam", itemsize: int = 4,
                      momentum: float = 0.0) -> ModelStateBytes:
    """Parameters, gradients and optimizer state, all in one dtype (fp32 by default)."""
    shapes = param_shapes(cfg)
    n = sum(prod(s) for s in shapes.values())
    return ModelStateBytes(n * itemsize, n * itemsize,
                           optimizer_state_bytes(n, len(shapes), optimizer, itemsize, momentum))


def mixed_precision_adam_bytes(n_params: int) -> ModelStateBytes:
    """16 bytes per parameter: fp16 params (2) + fp16 grads (2) + K=12 of fp32 Adam state.

    ZeRO's accounting (Rajbhandari et al. 2020): 7.5B parameters need 120 GB before activations.
    """
    return ModelStateBytes(2 * n_params, 2 * n_params, ZERO_K * n_params)


def check_activation_args(context: str, batch, seq=1, itemsize=4, mask_bytes=None) -> None:
    """batch, seq and itemsize integers >= 1 (mask_bytes too, unless None): a ValueError naming
    the first that is not, before a formula turns it into a negative or fractional byte count."""
    check_ints(context, batch=batch, seq=seq, itemsize=itemsize)
    if mask_bytes is not None:
        check_int(mask_bytes, "mask_bytes", context=context, hint="bytes per dropout-mask element, or None")


# ----------------------------------------------------------------------------- activations
def gpt_layer_activation_bytes(cfg, batch: int, seq: int, itemsize: int = 4,
                               mask_bytes: int | None = None) -> int:
    """Bytes autograd saves in one Block of `pipelib.model.GPT` for a (batch, seq) input.

    Counted op by op for the written-out attention (B, T, C, a = heads), in elements:
      ln_1 input, ln_1 output (= c_attn input)                      2 BTC
      q and k copied by matmul, v copied by matmul                  3 BTC
      softmax output (also the input of att @ v)                    a B T^2
      c_proj input (heads made contiguous)                          1 BTC
      ln_2 input, ln_2 output (= c_fc input)                        2 BTC
      c_fc output (GELU input), GELU output (c_proj input)          8 BTC
    plus LayerNorm mean and 1/std (2 x 2 BT, fp32). With dropout > 0: one mask per dropout
    (attention a B T^2, two residual BTC) and the dropped attention matrix (a B T^2). CPU
    dropout keeps a float mask (mask_bytes = itemsize, the default); CUDA keeps a bool
    (mask_bytes=1).
    With `flash` (and no dropout) SDPA keeps q, k, v as views of the c_attn output (3 BTC), its
    output (BTC, already laid out for c_proj, so no copy) and a log-sum-exp (a BT): no T x T
    matrix at all. (With dropout > 0 torch 2.13 on CPU falls back to the written-out math.)
    In 16-bit with 1-byte masks this is Korthikanti et al.'s 34 sbh + 5 a s^2 b plus the
    LayerNorm statistics: see `megatron_layer_activation_bytes`.
    """
    check_activation_args("gpt_layer_activation_bytes", batch, seq, itemsize, mask_bytes)
    B, T, C, a = batch, seq, cfg.n_embd, cfg.n_head
    p = getattr(cfg, "dropout", 0.0)
    m = itemsize if mask_bytes is None else mask_bytes
    stats = 2 * 2 * B * T * STATS_BYTES
    if getattr(cfg, "flash", False) and p == 0:
        return itemsize * (16 * B * T * C + a * B * T) + stats
    nbytes = itemsize * (16 * B * T * C + a * B * T * T) + stats
    if p > 0:
        nbytes += m * (a * B * T * T + 2 * B * T * C) + itemsize * a * B * T * T
    return nbytes


def gpt_activation_bytes(cfg, batch: int, seq: int, itemsize: int = 4,
                         mask_bytes: int | None = None, include_loss: bool = True) -> int:
    """Bytes saved for backward by a whole forward pass `GPT(idx, targets)`.

    Embedding: token ids (int64) and positions (int64), plus a dropout mask if dropout > 0.
    Head: ln_f input and output, LayerNorm statistics. Loss: log-softmax output (B T V),
    targets (int64) and one scalar weight. Parameters and buffers are not activations.
    """
    check_activation_args("gpt_activation_bytes", batch, seq, itemsize, mask_bytes)
    B, T, C, V = batch, seq, cfg.n_embd, cfg.vocab_size
    m = itemsize if mask_bytes is None else mask_bytes
    embed = INDEX_BYTES * (B * T + T)
    if getattr(cfg, "dropout", 0.0) > 0:
        embed += m * B * T * C
    layers = cfg.n_layer * gpt_layer_activation_bytes(cfg, B, T, itemsize, mask_bytes)
    head = itemsize * 2 * B * T * C + 2 * B * T * STATS_BYTES
    loss = itemsize * (B * T * V + 1) + INDEX_BYTES * B * T if include_loss else 0
    return embed + layers + head + loss


def megatron_layer_activation_bytes(cfg, batch: int, seq: int) -> int:
    """Korthikanti et al. 2022, eq. (2): s b h (34 + 5 a s / h) bytes per layer, 16-bit.

    Written as 34 sbh + 5 a s^2 b to stay an exact integer.
    """
    check_activation_args("megatron_layer_activation_bytes", batch, seq)
    s, b, h, a = seq, batch, cfg.n_embd, cfg.n_head
    return 34 * s * b * h + 5 * a * s * s * b


def mlp_activation_bytes(cfg, batch: int, itemsize: int = 4, include_loss: bool = True) -> int:
    """Bytes saved by `MLP(x)` plus cross-entropy: the input, every ReLU output, the loss.

    Each Linear saves its input (for the weight gradient) and each ReLU its output (the sign
    of the output is the derivative), and the two are the same tensor, counted once.
    """
    check_activation_args("mlp_activation_bytes", batch, 1, itemsize)
    B = batch
    nbytes = itemsize * B * (cfg.in_features + (cfg.num_layers - 1) * cfg.hidden)
    if include_loss:
        nbytes += itemsize * (B * cfg.out_features + 1) + INDEX_BYTES * B
    return nbytes


# ----------------------------------------------------------------------------- FLOPs
def gpt_forward_flops(cfg, batch: int, seq: int) -> int:
    """Matmul FLOPs of one forward pass (2 per multiply-add), attention included.

    Per layer: c_attn 6 BTC^2, q k^T 2 BT^2 C, att @ v 2 BT^2 C, c_proj 2 BTC^2, c_fc and the
    MLP c_proj 8 BTC^2 each: 24 BTC^2 + 4 BT^2 C. The tied head adds 2 BTCV. The causal mask
    does not halve the count: the full T x T product is computed, then masked.
    """
    check_activation_args("gpt_forward_flops", batch, seq)
    B, T, C, V = batch, seq, cfg.n_embd, cfg.vocab_size
    per_layer = 24 * B * T * C * C + 4 * B * T * T * C
    return cfg.n_layer * per_layer + 2 * B * T * C * V


def gpt_train_flops(cfg, batch: int, seq: int) -> int:
    """Forward + backward FLOPs: backward is 2x forward (gradients of inputs and of weights)."""
    return 3 * gpt_forward_flops(cfg, batch, seq)


def flops_6n(cfg, tokens: int) -> int:
    """Kaplan et al. 2020's rule C = 6 N D with N the non-embedding parameters.

    It leaves out attention scores (4 BT^2 C per layer, large when T ~ C) and the head
    (2 BTCV, large for big vocabularies), and counts biases and LayerNorms as matmuls.
    """
    return 6 * num_params(cfg, non_embedding=True) * tokens


def mlp_forward_flops(cfg, batch: int) -> int:
    """2 B d_in d_out per Linear layer (the bias add is not a matmul)."""
    check_activation_args("mlp_forward_flops", batch)
    d = [cfg.in_features] + [cfg.hidden] * (cfg.num_layers - 1) + [cfg.out_features]
    return sum(2 * batch * d[i] * d[i + 1] for i in range(cfg.num_layers))


def mlp_train_flops(cfg, batch: int, input_requires_grad: bool = False) -> int:
    """Forward + backward. Backward skips the input gradient of layer 0 unless it is needed."""
    fwd = mlp_forward_flops(cfg, batch)
    skipped = 0 if input_requires_grad else 2 * batch * cfg.in_features * (
        cfg.hidden if cfg.num_layers > 1 else cfg.out_features)
    return 3 * fwd - skipped
