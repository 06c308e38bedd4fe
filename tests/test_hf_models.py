"""A Hugging Face `transformers` Llama under pipelib (chapter 19, issue 25 item 5).

Built from a config of the tiny GPT's size, nothing downloaded: its layers as pipeline stages
equal the model's own forward; pipelined (1F1B and interleaved 1F1B), ZeRO-sharded (stages 1-3,
two SGD steps) and tensor parallel on two spawned gloo ranks, each equal to one process; a BPE
tokenizer trained on the book's corpus beside the character tokenizer.
"""
import pytest
import torch

from pipelib.hf.llama import (LLAMA_TP_PLAN, build_llama, llama_batch, llama_config, llama_layers, llama_reference,
                              lm_loss)


def test_the_layers_in_order_are_the_model():
    config = llama_config()
    model = build_llama(config, seed=3)
    x, y = llama_batch(config, 4, 16, seed=1)
    h = x
    for layer in llama_layers(model):
        h = layer(h)
    torch.testing.assert_close(h, model(x).logits, rtol=0, atol=0)
    # the loss is the model's own labels= loss on the window one token longer (it shifts by one)
    window = torch.cat([x, y[:, -1:]], dim=1)
    hf = model(window, labels=window).loss
    torch.testing.assert_close(lm_loss(model(x).logits, y), hf, rtol=1e-6, atol=1e-6)
    # the adapters share the model's parameters: nothing copied, every one of them reached
    ids = {id(p) for layer in llama_layers(model) for p in layer.parameters()}
    assert ids == {id(p) for p in model.parameters()}


def test_config_has_the_tiny_gpts_sizes_and_the_plan_fits_it():
    from pipelib.model import GPTConfig
    from pipelib.tensor_parallel.plan import validate_plan

    gpt = GPTConfig()
    c = llama_config(gpt)
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size) == (
        gpt.n_embd, gpt.n_layer, gpt.n_head, gpt.vocab_size)
    matched = validate_plan(build_llama(c), dict(LLAMA_TP_PLAN), 2)
    assert sum(len(v) for v in matched.values()) == 7 * gpt.n_layer
    with pytest.raises(ValueError, match="divisible"):
        validate_plan(build_llama(c), dict(LLAMA_TP_PLAN), 3)  # 64 channels over 3 ranks


def test_same_seed_same_model_and_reference_is_deterministic():
    config = llama_config()
    a, b = llama_reference(config, 4, 8, seed=5), llama_reference(config, 4, 8, seed=5)
    assert torch.equal(a.loss, b.loss) and all(torch.equal(a.grads[k], b.grads[k]) for k in a.grads)
    c = llama_reference(config, 4, 8, seed=6)
    assert not torch.equal(a.loss, c.loss)


def test_pipelined_zero_and_tensor_parallel_equal_one_process():
    from pipelib.hf.spawned import hf_checks

    res = hf_checks(world_size=2, timeout=400)  # raises, naming the tensor, if any run differs
    assert set(res.pipeline) == {"1f1b", "interleaved_1f1b"} and set(res.zero) == {1, 2, 3}
    for a in [*res.pipeline.values(), *res.zero.values(), res.tp]:
        assert len(a.grads) == 3 + 9 * 2  # embedding, norm, head; 9 tensors per decoder layer
        assert a.max_abs_diff < 1e-5
    for a in res.zero.values():
        assert len(a.params) == len(a.grads) and a.num_losses == 2
    # ZeRO-1 and up: rank 0 keeps the momentum of its half of every unit (units pad to even sizes)
    for share in res.optimizer_state_share.values():
        assert share == pytest.approx(0.5, abs=1e-3)
    # TP: the decoder layers' projections are halved; the embedding, head and norms are whole
    config = llama_config()
    C, F, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    split = L * (4 * C * C + 3 * C * F)
    assert res.tp_local_share == pytest.approx((res.num_params - split / 2) / res.num_params)


def test_tensor_parallel_with_grouped_query_attention():
    """4 query heads sharing 2 key/value heads: k and v split by whole key/value heads, each rank
    keeps the 2 query heads that read its one; equal to one process."""
    from pipelib.hf.parallel import hf_tp_step
    from pipelib.hf.spawned import run_spawned
    from pipelib.results import check_against_reference

    config = llama_config(kv_heads=2)
    assert config.num_key_value_heads == 2 and build_llama(config).model.layers[0].self_attn.k_proj.out_features == 32
    res = run_spawned(hf_tp_step, 2, (config, 4, 8), timeout=300)
    check_against_reference(res, llama_reference(config, 4, 8), shared=True, rtol=1e-5, atol=1e-6)
    assert res[0].stats["local_numel"] < res[0].stats["numel"]


def test_bpe_shortens_sequences_and_grows_the_embedding():
    from pipelib.data import stdlib_text
    from pipelib.hf.tokenizer import compare_tokenizers, train_bpe

    text = stdlib_text()
    rows = compare_tokenizers(text, vocab_sizes=(512, 2048))
    chars, small, large = rows
    assert chars.chars_per_token == 1.0 and chars.vocab_size == len(set(text))
    assert 1.0 < small.chars_per_token < large.chars_per_token  # more merges, fewer tokens
    assert small.vocab_size == 512 and large.vocab_size == 2048
    C = llama_config().hidden_size
    for r in rows:
        assert r.embedding_params == 2 * r.vocab_size * C  # embedding and untied head
    assert chars.embedding_share < small.embedding_share < large.embedding_share
    tok = train_bpe(text[:20000], 300)
    sample = "def f(x):\n    return x ** 2  # ünïcödé"  # bytes never seen still encode
    assert tok.decode(tok.encode(sample).ids) == sample
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(text, 100)


def test_llama3_8b_counts_its_published_size_on_the_meta_device():
    from pipelib.hf.llama import llama3_8b_config
    from pipelib.hf.tokenizer import embedding_numel

    emb, total = embedding_numel(llama3_8b_config())
    assert emb == 2 * 128_256 * 4096
    assert round(total / 1e9, 2) == 8.03  # Meta's model card: 8.03B parameters
