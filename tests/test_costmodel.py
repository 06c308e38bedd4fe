import pytest

from pipelib.costmodel import PROFILES, Link, matmul_flops


def test_roofline_picks_the_binding_limit():
    h = PROFILES["h100"]
    assert h.ridge_point == pytest.approx(989e12 / 3.35e12)
    # a big matmul is compute bound, an elementwise op memory bound
    n = 8192
    assert h.compute_time(matmul_flops(n, n, n), 3 * n * n * 2) == pytest.approx(2 * n**3 / 989e12)
    assert h.compute_time(n * n, 3 * n * n * 2) == pytest.approx(6 * n * n / 3.35e12)
    with pytest.raises(ValueError, match="flops=-1"):
        h.compute_time(-1)


def test_alpha_beta():
    link = Link("x", alpha=1e-5, beta=1e9)
    assert link.time(0) == 1e-5 and link.time(10**9) == pytest.approx(1 + 1e-5)


def test_toy_gpu_ratios_are_stated_not_a_real_gpus():
    """The docstring's numbers: toy-gpu keeps the laws' shape, not an H100's ratios."""
    from dataclasses import replace

    from pipelib.costmodel import LINKS

    toy, h100 = PROFILES["toy-gpu"], PROFILES["h100"]
    assert (toy.ridge_point, toy.flops_per_link_byte) == (1.0, 10.0)
    assert round(h100.ridge_point) == 295
    assert round(h100.flops_per_link_byte, -2) == 2200
    assert round(replace(h100, link=LINKS["pcie5"]).flops_per_link_byte, -2) == 19800


def test_nodes_give_each_pair_of_ranks_its_link():
    """A profile with nodes (chapter 15): ranks r // gpus_per_node share a node and its fast link;
    a pair on two nodes talks on the slow one. Without nodes every pair is on `link`, as before."""
    toy = PROFILES["toy-gpu"]
    slow = Link("slow", alpha=2e-4, beta=1e8)
    nodes = toy.with_nodes(4, slow)
    assert nodes.link_between(0, 3) is toy.link and nodes.link_between(3, 4) is slow
    assert nodes.link_between(5, 7) is toy.link and nodes.link_between(7, 0) is slow
    assert nodes.message_time(1000, 1, 6) == slow.time(1000) > 3 * nodes.message_time(1000, 1, 2)
    assert nodes.message_time(1000) == toy.message_time(1000) == toy.message_time(1000, 1, 6) == toy.link.time(1000)
    for bad in ({"gpus_per_node": 4}, {"inter_node": slow}, {"gpus_per_node": 0, "inter_node": slow},
                {"gpus_per_node": 4, "inter_node": 1e9}):
        with pytest.raises(ValueError, match="gpus_per_node="):
            from dataclasses import replace

            replace(toy, **bad)
