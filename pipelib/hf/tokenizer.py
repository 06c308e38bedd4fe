"""A byte-level BPE tokenizer trained on the book's corpus, beside the character tokenizer.

    rows = compare_tokenizers()              # characters, then BPE at 256 + a few merges ...
    [(r.name, r.vocab_size, r.chars_per_token, r.embedding_share) for r in rows]

The book's GPT reads one character per token (`pipelib.data.CharTokenizer`, 65 or so symbols).
Production models read subwords: byte-pair encoding (Sennrich et al. 2016; byte-level as in
GPT-2, Radford et al. 2019) starts from the 256 bytes and merges the most frequent adjacent
pair again and again until the vocabulary has `vocab_size` entries. `train_bpe` trains one with
Hugging Face's `tokenizers` on the training part of the corpus, here, in seconds, nothing
downloaded; `compare_tokenizers` measures on the held-out part what that changes:

- sequence length: a text of N characters becomes N / (characters per token) tokens, so the
  same context of T tokens covers that many times more text (and attention's T^2 costs less
  for the same text);
- the embedding's share of the parameters: the token embedding and the (untied) head hold
  V C parameters each, so with the tiny model's C = 64 and a few blocks, a vocabulary of a few
  thousand tokens outweighs the whole network. Counted on the Llama of `pipelib.hf.llama`, built
  on the meta device (shapes, no memory).

Introduced in chapter 19.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenizerRow:
    """One tokenizer measured on the held-out text, and the Llama whose vocabulary it sets."""

    name: str
    vocab_size: int
    tokens: int               # tokens of the held-out text
    chars: int                # its characters
    embedding_params: int     # token embedding + head: 2 V C
    total_params: int

    @property
    def chars_per_token(self) -> float:
        return self.chars / self.tokens

    @property
    def embedding_share(self) -> float:
        return self.embedding_params / self.total_params


def train_bpe(text: str, vocab_size: int = 1024, min_frequency: int = 2):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `text`: the 256 byte symbols plus up to
    `vocab_size` - 256 merges of pairs seen at least `min_frequency` times. Any text encodes
    (every byte is in the alphabet) and decodes back unchanged."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipelib.checks import check_int

    check_int(vocab_size, "vocab_size", minimum=257, context="train_bpe",
              hint="the 256 bytes plus at least one merge")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def embedding_numel(config) -> tuple[int, int]:
    """(token embedding + head elements, all parameter elements) of `LlamaForCausalLM(config)`,
    built on the meta device: shapes only, no memory, so an 8B model counts in seconds."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    emb = model.model.embed_tokens.weight.numel()
    if model.lm_head.weight is not model.model.embed_tokens.weight:  # a tied head is the same matrix
        emb += model.lm_head.weight.numel()
    return emb, sum(p.numel() for p in model.parameters())


def _llama_numel(gpt, vocab_size: int) -> tuple[int, int]:
    from pipelib.hf.llama import llama_config

    return embedding_numel(llama_config(gpt, vocab_size=vocab_size))


def compare_tokenizers(text: str | None = None, vocab_sizes=(512, 4096), gpt=None,
                       val_fraction: float = 0.1) -> list[TokenizerRow]:
    """The character tokenizer and a BPE of each of `vocab_sizes`, all built on the first
    1 - `val_fraction` of `text` (default `pipelib.data.stdlib_text()`) and measured on the
    rest; each with the Llama of `gpt`'s sizes (default the tiny GPT's) and that vocabulary.
    A BPE that does not decode its own encoding back to the text raises."""
    from pipelib.data import CharTokenizer, stdlib_text
    from pipelib.model import GPTConfig

    text = stdlib_text() if text is None else text
    gpt = gpt or GPTConfig()
    cut = int(len(text) * (1 - val_fraction))
    train, held = text[:cut], text[cut:]
    chars = CharTokenizer(text)  # the book's: every character of the corpus is a symbol
    rows = [TokenizerRow("characters", chars.vocab_size, len(chars.encode(held)), len(held),
                         *_llama_numel(gpt, chars.vocab_size))]
    for v in vocab_sizes:
        tok = train_bpe(train, v)
        ids = tok.encode(held).ids
        if tok.decode(ids) != held:
            raise AssertionError(f"BPE of {v} tokens does not decode the held-out text back unchanged")
        size = tok.get_vocab_size()
        rows.append(TokenizerRow(f"BPE {v}", size, len(ids), len(held), *_llama_numel(gpt, size)))
    return rows
