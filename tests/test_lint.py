"""The linter is clean: `ruff check` with pyproject.toml's rules finds nothing in pipelib, tests
and bench (the review's "a linter configured and clean", kept so)."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]'")
    run = subprocess.run([ruff, "check", "pipelib", "tests", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
