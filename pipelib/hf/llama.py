"""A `transformers` Llama of the tiny GPT's size, as pipelib's strategies see it.

    config = llama_config(GPTConfig())          # LlamaConfig: 2 layers, 4 heads, C = 64, V = 65
    model = build_llama(config, seed=0)          # LlamaForCausalLM, random weights, no download
    layers = llama_layers(model)                 # [embed, decoder 0, ..., decoder L-1, head]

The model is Hugging Face's own `LlamaForCausalLM` (Touvron et al. 2023: RMSNorm, rotary
positions, SwiGLU MLP, no biases); pipelib changes none of its code. Its `LlamaModel.forward`
runs the embedding, computes the rotary angles once and the causal mask, then calls every
decoder layer with them. A pipeline stage cannot call that forward: it holds only some of the
layers and receives one tensor, the hidden state (B, T, C). So `llama_layers` wraps the model's
own modules in three small adapters whose forward takes and returns one tensor:

- `LlamaEmbed`: token ids (B, T) -> hidden (B, T, C), `model.model.embed_tokens`;
- `LlamaDecoder`: one `LlamaDecoderLayer`, given the rotary angles of positions 0..T-1 (recomputed
  from the rotary module's buffers: it has no parameters, so every stage may hold it) and no
  mask, so SDPA applies its causal mask itself (`is_causal`), as the whole model does;
- `LlamaHead`: the final RMSNorm and `lm_head`: hidden -> logits (B, T, V).

The adapters share the model's parameters (nothing is copied), so the gradients come back under
Hugging Face's own names (`hf_names`), which the single-process reference (`llama_reference`)
uses too. The embedding and the head are untied (`tie_word_embeddings=False`, Llama's default
for its larger models), so no weight crosses stages.

Introduced in chapter 19.
"""
from __future__ import annotations

from types import MappingProxyType

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipelib.results import StepResult

#: pipelib's tensor-parallel styles on each decoder layer (Megatron-LM §3): q, k, v and the MLP's
#: gate and up projections split by output features (whole heads: `LlamaAttention` reads the
#: head count from q's width, `view(..., -1, head_dim)`), o and down split by input features.
LLAMA_TP_PLAN = MappingProxyType({
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
})


def llama_config(gpt=None, *, vocab_size: int | None = None, intermediate_size: int | None = None,
                 kv_heads: int | None = None):
    """A `transformers.LlamaConfig` of `gpt`'s sizes (a `pipelib.model.GPTConfig`, default the
    book's tiny GPT): hidden n_embd, n_layer decoder layers, n_head heads (as many key/value
    heads unless `kv_heads`: grouped-query attention, Ainslie et al. 2023), context block_size,
    MLP width 4 n_embd unless given, untied head, SDPA attention, no dropout."""
    from transformers import LlamaConfig

    from pipelib.model import GPTConfig

    gpt = gpt or GPTConfig()
    return LlamaConfig(vocab_size=vocab_size or gpt.vocab_size, hidden_size=gpt.n_embd,
                       intermediate_size=intermediate_size or 4 * gpt.n_embd, num_hidden_layers=gpt.n_layer,
                       num_attention_heads=gpt.n_head, num_key_value_heads=kv_heads or gpt.n_head,
                       max_position_embeddings=gpt.block_size, tie_word_embeddings=False,
                       attention_dropout=0.0, attn_implementation="sdpa")


def llama3_8b_config():
    """Llama 3 8B's published sizes (Meta's `config.json` for Meta-Llama-3-8B; Grattafiori et al.
    2024, table 3): V = 128,256, C = 4,096, 32 layers, 32 query heads and 8 key/value heads, MLP
    14,336 wide, untied head. For counting on the meta device, never for building here."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       tie_word_embeddings=False)


def build_llama(config, seed: int = 0) -> nn.Module:
    """`LlamaForCausalLM(config)` with weights drawn from `seed` (the caller's random state is
    left as it was): every rank builds the same model, as with pipelib's GPT."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).float().train()


class LlamaEmbed(nn.Module):
    """Stage 0's first layer: token ids (B, T) -> hidden (B, T, C)."""

    def __init__(self, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)  # (B, T, C)


class LlamaDecoder(nn.Module):
    """One `LlamaDecoderLayer` taking the hidden state alone: the rotary angles of positions
    0..T-1 are computed here from `rotary` (buffers only), the causal mask by SDPA."""

    def __init__(self, layer: nn.Module, rotary: nn.Module):
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)  # (1, T)
        angles = self.rotary(h, positions)  # (cos, sin), each (1, T, head_dim)
        return self.layer(h, attention_mask=None, position_embeddings=angles)  # (B, T, C)


class LlamaHead(nn.Module):
    """The last stage's last layer: final RMSNorm and the (untied) head, hidden -> logits (B, T, V)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))


def llama_layers(model) -> list[nn.Module]:
    """The model's modules in the order its forward runs them, each one tensor in, one out:
    [LlamaEmbed, LlamaDecoder x num_hidden_layers, LlamaHead], sharing the model's parameters."""
    inner = model.model
    return [LlamaEmbed(inner.embed_tokens), *(LlamaDecoder(layer, inner.rotary_emb) for layer in inner.layers),
            LlamaHead(inner.norm, model.lm_head)]


def hf_names(model) -> dict[int, str]:
    """id(parameter) -> its name in the Hugging Face model (`model.layers.0.mlp.up_proj.weight`)."""
    return {id(p): n for n, p in model.named_parameters()}


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T): the loss
    `LlamaForCausalLM` computes with `labels=` (it shifts the labels by one itself)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def llama_batch(config, batch: int, seq_len: int, step: int = 0, seed: int = 0):
    """Step `step`'s batch: random token windows x (B, T) and their next tokens y (B, T)
    (`pipelib.batches.global_batch`), the same on every rank."""
    from pipelib.batches import global_batch

    return global_batch(config, batch, step, seed, seq_len=seq_len)


def llama_reference(config, batch: int, seq_len: int, *, seed: int = 0, steps: int = 1,
                    lr: float = 0.1) -> StepResult:
    """One process, the whole batch: the first step's loss and gradients under Hugging Face's
    names, and with `steps` > 1 the parameters after that many steps of SGD with momentum 0.9
    and the loss of each step: what every parallel run in `pipelib.hf.parallel` must equal.

    SGD rather than Adam for the parameters' check: Adam divides each gradient by its own
    running size, so an element whose gradient is near zero moves by up to lr whatever its
    rounding, and two correct runs that sum in another order differ there by much more than
    the rounding; SGD's update is lr times the gradient, so its error stays lr times the
    gradient's."""
    model = build_llama(config, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    grads, losses = None, []
    for step in range(steps):
        x, y = llama_batch(config, batch, seq_len, step, seed)
        opt.zero_grad()
        loss = lm_loss(model(x).logits, y)
        loss.backward()
        losses.append(loss.item())
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            first = loss.detach()
        opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()} if steps > 1 else None
    return StepResult(first, grads, losses=tuple(losses) if steps > 1 else (), params=params)
