"""StepResult and the one check against the single process: it passes on equal results and
fails, naming what differs, on every kind of disagreement."""
import dataclasses

import pytest
import torch

from pipelib.results import StepResult, check_against_reference, gather

REF = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}


def _ranks(a=REF["a"], b=REF["b"], loss=torch.tensor(0.5)):  # noqa: B008 (never mutated)
    return [StepResult(None, {"a": a}), StepResult(loss, {"b": b}), None]


def test_equal_results_agree_and_say_what_was_checked():
    agreed = check_against_reference(_ranks(), torch.tensor(0.5), REF)
    assert agreed.num_tensors == 2 and agreed.max_abs_diff == 0.0
    assert set(agreed.grads) == {"a", "b"} and float(agreed.loss) == 0.5
    assert "2 gradients equal" in str(agreed)


def test_a_step_result_is_frozen_and_pickles():
    import pickle

    r = StepResult(torch.tensor(1.0), {"a": torch.zeros(2)}, {"peak": 3}, (0.1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.loss = None
    assert pickle.loads(pickle.dumps(r)).stats == {"peak": 3}


@pytest.mark.parametrize("results,match", [
    (_ranks(a=torch.tensor([1.0, 2.5])), r"gradient a"),
    (_ranks(loss=torch.tensor(0.6)), r"loss"),
    ([StepResult(None, {"a": REF["a"]}), StepResult(torch.tensor(0.5), {})], r"missing \['b'\]"),
    ([StepResult(None, {"a": REF["a"], "c": REF["b"]}), StepResult(torch.tensor(0.5), {"b": REF["b"]})],
     r"not in the reference \['c'\]"),
    ([StepResult(torch.tensor(0.5), REF), StepResult(torch.tensor(0.5), {})], r"one rank to return the loss, got 2"),
    ([StepResult(torch.tensor(0.5), REF), StepResult(None, {"a": REF["a"]})], r"a returned by rank 0 and rank 1"),
])
def test_every_disagreement_fails_naming_it(results, match):
    with pytest.raises(AssertionError, match=match):
        check_against_reference(results, torch.tensor(0.5), REF)


def test_shared_names_must_be_equal_on_every_rank():
    same = [StepResult(torch.tensor(0.5), REF), StepResult(None, {"a": REF["a"]})]
    assert check_against_reference(same, torch.tensor(0.5), REF, shared={"a"}).num_tensors == 2
    other = [StepResult(torch.tensor(0.5), REF), StepResult(None, {"a": REF["a"] + 1})]
    with pytest.raises(AssertionError, match=r"a differs between rank 0 and rank 1"):
        gather(other, shared=True)


def test_exact_demands_bitwise_and_params_are_checked():
    close = _ranks(a=REF["a"] + 1e-7)
    check_against_reference(close, torch.tensor(0.5), REF)
    with pytest.raises(AssertionError, match="bit for bit"):
        check_against_reference(close, torch.tensor(0.5), REF, exact=True)
    trained = [StepResult(None, {}, params={"w": torch.ones(2)}), StepResult(None, {}, params={"v": torch.zeros(1)})]
    agreed = check_against_reference(trained, ref_params={"w": torch.ones(2), "v": torch.zeros(1)})
    assert agreed.num_tensors == 2 and set(agreed.params) == {"w", "v"}
    with pytest.raises(AssertionError, match="parameter w"):
        check_against_reference(trained, ref_params={"w": torch.zeros(2), "v": torch.zeros(1)})


def test_no_result_at_all_is_an_error():
    with pytest.raises(ValueError, match="no rank returned a result"):
        check_against_reference([None, None], torch.tensor(0.5), REF)
