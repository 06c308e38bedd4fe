"""Corpus, tokenizer, Markov chain with a known floor, spirals: offline and deterministic."""
import math
import socket

import pytest
import torch

from pipelib.data import CharCorpus, CharTokenizer, MarkovChain, char_corpus, spirals, stdlib_text, zen_of_python


@pytest.fixture(scope="module")
def corpus():
    return char_corpus()


def test_corpus_is_built_without_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("char_corpus tried to open a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    c = char_corpus()
    assert len(c.text) > 100_000
    assert c.text.startswith("The Zen of Python") and "Beautiful is better than ugly." in c.text
    assert "def dedent(" in c.text  # textwrap.py, read from disk
    assert 60 < c.vocab_size < 200


def test_corpus_is_deterministic_and_split_contiguously(corpus):
    again = char_corpus()
    assert again.fingerprint == corpus.fingerprint
    assert torch.equal(again.train, corpus.train) and torch.equal(again.val, corpus.val)
    whole = torch.tensor(corpus.tokenizer.encode(corpus.text))
    assert torch.equal(torch.cat([corpus.train, corpus.val]), whole)
    assert abs(len(corpus.val) / len(whole) - 0.1) < 1e-3


def test_tokenizer_round_trips(corpus):
    tok = corpus.tokenizer
    piece = corpus.text[5000:7000]
    assert tok.decode(tok.encode(piece)) == piece
    assert tok.decode(corpus.val) == corpus.text[len(corpus.train):]
    assert tok.chars == sorted(tok.chars)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        CharTokenizer("abc").encode("abd")


def test_get_batch_shifts_targets_by_one(corpus):
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    x, y = corpus.get_batch("train", 4, 32, g1)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, y2 = corpus.get_batch("train", 4, 32, g2)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    xv, _ = corpus.get_batch("val", 4, 32, g1)
    assert corpus.tokenizer.decode(xv[0]) in corpus.text[len(corpus.train):]
    with pytest.raises(ValueError, match="split"):
        corpus.get_batch("test", 4, 32)


def test_custom_text_and_short_split_errors():
    c = CharCorpus("hello world " * 10, val_fraction=0.5)
    assert c.vocab_size == len(set("hello world "))
    with pytest.raises(ValueError, match="block_size"):
        c.get_batch("val", 2, 100)
    with pytest.raises(ValueError, match="no source file"):
        stdlib_text(("sys",))  # built into the interpreter
    assert zen_of_python().count("\n") > 15


def test_markov_chain_stationary_distribution_is_exact():
    chain = MarkovChain(vocab_size=5, order=2, seed=1)
    P, pi = chain.transition, chain.stationary
    assert torch.allclose(P.sum(-1), torch.ones(25, dtype=torch.float64))
    nxt = (torch.arange(25)[:, None] * 5 + torch.arange(5)) % 25
    flow = (pi[:, None] * P).flatten()  # probability mass moving along each edge
    pushed = torch.zeros(25, dtype=torch.float64).index_add_(0, nxt.flatten(), flow)
    assert torch.allclose(pushed, pi, atol=1e-12)


def test_uniform_chain_floor_is_log_v():
    chain = MarkovChain(vocab_size=6, order=2, sharpness=0.0)
    assert math.isclose(chain.entropy_rate, math.log(6), rel_tol=1e-12)
    assert math.isclose(chain.loss_floor(16), math.log(6), rel_tol=1e-12)


def test_entropy_rate_matches_monte_carlo():
    """-log p(next | state) averaged over sampled sequences converges to the entropy rate."""
    chain = MarkovChain(vocab_size=4, order=2, seed=0)
    seq = chain.sample(512, 64, torch.Generator().manual_seed(0))
    state = seq[:, 0:-2] * 4 + seq[:, 1:-1]
    nll = -chain.transition[state, seq[:, 2:]].log()
    assert abs(nll.mean().item() - chain.entropy_rate) < 0.03 * chain.entropy_rate
    freq = torch.bincount(state[:, -1], minlength=16).double() / 512
    assert (freq - chain.stationary).abs().sum() < 0.2  # start stays stationary


def test_loss_floor_counts_the_short_contexts():
    chain = MarkovChain(vocab_size=4, order=2, seed=0)
    h, first = chain.entropy_rate, chain.loss_floor(1)  # H(x1 | x0) > H(x2 | x1, x0)
    assert h < first < math.log(4)
    assert math.isclose(chain.loss_floor(16), (first + 15 * h) / 16, rel_tol=1e-12)
    first_order = MarkovChain(4, order=1)
    assert math.isclose(first_order.loss_floor(16), first_order.entropy_rate)


def test_markov_batches_are_deterministic():
    chain, same = MarkovChain(seed=3), MarkovChain(seed=3)
    assert torch.equal(chain.transition, same.transition)
    assert not torch.equal(chain.transition, MarkovChain(seed=4).transition)
    x, y = chain.get_batch("train", 4, 10, torch.Generator().manual_seed(0))
    x2, y2 = same.get_batch("train", 4, 10, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(x[:, 1:], y[:, :-1])
    assert x.shape == (4, 10) and x.is_contiguous() and int(x.max()) < 8


def test_spirals_are_seeded_and_balanced():
    x, y = spirals(301, num_classes=3, seed=0)
    assert x.shape == (301, 2) and x.dtype == torch.float32 and y.dtype == torch.long
    assert torch.bincount(y).tolist() == [101, 100, 100]
    x2, y2 = spirals(301, num_classes=3, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, spirals(301, num_classes=3, seed=1)[0])
