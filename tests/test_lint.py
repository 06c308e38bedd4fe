"""The linter is clean: `ruff check` with pyproject.toml's rules finds nothing in pipelib, tests
and bench (the review's "a linter configured and clean", kept so), nor in the chapters' code cells
(ruff reads .ipynb; long lines are allowed there, pyproject.toml's per-file-ignores)."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff_check(*paths: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]'")
    return subprocess.run([ruff, "check", *paths], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    run = _ruff_check("pipelib", "tests", "bench")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_ruff_finds_nothing_in_the_notebooks():
    """Unused imports, shadowed names, loop variables left unused: the chapters' code cells too."""
    run = _ruff_check("notebooks")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    checked = {pathlib.Path(line).name for line in _ruff_check("--show-files", "notebooks").stdout.splitlines()}
    chapters = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert chapters and chapters <= checked, sorted(chapters - checked)  # no chapter left out of the check
