"""What each recomputation policy keeps, its peak saved-activation bytes and its extra FLOPs.

Pure arithmetic, no torch: built on `pipelib.memory`'s per-op counts of the tiny GPT
(`gpt_layer_activation_bytes`, `gpt_activation_bytes`, `gpt_forward_flops`), so a prediction here
is checked against what the memory tracker measures (tests/recompute, chapter 14).

A block of the tiny GPT saves L bytes (`gpt_layer_activation_bytes`) and takes an input of
I = B T C dtype bytes. Under each policy (`pipelib.recompute.policies`; each one's formula below
is its entry's `predict` in `pipelib.recompute.registry`), for n blocks:

- none: all of it, n L, at its most at the end of the forward;
- full / every_k (segments of k blocks, Chen et al. 2016): each segment keeps its input; in
  backward one segment at a time is rerun, and holds all its blocks' activations again. Its
  first block's LayerNorm saves the segment input, which is already kept, so a rerun adds
  k L - I. The peak is the larger of the end of the forward (the kept inputs, the head and the
  loss) and the backward of each segment j (the inputs of segments 0..j plus k_j L - I; the
  head and the loss are gone by then);
- selective (Korthikanti et al. 2022): the attention core's saved tensors (the q, k, v copies
  its matmuls make and the a B T^2 softmax output, plus the dropout mask and the dropped matrix
  when p > 0) are not kept; the core keeps q, k, v, three views of one 3 B T C tensor instead.

Extra FLOPs are the matmuls of the rerun forward: every block for full and every_k (each
segment is rerun once, whatever k), the two T x T products of the core for selective.

Fused attention (FlashAttention; a `Shape` with ``fused_attention=True``, a model too big to
build here) never stores the s x s tensors: the kernel keeps q, k, v, its output and a
log-sum-exp per row and head (fp32), and recomputes the probabilities in its own backward (its
dropout mask too, from the random state). So a fused block keeps 16 B T C elements plus the
log-sum-exp (plus the two residual dropouts' masks), the selective policy has only the
log-sum-exp left to drop, and the trade that matters is full recomputation (or offloading,
`pipelib.recompute.offload`). `fused_layer_bytes` counts it.

Chapter 14. Megatron-LM's 16-bit count s b h (34 + 5 a s / h) is
`pipelib.memory.megatron_layer_activation_bytes`; `selective_headline` is the paper's headline
from it, for unfused or fused attention.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.memory import (
    INDEX_BYTES,
    STATS_BYTES,
    check_activation_args,
    gpt_activation_bytes,
    gpt_forward_flops,
    gpt_layer_activation_bytes,
    megatron_layer_activation_bytes,
)


@dataclass(frozen=True)
class Shape:
    """A GPT's sizes, duck-typed like `pipelib.model.GPTConfig` (for models too big to build)."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = 51200
    block_size: int = 2048
    dropout: float = 0.0
    fused_attention: bool = False  # FlashAttention: no s x s tensor kept (module docstring)


# GPT-3 175B (Brown et al. 2020), the row of Korthikanti et al.'s Table 3.
GPT3_175B = Shape(n_layer=96, n_head=96, n_embd=12288, vocab_size=51200, block_size=2048)


@dataclass(frozen=True)
class PolicyCost:
    """One policy's prediction: bytes kept at the end of the forward, the peak over the step,
    and the matmul FLOPs the rerun adds (one forward of what is recomputed)."""

    policy: str
    k: int | None
    kept_bytes: int
    peak_bytes: int
    extra_flops: int


def fused_layer_bytes(cfg, batch: int, seq: int, itemsize: int = 2, mask_bytes: int | None = None) -> int:
    """One block with fused attention (FlashAttention): the written-out count's 16 B T C elements
    (q, k, v are views of c_attn's output; the kernel's output is c_proj's input), a fp32
    log-sum-exp per row and head (a B T), the LayerNorm statistics and, with dropout, the two
    residual dropouts' masks (the attention dropout's mask is regenerated in backward). In
    16-bit with 1-byte masks: Korthikanti et al.'s 34 s b h, plus the log-sum-exp and statistics."""
    check_activation_args("fused_layer_bytes", batch, seq, itemsize, mask_bytes)
    B, T, C, a = batch, seq, cfg.n_embd, cfg.n_head
    m = itemsize if mask_bytes is None else mask_bytes
    nbytes = itemsize * 16 * B * T * C + STATS_BYTES * a * B * T + 2 * 2 * B * T * STATS_BYTES
    if getattr(cfg, "dropout", 0.0) > 0:
        nbytes += m * 2 * B * T * C
    return nbytes


def layer_bytes(cfg, batch: int, seq: int, itemsize: int = 4, mask_bytes: int | None = None) -> int:
    """What one block keeps: `fused_layer_bytes` for a fused-attention `Shape`, else the tiny
    GPT's op-by-op count (`pipelib.memory.gpt_layer_activation_bytes`)."""
    if getattr(cfg, "fused_attention", False):
        return fused_layer_bytes(cfg, batch, seq, itemsize, mask_bytes)
    return gpt_layer_activation_bytes(cfg, batch, seq, itemsize, mask_bytes)


def core_activation_bytes(cfg, batch: int, seq: int, itemsize: int = 4,
                          mask_bytes: int | None = None) -> int:
    """What the written-out attention core saves: the q, k and v copies of its two matmuls
    (3 B T C) and the softmax output (a B T^2), plus with dropout a mask and the dropped
    matrix (a B T^2 each). Fused: q, k, v (3 B T C) and the fp32 log-sum-exp (a B T)."""
    check_activation_args("core_activation_bytes", batch, seq, itemsize, mask_bytes)
    B, T, C, a = batch, seq, cfg.n_embd, cfg.n_head
    if getattr(cfg, "fused_attention", False):
        return itemsize * 3 * B * T * C + STATS_BYTES * a * B * T
    m = itemsize if mask_bytes is None else mask_bytes
    nbytes = itemsize * (3 * B * T * C + a * B * T * T)
    if getattr(cfg, "dropout", 0.0) > 0:
        nbytes += m * a * B * T * T + itemsize * a * B * T * T
    return nbytes


def selective_layer_bytes(cfg, batch: int, seq: int, itemsize: int = 4,
                          mask_bytes: int | None = None) -> int:
    """A block under selective recomputation: the core's tensors out, its q, k, v (3 B T C) in."""
    full = layer_bytes(cfg, batch, seq, itemsize, mask_bytes)
    return (full - core_activation_bytes(cfg, batch, seq, itemsize, mask_bytes)
            + itemsize * 3 * batch * seq * cfg.n_embd)


def _outside_blocks(cfg, B, T, dt, mask_bytes) -> tuple[int, int]:
    """(embedding's saved bytes, head's plus the loss's): what no policy touches."""
    unfused = gpt_layer_activation_bytes(cfg, B, T, dt, mask_bytes)
    whole = gpt_activation_bytes(cfg, B, T, dt, mask_bytes)
    blocks = cfg.n_layer * unfused
    embed = INDEX_BYTES * (B * T + T)
    if getattr(cfg, "dropout", 0.0) > 0:
        embed += (dt if mask_bytes is None else mask_bytes) * B * T * cfg.n_embd
    return embed, whole - blocks - embed


def _sizes(cfg, B, T, dt, mask_bytes):
    """(L bytes a block saves, embedding's, head's and loss's, per-block forward FLOPs)."""
    L = layer_bytes(cfg, B, T, dt, mask_bytes)
    embed, head = _outside_blocks(cfg, B, T, dt, mask_bytes)
    per_layer_flops = (gpt_forward_flops(cfg, B, T) - 2 * B * T * cfg.n_embd * cfg.vocab_size) // cfg.n_layer
    return L, embed, head, per_layer_flops


def keep_all_cost(cfg, B, T, k, dt, mask_bytes) -> tuple[int, int, int]:
    """none: every block's n L, at its most at the end of the forward; no rerun."""
    L, embed, head, _ = _sizes(cfg, B, T, dt, mask_bytes)
    kept = embed + cfg.n_layer * L + head
    return kept, kept, 0


def segments_cost(cfg, B, T, k, dt, mask_bytes) -> tuple[int, int, int]:
    """full and every_k: segments of k blocks keep their input; one rerun at a time (module doc)."""
    L, embed, head, per_layer_flops = _sizes(cfg, B, T, dt, mask_bytes)
    n, I = cfg.n_layer, dt * B * T * cfg.n_embd
    sizes = [min(k, n - i) for i in range(0, n, k)]
    kept = embed + len(sizes) * I + head
    reruns = [embed + (j + 1) * I + size * L - I for j, size in enumerate(sizes)]
    return kept, max(kept, *reruns), n * per_layer_flops


def selective_cost(cfg, B, T, k, dt, mask_bytes) -> tuple[int, int, int]:
    """selective: the core's tensors out, q, k, v in; the two T x T products rerun."""
    _, embed, head, _ = _sizes(cfg, B, T, dt, mask_bytes)
    n, S = cfg.n_layer, selective_layer_bytes(cfg, B, T, dt, mask_bytes)
    kept = embed + n * S + head
    # Rerunning the last block's core: its LayerNorm-1 tensors and q, k, v still held, the
    # rest of that block, the head and the loss already freed.
    at_core = dt * 5 * B * T * cfg.n_embd + 2 * B * T * STATS_BYTES
    rerun = embed + (n - 1) * S + at_core + core_activation_bytes(cfg, B, T, dt, mask_bytes)
    return kept, max(kept, rerun), n * 4 * B * T * T * cfg.n_embd


def selective_headline(cfg=GPT3_175B, batch: int = 1, seq: int | None = None, *,
                       fused_attention: bool = False) -> dict:
    """Korthikanti et al.'s trade at 16 bits: activation memory saved, FLOPs added.

    Per layer, s b h (34 + 5 a s / h) bytes with the attention written out; selective keeps the
    34 s b h. The rerun core costs 4 b s^2 h FLOPs against a forward of 24 b s h^2 + 4 b s^2 h:
    s / (6 h + s) of a forward, a third of that of a training step (forward and backward).
    The paper writes its overhead as 2.7% for GPT-3 from its own per-iteration estimate
    (`paper_overhead`: s / (6 h), as the paper's Eq. 9 approximates it).

    ``fused_attention=True``: the kernel never stores the 5 a s^2 b bytes (module docstring),
    a layer keeps 34 s b h plus a fp32 log-sum-exp (4 a s b), and selective, rerunning the
    kernel's forward for the same FLOPs, saves only the log-sum-exp."""
    s, b, h, a = cfg.block_size if seq is None else seq, batch, cfg.n_embd, cfg.n_head
    check_activation_args("selective_headline", b, s)
    kept = 34 * s * b * h
    lse = STATS_BYTES * a * s * b
    full = kept + lse if fused_attention else megatron_layer_activation_bytes(cfg, b, s)
    extra = 4 * b * s * s * h
    forward = 24 * b * s * h * h + 4 * b * s * s * h
    return {"full_bytes": full, "selective_bytes": kept, "memory_saved": 1 - kept / full,
            "five_as_over_h": 5 * a * s / h, "extra_flops": extra,
            "flops_over_forward": extra / forward, "flops_over_step": extra / (3 * forward),
            "paper_overhead": s / (6 * h), "fused_attention": fused_attention}
