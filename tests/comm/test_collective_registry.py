"""Pure tests of the collective registry: one entry per collective, every field filled; the
alpha-beta functions are thin lookups into it; no collective name is compared or mapped
anywhere else in pipelib. (That each twin equals its collective runs on the cluster:
tests/comm/test_collectives.py.)"""
import ast
import inspect
from pathlib import Path

import pytest

from pipelib.comm import alphabeta, twins
from pipelib.comm.registry import NAMES, REGISTRY, CollectiveInfo, collective_info

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_FILE = ROOT / "pipelib" / "comm" / "registry.py"


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_has_every_field(name):
    info = REGISTRY[name]
    assert isinstance(info, CollectiveInfo) and info.name == name and collective_info(name) is info
    fn = info.implementation  # imports torch: fine in a test
    assert callable(fn) and fn.__name__ == name and fn.__module__ == f"pipelib.comm.{info.module}"
    params = inspect.signature(fn).parameters
    assert "label" in params and "check" in params and "group" in params
    assert info.root_arg is None or info.root_arg in params
    assert ("op" in params) == info.reduces
    assert callable(info.twin) and info.twin.__module__ == twins.__name__
    assert info.slots in ("whole", "chunks") and info.start in ("own", "diagonal", "root")
    for n in (1, 2, 3, 4, 8):
        try:
            sent = [info.expected_bytes((12, 3), 4, n, r, root=n - 1) for r in range(n)]
        except ValueError as e:  # halving/doubling: only on a power of two
            assert "power-of-two" in str(e) and n & (n - 1), (n, e)
            continue
        assert all(isinstance(b, int) and b >= 0 for b in sent)
        assert (sum(sent) == 0) == (n == 1)
        t = info.predicted_time(4096, n, 1e-6, 1e9)
        assert t == 0.0 if n == 1 else t > 0
        assert 0 < info.bus_factor(n) <= 2 or n == 1
        assert info.holds_result(n - 1, root=n - 1)


@pytest.mark.parametrize("name", NAMES)
def test_alphabeta_is_a_thin_lookup(name):
    info = REGISTRY[name]
    for n, rank in ((4, 1), (8, 5)):
        kw = {"ranks_per_node": 2}  # the hierarchical all-reduce's; the others ignore it
        assert alphabeta.expected_bytes(name, (10, 3), 2, n, rank, 1, **kw) == info.expected_bytes(
            (10, 3), 2, n, rank, 1, **kw)
        assert alphabeta.predicted_time(name, 1000, n, 2e-6, 3e9, 1e-10, **kw) == info.predicted_time(
            1000, n, 2e-6, 3e9, 1e-10, **kw)
        assert alphabeta.bus_bandwidth_factor(name, n) == info.bus_factor(n)
    assert alphabeta.NAMES is NAMES == tuple(REGISTRY)


def test_unknown_names_list_the_registry():
    for call in (lambda: collective_info("allreduce"), lambda: alphabeta.expected_bytes("allreduce", (4,), 4, 2, 0),
                 lambda: alphabeta.bus_bandwidth_factor("allreduce", 2)):
        with pytest.raises(ValueError, match=r"unknown collective 'allreduce'; use one of \('broadcast', 'reduce'"):
            call()


def name_tests(source: str, names) -> list[int]:
    """Lines where a name of `names` is compared (==, !=, in a tuple/list/set) or mapped (a dict
    key): the decisions that belong in a registry. Passing a name (a label, a lookup) is fine."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            for p in parts:
                elts = p.elts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) else [p]
                if any(isinstance(e, ast.Constant) and e.value in names for e in elts):
                    out.append(node.lineno)
        elif isinstance(node, ast.Dict):
            if any(isinstance(k, ast.Constant) and k.value in names for k in node.keys):
                out.append(node.lineno)
    return sorted(set(out))


def test_the_name_check_catches_comparisons_and_maps_but_not_lookups():
    source = ('def f(name):\n'
              '    if name == "broadcast":\n'
              '        return {"reduce": 1}\n'
              '    x = collective_info("all_reduce").run(t, label="all_gather")\n'
              '    return name in ("all_to_all", "barrier")\n')
    assert name_tests(source, set(NAMES)) == [2, 3, 5]


# Files another change owns, still comparing or mapping a collective's name: the DDP steps (whose
# step "all_reduce" shares a collective's name) get their own registry; chapter 09's colours per
# collective. Empty this set as each one goes.
PENDING = {"pipelib/viz/tensor_parallel.py"}


def test_no_collective_name_is_compared_outside_the_registry():
    hits = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "pipelib").rglob("*.py"))
            if p != REGISTRY_FILE and (lines := name_tests(p.read_text(), set(NAMES)))}
    found = [f"{path}:{line}" for path, lines in hits.items() if path not in PENDING for line in lines]
    assert not PENDING - set(hits), f"fixed, so take them off PENDING: {PENDING - set(hits)}"
    assert not found, ("collective names compared or mapped outside pipelib/comm/registry.py; use "
                       "`collective_info(name)` and a `CollectiveInfo` field instead: " + ", ".join(found))
