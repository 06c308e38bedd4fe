"""No exercise shows its answer in the reader's cell (issue 21; chapter 07's pattern).

An exercise is a notebook section whose heading says "Exercise". Its solution lives in a code
cell tagged `hide-input` that starts with "# Solution (hidden in the book)"; CI runs it, the book
hides it, and it fills in only what the reader left empty (`if answer is None:`). What the
reader sees binds each such answer only to a placeholder: None, `...`, or a function that still
holds a `...` or returns None. The check cell after it grades whatever the answer holds, so a
wrong answer fails it.
"""
import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SOLUTION = "# Solution (hidden in the book)"


def _heading(src: str) -> str | None:
    """The first heading line of a markdown cell, or its opening "**Exercise.**" paragraph."""
    for line in src.splitlines():
        if line.startswith("#") or line.startswith("**Exercise"):
            return line
    return None


def _sections(nb):
    """[(heading, [cells])] of the notebook's exercise sections: from a heading (or a bold
    "**Exercise.**" paragraph) that says "Exercise" to the next heading."""
    out, current = [], None
    for cell in nb["cells"]:
        head = _heading("".join(cell["source"])) if cell["cell_type"] == "markdown" else None
        if head is not None:
            current = (head, []) if "xercise" in head else None
            if current:
                out.append(current)
        elif current is not None:
            current[1].append(cell)
    return out


def _answers(tree) -> set[str]:
    """The names a solution cell fills in: those its `if ... is None:` guards test."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(isinstance(op, ast.Is) for c in ast.walk(node.test)
                                            if isinstance(c, ast.Compare) for op in c.ops):
            names |= {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
    return names


def _bound(tree) -> dict[str, list[ast.AST]]:
    """{name: [the top-level statements binding it]} of a cell."""
    out: dict[str, list] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, []).append(node)
    return out


def _placeholder(node) -> bool:
    """None or `...`; a function still holding a `...`, or returning nothing but None."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        if any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(node)):
            return True
        returns = [n for n in ast.walk(node) if isinstance(n, ast.Return)]
        return all(r.value is None or (isinstance(r.value, ast.Constant) and r.value.value is None)
                   for r in returns)
    value = getattr(node, "value", None)
    if isinstance(value, ast.Tuple):
        return all(isinstance(v, ast.Constant) and v.value in (None, Ellipsis) for v in value.elts)
    return isinstance(value, ast.Constant) and value.value in (None, Ellipsis)


def _code(cell) -> str:
    lines = "".join(cell["source"]).splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


EXERCISES = [(nb.stem, head, cells) for nb in NOTEBOOKS for head, cells in _sections(json.loads(nb.read_text()))]


def test_the_book_has_exercises():
    assert len({stem for stem, _, _ in EXERCISES}) >= 4, [stem for stem, _, _ in EXERCISES]


@pytest.mark.parametrize("stem, head, cells", EXERCISES, ids=[f"{s}: {h[:40]}" for s, h, _ in EXERCISES])
def test_no_exercise_shows_its_answer_in_the_readers_cell(stem, head, cells):
    code = [c for c in cells if c["cell_type"] == "code"]
    hidden = [c for c in code if "hide-input" in c.get("metadata", {}).get("tags", [])]
    solutions = [c for c in hidden if "".join(c["source"]).lstrip().startswith(SOLUTION)]
    assert solutions, f"{stem} {head!r}: no hidden solution cell (tag hide-input, first line {SOLUTION!r})"
    solved = set()
    for c in solutions:
        solved |= _answers(ast.parse(_code(c)))
    assert solved, f"{stem} {head!r}: the solution cell fills nothing in (no `if <answer> is None:` guard)"
    for c in code:
        if c in hidden:
            continue
        for name, nodes in _bound(ast.parse(_code(c))).items():
            if name in solved:
                shown = [ast.unparse(n)[:80] for n in nodes if not _placeholder(n)]
                assert not shown, (f"{stem} {head!r}: the reader's cell gives `{name}` its answer: {shown}; "
                                   f"leave it None or `...` there and fill it in the hidden solution cell")


def test_the_scan_catches_an_answer_in_the_readers_cell():
    cell = lambda src, tags=(): {"cell_type": "code", "source": src, "metadata": {"tags": list(tags)}}  # noqa: E731
    solution = cell("# Solution (hidden in the book)\nif my_calls is None:\n    my_calls = 8 * L\n", ["hide-input"])
    fair = [cell("my_calls = ...   # your answer"), solution]
    shown = [cell("my_calls = 8 * L   # your answer"), solution]
    test_no_exercise_shows_its_answer_in_the_readers_cell("nb", "## Exercise", fair)
    with pytest.raises(AssertionError, match="gives `my_calls` its answer"):
        test_no_exercise_shows_its_answer_in_the_readers_cell("nb", "## Exercise", shown)
