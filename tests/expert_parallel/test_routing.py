"""Routing golden tests: small hand-made router probabilities, k = 1 and 2, capacity reached under
both drop policies, dropless; exact slots, counts, dropped choices and Switch loss; bad input."""
import math

import pytest
import torch

from pipelib.expert_parallel.balance import bias_update, load_balancing_loss, load_imbalance
from pipelib.expert_parallel.policies import POLICIES, drop_policy_info
from pipelib.expert_parallel.routing import capacity_of, route

# 6 tokens, 3 experts: the router's probabilities (logits = their logs), no ties within a row
P = torch.tensor([[0.70, 0.20, 0.10],
                  [0.60, 0.30, 0.10],
                  [0.15, 0.80, 0.05],
                  [0.90, 0.06, 0.04],
                  [0.25, 0.15, 0.60],
                  [0.50, 0.40, 0.10]], dtype=torch.float64)
LOGITS = P.log()


def placed(r):
    """{(token, expert): slot} of the kept choices, read off the dispatch mask."""
    return {(int(s), int(e)): int(c) for s, e, c in r.dispatch_mask().nonzero().tolist()}


def test_softmax_of_the_logits_is_the_table():
    assert torch.allclose(route(LOGITS).probs.double(), P, atol=1e-6)


def test_k1_dropless_every_token_kept_in_position_order():
    r = route(LOGITS, k=1)
    assert r.experts[:, 0].tolist() == [0, 0, 1, 0, 2, 0]
    assert placed(r) == {(0, 0): 0, (1, 0): 1, (3, 0): 2, (5, 0): 3, (2, 1): 0, (4, 2): 0}
    assert r.counts.tolist() == [4, 1, 1] and r.dropped == 0 and r.capacity is None
    assert r.dispatch_mask().shape == (6, 3, 4)
    # k = 1: the gate is the probability itself
    assert torch.allclose(r.weights[:, 0].double(), P.max(1).values, atol=1e-6)


@pytest.mark.parametrize("policy, kept0, dropped0", [
    ("probability", {(0, 0): 0, (3, 0): 1}, [1, 5]),   # e0 keeps its two surest: t3 0.9, t0 0.7
    ("position", {(0, 0): 0, (1, 0): 1}, [3, 5]),      # e0 keeps its two first: t0, t1
])
def test_k1_capacity_reached(policy, kept0, dropped0):
    r = route(LOGITS, k=1, capacity_factor=1.0, drop_policy=policy)
    assert r.capacity == 2 == capacity_of(6, 3, 1, 1.0)
    assert placed(r) == {**kept0, (2, 1): 0, (4, 2): 0}
    assert r.counts.tolist() == [2, 1, 1] and r.demand.tolist() == [4, 1, 1] and r.dropped == 2
    assert r.slots[:, 0].tolist() == [placed(r).get((s, 0), -1) if s != 2 and s != 4 else 0 for s in range(6)]
    assert [s for s in range(6) if not r.kept[s, 0]] == dropped0
    assert (r.weights[dropped0] == 0).all() and (r.weights[~r.kept] == 0).all()


def test_k2_choices_and_normalised_gates():
    r = route(LOGITS, k=2)
    assert r.experts.tolist() == [[0, 1], [0, 1], [1, 0], [0, 1], [2, 0], [0, 1]]
    top = P.gather(1, r.experts)
    assert torch.allclose(r.weights.double(), top / top.sum(1, keepdim=True), atol=1e-6)
    assert r.counts.tolist() == [6, 5, 1] and r.dropped == 0


@pytest.mark.parametrize("policy, e0, e1", [
    # e0 is chosen by all 6 (C = 4): by probability t3 .9, t0 .7, t1 .6, t5 .5 stay; by position t0..t3
    ("probability", {0: 0, 1: 1, 3: 2, 5: 3}, {0: 0, 1: 1, 2: 2, 5: 3}),
    ("position", {0: 0, 1: 1, 2: 2, 3: 3}, {0: 0, 1: 1, 2: 2, 3: 3}),
])
def test_k2_capacity_reached(policy, e0, e1):
    r = route(LOGITS, k=2, capacity_factor=1.0, drop_policy=policy)
    assert r.capacity == 4
    want = {**{(s, 0): c for s, c in e0.items()}, **{(s, 1): c for s, c in e1.items()}, (4, 2): 0}
    assert placed(r) == want
    assert r.counts.tolist() == [4, 4, 1] and r.demand.tolist() == [6, 5, 1]
    assert r.dropped == 3 == 12 - 9
    assert r.dispatch_mask().sum() == 9 and r.dispatch_mask().sum(dim=(0, 2)).tolist() == [4, 4, 1]


def test_min_capacity_is_a_floor_and_a_large_factor_drops_nothing():
    assert route(LOGITS, k=1, capacity_factor=0.1, min_capacity=3).capacity == 3
    assert route(LOGITS, k=1, capacity_factor=0.1).capacity == 1
    assert route(LOGITS, k=1, capacity_factor=0.1).counts.tolist() == [1, 1, 1]
    r = route(LOGITS, k=2, capacity_factor=3.0)
    assert r.capacity == 12 and r.dropped == 0
    assert capacity_of(10, 1, 1, 1.1) == 11  # not 12 from 11.000000000000002


def test_order_lists_the_buffers_end_to_end():
    r = route(LOGITS, k=2, capacity_factor=1.0, drop_policy="probability")
    tokens, choice = r.order()
    assert tokens.tolist() == [0, 1, 3, 5, 0, 1, 2, 5, 4]
    assert r.experts[tokens, choice].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    assert r.slots[tokens, choice].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_switch_loss_golden_and_its_bounds():
    r = route(LOGITS, k=1)
    # f = (4, 1, 1) / 6, P = column means (3.1, 1.91, 0.99) / 6: 3 (4 x 3.1 + 1.91 + 0.99) / 36
    assert float(r.aux_loss) == pytest.approx(3 * (4 * 3.1 + 1.91 + 0.99) / 36, abs=1e-6)
    collapsed = route(torch.tensor([[30.0, 0, 0]] * 6), k=1)  # every token sure of expert 0: E
    assert float(collapsed.aux_loss) == pytest.approx(3.0, abs=1e-6)
    even = route(30 * torch.eye(3), k=1)  # one token sure of each expert: 1
    assert float(even.aux_loss) == pytest.approx(1.0, abs=1e-6)
    assert float(load_balancing_loss(torch.full((4, 4), 0.25), torch.tensor([1, 1, 1, 1]), 1)) == pytest.approx(1.0)
    logits = LOGITS.clone().float().requires_grad_()
    route(logits, k=2, capacity_factor=1.0).aux_loss.backward()
    assert logits.grad.abs().sum() > 0  # the loss reaches the router


def test_combine_weights_and_gradients_reach_the_logits():
    logits = LOGITS.clone().float().requires_grad_()
    r = route(logits, k=2, capacity_factor=1.0, drop_policy="position")
    cw = r.combine_weights()
    assert cw.shape == (6, 3, 4) and torch.allclose(cw.sum(dim=(1, 2)), r.weights.sum(1))
    r.weights.sum().backward()
    assert logits.grad is not None


def test_bias_changes_the_choice_not_the_gate():
    bias = torch.tensor([-1.0, 0.0, 0.0])
    r = route(LOGITS, k=1, bias=bias)
    assert r.experts[:, 0].tolist() == [1, 1, 1, 1, 2, 1]
    assert torch.allclose(r.weights[:, 0].double(), P[:, 1].where(r.experts[:, 0] == 1, P[:, 2]), atol=1e-6)


def test_bias_update_moves_against_the_load():
    b = bias_update(torch.zeros(3), torch.tensor([4, 1, 1]), 0.01)
    assert b.tolist() == pytest.approx([-0.01, 0.01, 0.01])
    assert bias_update(torch.zeros(2), torch.tensor([3, 3]), 0.5).tolist() == [0.0, 0.0]
    assert load_imbalance([4, 1, 1]) == pytest.approx(2.0) and load_imbalance([2, 2]) == 1.0
    with pytest.raises(ValueError, match=r"rate=0; pass"):
        bias_update(torch.zeros(2), torch.tensor([3, 3]), 0)


def test_policies_are_a_registry():
    assert set(POLICIES) == {"probability", "position"}
    with pytest.raises(ValueError, match=r"unknown drop policy 'latest'; use one of \('probability', 'position'\)"):
        route(LOGITS, k=1, capacity_factor=1.0, drop_policy="latest")
    assert drop_policy_info("position").priority(P)[:, 0].tolist() == [0, -1, -2, -3, -4, -5]


@pytest.mark.parametrize("kw, match", [
    (dict(k=4), r"top-k k=4 is more than the number of experts E=3; pass k <= 3"),
    (dict(k=0), r"k=0; pass an integer >= 1"),
    (dict(capacity_factor=0), r"capacity_factor=0; pass a number > 0"),
    (dict(capacity_factor=-1.5), r"capacity_factor=-1.5; pass a number > 0"),
    (dict(min_capacity=-1), r"min_capacity=-1; pass an integer >= 0"),
    (dict(bias=torch.zeros(4)), r"bias of shape \(4,\); pass one value per expert, shape \(3,\)"),
])
def test_bad_arguments_name_their_values(kw, match):
    with pytest.raises(ValueError, match=match):
        route(LOGITS, **kw)


@pytest.mark.parametrize("logits", [torch.zeros(2, 3, 4), torch.zeros(5), torch.zeros(4, 3, dtype=torch.long)])
def test_logits_of_the_wrong_shape(logits):
    with pytest.raises(ValueError, match=r"router logits of shape .*; pass a float tensor \(tokens, experts\)"):
        route(logits)


def test_capacity_formula_rounds_up():
    assert [capacity_of(8, 4, 1, f) for f in (1.0, 1.25, 2.0)] == [2, 3, 4]
    assert capacity_of(6, 3, 2, 1.0) == math.ceil(6 * 2 / 3)


@pytest.mark.parametrize("k, factor", [(1, 1.0), (2, 1.0), (2, 0.5), (1, 0.1), (2, 3.0)])
def test_dropped_at_counts_what_route_drops_under_either_policy(k, factor):
    from pipelib.expert_parallel.balance import dropped_at

    for policy in POLICIES:
        r = route(LOGITS, k=k, capacity_factor=factor, drop_policy=policy)
        assert dropped_at(r.demand, r.capacity) == r.dropped
