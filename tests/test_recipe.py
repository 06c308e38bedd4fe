"""The one batch maker (`pipelib.batches`) and the recipe's two references (`Recipe.reference`,
`Recipe.first_step`): pure functions of (seed, step), the same rows however they are cut, and
references that agree with each other and with a loop written out here."""
import pickle

import pytest
import torch

from pipelib.batches import DATA, global_batch
from pipelib.model import GPT, MLP, GPTConfig, MLPConfig
from pipelib.recipe import Recipe

GPT_CFG = GPTConfig(vocab_size=101, block_size=12, n_layer=1, n_head=2, n_embd=8)
MLP_CFG = MLPConfig(in_features=5, hidden=7, out_features=3, num_layers=2)


@pytest.mark.parametrize("data", list(DATA))
def test_a_batch_is_a_pure_function_of_seed_and_step(data):
    a = global_batch(GPT_CFG, 4, step=3, seed=2, seq_len=10, data=data)
    b = global_batch(GPT_CFG, 4, step=3, seed=2, seq_len=10, data=data)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert a[0].shape == a[1].shape == (4, 10) and a[0].dtype == torch.long
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])           # targets are the next tokens
    other_step = global_batch(GPT_CFG, 4, step=4, seed=2, seq_len=10, data=data)
    other_seed = global_batch(GPT_CFG, 4, step=3, seed=3, seq_len=10, data=data)
    assert not torch.equal(a[0], other_step[0]) and not torch.equal(a[0], other_seed[0])


def test_counting_rows_count_and_the_corpus_checks_the_vocabulary():
    x, y = global_batch(GPT_CFG, 3, seq_len=9, data="counting")
    stride = (x[:, 1] - x[:, 0]) % GPT_CFG.vocab_size
    assert torch.equal((x[:, :1] + stride[:, None] * torch.arange(10)) % GPT_CFG.vocab_size,
                       torch.cat([x, y[:, -1:]], dim=1))
    with pytest.raises(ValueError, match=r"data='corpus' has \d+ symbols but the model's vocab_size is 17"):
        global_batch(GPTConfig(vocab_size=17), 2, data="corpus")
    with pytest.raises(ValueError, match=r"data='words'; use one of \['random', 'counting', 'corpus'\]"):
        Recipe(GPT_CFG, data="words")


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_data_parallel_ranks_hold_disjoint_slices_of_the_same_rows(dp):
    recipe = Recipe(GPT_CFG, batch_size=8, seq_len=6)
    whole = recipe.global_batch(2)
    parts = [recipe.batch(2, r, dp) for r in range(dp)]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
    assert all(p[0].untyped_storage().nbytes() == p[0].nbytes for p in parts)   # copies, not views
    with pytest.raises(ValueError, match="batch_size=8 does not split over dp=3 ranks"):
        recipe.batch(0, 0, 3)


@pytest.mark.parametrize("config", [GPT_CFG, MLP_CFG], ids=["gpt", "mlp"])
def test_the_two_references_agree_with_a_loop_written_out(config):
    recipe = Recipe(config, batch_size=6, steps=2, optimizer="sgd", lr=0.1, dtype=torch.float64, seq_len=None)
    model = (GPT if config is GPT_CFG else MLP)(config, seed=0).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(2):
        x, y = recipe.global_batch(step)
        loss = model(x, y)[1] if config is GPT_CFG else torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            first = {k: p.grad.clone() for k, p in model.named_parameters()}
        last = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    ref, one = recipe.reference(), recipe.first_step()
    assert ref.losses == tuple(losses) and float(one.loss) == losses[0]
    assert all(torch.equal(ref.grads[k], last[k]) and torch.equal(one.grads[k], first[k]) for k in last)
    assert all(torch.equal(ref.params[k], p) for k, p in model.named_parameters())


def test_first_step_keeps_the_logits_when_asked():
    recipe = Recipe(GPT_CFG, batch_size=2)
    logits = recipe.first_step(keep_logits=True).stats["logits"]
    assert logits.shape == (2, GPT_CFG.block_size, GPT_CFG.vocab_size)
    assert recipe.first_step().stats == {}


def test_mixed_precision_reference_keeps_fp32_master_weights():
    recipe = Recipe(MLP_CFG, batch_size=4, steps=2, lr=1e-2, mixed_precision=True)
    ref = recipe.reference()
    assert {p.dtype for p in ref.params.values()} == {torch.float32}       # the masters
    assert {g.dtype for g in ref.grads.values()} == {torch.float32}
    assert recipe.global_batch(0)[0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="mixed precision keeps fp32 master weights for torch's Adam"):
        Recipe(MLP_CFG, optimizer="sgd", mixed_precision=True)


def test_a_recipe_travels_without_its_loaded_corpus():
    recipe = Recipe(GPTConfig(vocab_size=128, block_size=8), batch_size=2, data="corpus")
    small = len(pickle.dumps(recipe))
    recipe.global_batch(0)                                                  # loads the corpus once
    assert len(pickle.dumps(recipe)) == small < 4096
    again = pickle.loads(pickle.dumps(recipe))
    assert all(torch.equal(a, b) for a, b in zip(again.global_batch(1), recipe.global_batch(1)))
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert recipe.replace(steps=7).steps == 7 and recipe.steps == 3
