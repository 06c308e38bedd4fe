"""pipelib.comm.alphabeta, pure: exact bytes, predicted times, the fit, one tuple of names (that it
imports no torch is checked with the rest of the pure layer in tests/test_layering.py)."""
import ast
import pathlib

import pytest

from pipelib.comm import alphabeta
from pipelib.comm.alphabeta import (
    NAMES,
    chunk_sizes,
    compare,
    expected_bytes,
    fit_alpha_beta,
    predict_collectives,
    predicted_time,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _name_tuples(path: pathlib.Path) -> list[int]:
    """Lines of tuple/list literals that spell out the collectives' names (three or more of them)."""
    names = set(NAMES)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if len(strings & names) >= 5:
                out.append(node.lineno)
    return out


def test_one_tuple_of_collective_names():
    """The names are the registry's entries, spelled out nowhere else (not even as a tuple)."""
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "pipelib").rglob("*.py"))
             if (lines := _name_tuples(p))}
    assert found == {}, found
    from pipelib.comm import agreement, collectives, lab, registry

    assert registry.NAMES is NAMES == tuple(registry.REGISTRY)
    assert agreement.NAMES is NAMES and collectives.OPS is alphabeta.OPS is agreement.OPS
    assert lab.check_name is alphabeta.check_name
    assert all(callable(registry.REGISTRY[name].implementation) for name in NAMES)
    assert list(predict_collectives(1024, 4, 1e-6, 1e9)) == list(NAMES)
    with pytest.raises(ValueError, match=r"unknown collective 'allreduce'; use one of \('broadcast'"):
        lab.measure_collective("allreduce", [64])
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        predicted_time("allreduce", 64, 2, 1e-6, 1e9)


def test_bytes_formulas_closed_forms():
    n, N = 4, 4 * 2**20
    assert expected_bytes("all_reduce", (2**20,), 4, n, 0) == 2 * (n - 1) * N // n
    assert expected_bytes("all_reduce_naive", (2**20,), 4, n, 2) == (n - 1) * N
    assert expected_bytes("reduce_scatter", (2**20,), 4, n, 3) == (n - 1) * N // n
    assert expected_bytes("broadcast", (2**20,), 4, 8, 0) == 3 * N  # root of a tree of 8
    assert sum(expected_bytes("broadcast", (10,), 4, 5, r) for r in range(5)) == 4 * 40
    assert chunk_sizes(7, 3) == [3, 2, 2] == [len(t) for t in __import__("torch").arange(7).tensor_split(3)]


def test_relative_fit_is_exact_on_a_line_and_keeps_alpha_when_a_big_size_is_off():
    sizes = [4**k for k in range(13)]
    alpha, beta = 50e-6, 2e9
    times = [alpha + s / beta for s in sizes]
    for rel in (False, True):
        a, b = fit_alpha_beta(sizes, times, relative=rel)
        assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    assert alphabeta.message_times(sizes[:2], alpha, beta) == times[:2]
    noisy = list(times)
    noisy[11] *= 0.95  # 5% off at 4 MiB moves the plain intercept by 13%, the relative one by 0.1%
    assert abs(fit_alpha_beta(sizes, noisy)[0] / alpha - 1) > 0.1
    assert fit_alpha_beta(sizes, noisy, relative=True)[0] == pytest.approx(alpha, rel=0.01)


def test_compare_is_measured_over_predicted():
    rows = [{"bytes": 1000, "time": 3.0}, {"bytes": 2000, "time": 2.5}]
    out = compare("all_reduce", rows, 2, alpha=0.5, beta=1000.0)
    # ring all-reduce on 2 ranks: 2 alpha + N / beta
    assert [o["predicted"] for o in out] == [2.0, 3.0]
    assert [round(o["error"], 12) for o in out] == [0.5, round(2.5 / 3 - 1, 12)]


def test_bus_bandwidth_factors_are_nccl_tests():
    assert alphabeta.bus_bandwidth_factor("all_reduce", 4) == 1.5
    factor = alphabeta.bus_bandwidth_factor
    assert factor("all_gather", 8) == factor("reduce_scatter", 8) == 7 / 8
    assert alphabeta.bus_bandwidth_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError, match="unknown collective"):
        alphabeta.bus_bandwidth_factor("allreduce", 4)


def test_ring_latency_takes_over_beyond_n_over_alpha_beta_where_a_tree_wins():
    alpha, beta, nbytes = 5e-6, 50e9, 2**27
    n_star = alphabeta.ring_latency_bound_ranks(nbytes, alpha, beta)
    assert n_star == nbytes / (alpha * beta)
    below, above = int(n_star), int(n_star) + 1        # latency term vs bandwidth term of the ring
    assert 2 * (below - 1) * alpha <= 2 * (below - 1) / below * nbytes / beta
    assert 2 * (above - 1) * alpha > 2 * (above - 1) / above * nbytes / beta
    ring = lambda n: predicted_time("all_reduce", nbytes, n, alpha, beta)  # noqa: E731
    tree = lambda n: alphabeta.tree_all_reduce_time(nbytes, n, alpha, beta)  # noqa: E731
    assert tree(4096) == 2 * 12 * alpha + 2 * nbytes / beta
    assert ring(8) < tree(8) and tree(4096) < ring(4096)
