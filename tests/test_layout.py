"""The package's shape (issue: pipelib's layout): small files, one definition per public name,
one positive-integer check, and subpackages that say what they hold (three of them re-export names)."""
import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "pipelib").rglob("*.py"))
MAX_LINES = 300


def test_no_file_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in FILES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these (one concept per file, about {MAX_LINES} lines at most): {long}"


def test_every_top_level_name_is_defined_once():
    where: dict[str, list[str]] = {}
    for p in FILES:
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                where.setdefault(node.name, []).append(str(p.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, f"names defined in more than one module: {twice}"


def test_one_positive_integer_check():
    pattern = re.compile(r"isinstance\(\w+, bool\) or not isinstance\(\w+, int\)")
    copies = [f"{p.relative_to(ROOT)}:{i}" for p in FILES if p.name != "checks.py"
              for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not copies, f"use pipelib.checks.check_int / is_int_at_least instead: {copies}"


def test_no_module_re_exports_with_noqa():
    """A module imports what it uses; only a subpackage's __init__ lists a public API."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in FILES if p.name != "__init__.py"
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if "re-export" in line and line.lstrip().startswith("from ")]
    assert not hits, hits


PACKAGES = sorted({p.parent for p in FILES if p.name == "__init__.py" and p.parent != ROOT / "pipelib"})


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_subpackage_says_what_lives_there_and_which_chapters(package):
    text = (package / "__init__.py").read_text()
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert len(doc.splitlines()) >= 3 and re.search(r"[Cc]hapters? \d", doc), (
        f"{package.relative_to(ROOT)}/__init__.py: say what lives here and which chapters use it")
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"} | {
        p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    unnamed = [m for m in modules if m not in doc]
    assert not unnamed, f"{package.relative_to(ROOT)}: the docstring does not name {unnamed}"


FACES = {"pipelib", "pipelib.viz", "pipelib.pipeline.schedules"}


def test_only_three_packages_have_a_face():
    """Names are imported from the module that defines them. Three packages re-export: the root
    (`pipelib.Cluster`, lazily), `pipelib.viz` (every figure function, lazily: the bundle test
    walks them) and `pipelib.pipeline.schedules` (the schedules' names its callers import)."""
    faces = set()
    for init in sorted((ROOT / "pipelib").rglob("__init__.py")):
        body = ast.parse(init.read_text()).body
        if any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body):
            faces.add(".".join(init.parent.relative_to(ROOT).parts))
    assert faces == FACES, f"a package's __init__ holds its docstring only, except {FACES}: {faces}"
