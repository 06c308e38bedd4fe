"""What the planner plans for: a transformer (`ModelSpec`) on a machine (`Machine`).

    gpt3 = GPT3_175B                                   # Brown et al. 2020, as Megatron-LM trained it
    m = Machine(PROFILES["a100"], gpus_per_node=8, inter_node=LINKS["ib-ndr"])

Pure arithmetic, no torch. Parameters are counted per layer as Megatron-LM's GPT (attention with
grouped K/V heads, a 2- or 3-matrix MLP, two LayerNorms with biases), the embedding once when it
is tied to the head. Introduced in chapter 15.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.costmodel import LINKS, DeviceProfile, Link


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: layers, width, heads (and K/V heads), MLP width, vocabulary,
    sequence length; `tied` embedding and head; `gated` MLP (SwiGLU: three matrices);
    `learned_positions` (GPT) or rotary (Llama: no parameters)."""

    name: str
    n_layer: int
    hidden: int
    n_head: int
    vocab: int
    seq_len: int
    n_kv_head: int | None = None     # None: as many as n_head (multi-head attention)
    ffn: int | None = None           # None: 4 x hidden
    tied: bool = True
    gated: bool = False
    learned_positions: bool = True

    def __post_init__(self):
        for f in ("n_layer", "hidden", "n_head", "vocab", "seq_len"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"ModelSpec {self.name!r}: {f}={getattr(self, f)!r}; use a positive integer")
        if self.hidden % self.n_head:
            raise ValueError(f"ModelSpec {self.name!r}: hidden={self.hidden} is not divisible by "
                             f"n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"ModelSpec {self.name!r}: n_head={self.n_head} is not a multiple of "
                             f"n_kv_head={self.kv_heads}")

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ffn_width(self) -> int:
        return 4 * self.hidden if self.ffn is None else self.ffn

    def layer_split_params(self) -> int:
        """A layer's parameters that tensor parallelism splits: the attention and MLP matrices
        and their biases (Megatron's column- and row-parallel layers)."""
        h, kv = self.hidden, self.hidden * self.kv_heads // self.n_head
        attn = h * (h + 2 * kv) + (h + 2 * kv) + h * h
        mlp = (3 if self.gated else 2) * h * self.ffn_width + self.ffn_width
        return attn + mlp

    def layer_replicated_params(self) -> int:
        """Two LayerNorms (weight and bias) and the row-parallel layers' biases: on every tp rank."""
        return 4 * self.hidden + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.learned_positions else 0)

    def num_params(self) -> int:
        """Every parameter once (a tied head adds none; an untied one V x h)."""
        per_layer = self.layer_split_params() + self.layer_replicated_params()
        head = 0 if self.tied else self.vocab * self.hidden
        return self.n_layer * per_layer + self.embedding_params() + head + 2 * self.hidden

    def model_flops_per_token(self) -> float:
        """Model FLOPs of one token's forward and backward: 6 N (the matmuls, each parameter
        once, the tied embedding once as the head's matmul) plus attention's scores and
        weighted values, 12 L s h, counted whole (not halved for the causal mask), as PaLM's
        MFU (Chowdhery et al. 2022, appendix B). The input embedding's lookup is no matmul, so
        an untied model's input embedding and the learned positions add nothing."""
        lookup = self.embedding_params() if not self.tied else self.embedding_params() - self.vocab * self.hidden
        return 6 * (self.num_params() - lookup) + 12 * self.n_layer * self.seq_len * self.hidden


@dataclass(frozen=True)
class Machine:
    """GPUs of one `DeviceProfile` (its `link` joins the GPUs of a node), `gpus_per_node` of them
    per node, nodes joined by `inter_node`; `efficiency`: the fraction of peak FLOP/s a large
    matmul reaches on it (the one calibrated assumption)."""

    device: DeviceProfile
    gpus_per_node: int = 8
    inter_node: Link = LINKS["ib-ndr"]
    efficiency: float = 1.0

    def __post_init__(self):
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"Machine: gpus_per_node={self.gpus_per_node!r}; use a positive integer")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"Machine: efficiency={self.efficiency}; use a fraction of peak in (0, 1]")

    @property
    def flops(self) -> float:
        return self.device.flops * self.efficiency

    @property
    def profile(self) -> DeviceProfile:
        """The simulated GPU in these nodes (`DeviceProfile.with_nodes`): a Cluster started with
        it clocks each message on its pair of ranks' link, as the planner prices it (chapter 15)."""
        return self.device.with_nodes(self.gpus_per_node, self.inter_node)


# Brown et al. 2020 (table 2.1), vocabulary padded to 51,200 as Megatron-LM trains it (Narayanan et al. 2021)
GPT3_175B = ModelSpec("GPT-3 175B", n_layer=96, hidden=12288, n_head=96, vocab=51200, seq_len=2048)
# Llama 3 70B (Dubey et al. 2024, table 3): GQA with 8 K/V heads, SwiGLU 28,672 wide, untied, RoPE
LLAMA3_70B = ModelSpec("Llama 3 70B", n_layer=80, hidden=8192, n_head=64, vocab=128256, seq_len=8192,
                       n_kv_head=8, ffn=28672, tied=False, gated=True, learned_positions=False)
