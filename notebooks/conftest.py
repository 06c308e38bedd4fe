"""nbval runs every chapter once; keep what it computed, so the book need not run it again.

When every cell of a notebook has passed, the notebook with nbval's outputs in place of its
(empty) stored ones is written to `_build/executed/notebooks/<name>.ipynb` and recorded in
`config.pipelib_executed`. `tests/test_book.py` then builds the book from those copies instead
of executing each chapter a second time (a page whose outputs hold a widget is still executed by
the build, which is what saves the widget's state).
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "_build" / "executed"


def _state(config) -> dict:
    if not hasattr(config, "pipelib_executed"):
        config.pipelib_executed = {}      # source notebook path -> executed copy
        config.pipelib_failed = set()
    return config.pipelib_executed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    nbfile = getattr(item, "parent", None)
    if call.when != "call" or not hasattr(item, "test_outputs") or not hasattr(nbfile, "nb"):
        return
    _state(item.config)
    source = Path(str(nbfile.fspath)).resolve()
    if not outcome.get_result().passed or item.test_outputs is None:
        item.config.pipelib_failed.add(source)
        return
    count = getattr(nbfile, "_pipelib_count", 0) + 1
    nbfile._pipelib_count = count
    item.cell.outputs = item.test_outputs
    item.cell.execution_count = count
    for out in item.cell.outputs:
        if out.get("output_type") == "execute_result":
            out["execution_count"] = count


def pytest_runtest_teardown(item, nextitem):
    nbfile = getattr(item, "parent", None)
    if not hasattr(nbfile, "nb") or (nextitem is not None and nextitem.parent is nbfile):
        return
    executed = _state(item.config)
    source = Path(str(nbfile.fspath)).resolve()
    if source in item.config.pipelib_failed:
        return
    target = EXECUTED / source.relative_to(ROOT)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbfile.nb, str(target))
    executed[source] = target
