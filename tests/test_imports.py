"""pipelib's import graph has no circle: every `from pipelib... import` (at the top of a module
or inside a function: both run, and a circle of function-level imports still ties the modules
together) points one way. The check is shown to fail on a planted circle."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "pipelib"


def import_graph(root: pathlib.Path, package: str = "pipelib") -> dict[str, set[str]]:
    """{module: the package's modules it imports}, every import statement anywhere in the file."""
    mods = {}
    for p in root.rglob("*.py"):
        parts = (package, *p.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        here = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m and t != package}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_pipelib_has_no_import_circle():
    found = circles(import_graph(ROOT))
    assert not found, "import circles (a module reaches itself through these): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_the_check_finds_a_circle_of_function_level_imports(tmp_path):
    pkg = tmp_path / "pipelib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pipelib.sub.b import g\n    return g\n")
    (pkg / "sub" / "b.py").write_text("from ..c import h\n\ndef g():\n    return h\n")
    (pkg / "c.py").write_text("from pipelib import a\n\ndef h():\n    return a.f\n")
    assert circles(import_graph(pkg)) == [["pipelib.a", "pipelib.c", "pipelib.sub.b"]]
