"""Pure tests of the schedule registry: one entry per schedule, consistent with what its
generator makes; names and aliases resolve; no schedule name is tested anywhere else."""
import ast
import io
import tokenize
from pathlib import Path

import pytest

from pipelib.pipeline.schedules import ALIASES, GENERATORS, REGISTRY, Op, make_schedule, schedule_info, validate
from pipelib.pipeline.schedules.build import looped_placement, v_placement
from pipelib.pipeline.simulate import Costs, bubble_closed_form, simulate

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_FILE = ROOT / "pipelib" / "pipeline" / "schedules" / "registry.py"
NAMES = set(REGISTRY) | set(ALIASES)


def sizes(info, p):
    """(m, v) pairs every generator accepts: m a multiple of 2p (DualPipeV needs m >= 2p)."""
    vs = (1, 2, 3) if info.chunked else (None,)
    return [(m, v) for m in (2 * p, 4 * p) for v in vs]


def costs_assumed(info, v):
    """The costs a closed form assumes: per chunk (a chunk is 1/v of a stage), F = I = W."""
    chunks = v if info.chunked else info.stages_per_rank
    return Costs(F=1, B=2, I=1, W=1).scaled(1 / chunks)


# --------------------------------------------------------------------------- each entry


@pytest.mark.parametrize("name", list(REGISTRY))
def test_entry_matches_what_its_generator_makes(name):
    info = REGISTRY[name]
    assert info.name == name and GENERATORS[name] is info.generator
    assert schedule_info(info.generator.__name__) is info  # the function's name is a name too
    for p in (1, 2, 3, 4):
        for m, v in sizes(info, p):
            s = make_schedule(name, p, m, v)
            assert s == (info.generator(p, m, v) if info.chunked else info.generator(p, m))
            assert s.name == name
            validate(s, order="kind")
            ops = {a.op for acts in s.actions for a in acts}
            if p > 1:  # one rank: DualPipeV's cool-down needs no split
                assert info.split_backward == bool(ops & {Op.I, Op.W}), (p, m, v)
            assert s.num_chunks == (v if info.chunked else info.stages_per_rank), (p, m, v)
            want = v_placement(p) if info.v_shaped else looped_placement(p, s.num_chunks)
            assert s.stage_to_rank == want


@pytest.mark.parametrize("name", list(REGISTRY))
def test_closed_form_equals_the_simulated_bubble(name):
    info = REGISTRY[name]
    if info.closed_form is None:
        with pytest.raises(ValueError, match=f"no closed form for schedule '{name}'"):
            bubble_closed_form(name, 4, 16)
        return
    for p in (2, 3, 4, 8):
        for m, v in sizes(info, p):
            v = v or info.stages_per_rank
            costs = costs_assumed(info, v)
            r = simulate(make_schedule(name, p, m, v), costs)
            assert r.bubble == pytest.approx(bubble_closed_form(name, p, m, v, costs=costs), abs=1e-12)
            assert r.bubble_relative == pytest.approx(
                bubble_closed_form(name, p, m, v, costs=costs, relative=True), abs=1e-12)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_peak_inflight_formula_equals_the_simulated_peak(name):
    info = REGISTRY[name]
    if info.inflight is None:
        with pytest.raises(ValueError, match=f"no in-flight formula for schedule '{name}'"):
            info.peak_inflight(4, 16)
        return
    for p in (1, 2, 3, 4, 8):
        for m in range(1, 3 * p + 2):
            for v in ((2, 3) if info.chunked else (1,)):
                try:
                    s = make_schedule(name, p, m, v)
                except ValueError:
                    continue  # a generator that needs m >= p (or a multiple): nothing to predict
                try:
                    want = info.peak_inflight(p, m, v)
                except ValueError:  # a size the formula leaves to simulate: only interleaved's odd rounds
                    assert name == "interleaved_1f1b" and m > p and m % p, (p, m, v)
                    continue
                assert want == simulate(s).peak_inflight[0], (p, m, v)


@pytest.mark.parametrize("name", [n for n, i in REGISTRY.items() if i.torch_class])
def test_torch_class_exists(name):
    pp = pytest.importorskip("torch.distributed.pipelining")
    assert isinstance(getattr(pp, REGISTRY[name].torch_class), type)


def test_closed_form_checks_its_integers():
    with pytest.raises(ValueError, match=r"bubble_closed_form\('gpipe'\): m=0; pass an integer >= 1"):
        bubble_closed_form("gpipe", 4, 0)
    with pytest.raises(ValueError, match="v=0"):
        bubble_closed_form("interleaved_1f1b", 4, 8, 0)


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("alias", list(ALIASES))
def test_alias_resolves_to_its_schedule(alias):
    info = schedule_info(alias)
    assert info is REGISTRY[ALIASES[alias]] and alias in info.aliases
    assert make_schedule(alias, 4, 8) == make_schedule(info.name, 4, 8)


def test_known_aliases():
    assert {a: schedule_info(a).name for a in ("one_f_one_b", "zero_bubble_h1", "zbh1", "GPipe")} == {
        "one_f_one_b": "1f1b", "zero_bubble_h1": "zb_h1", "zbh1": "zb_h1", "GPipe": "gpipe"}
    assert not set(ALIASES) & set(REGISTRY)


@pytest.mark.parametrize("bad", ["2f2b", "", "ZBV", None, 3])
def test_unknown_name_lists_the_names(bad):
    with pytest.raises(ValueError, match=f"unknown schedule {bad!r}; choose one of") as e:
        schedule_info(bad)
    assert all(repr(n) in str(e.value) for n in REGISTRY)
    assert all(a in str(e.value) for a in ALIASES)


# --------------------------------------------------------------------------- names only here


def name_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal equal to a schedule name or alias, except where it
    is *given*: right after a lone `=` (a parameter's default, a keyword argument such as a
    generator's `name="zbv"` label, an assignment). Anywhere else (after `==` or `in`, a dict
    key, a member of a tuple of names, a positional argument) the name decides something, and
    that belongs in the registry. Docstrings never equal a name, so they never match; nor do
    the statements `__all__ = ...` and `API = ...`, whose strings name Python objects (the
    generator functions `naive`, `gpipe`, `zbv`, ...), not schedules."""
    out, prev, first = [], None, None
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in skip:
            continue
        if tok.type == tokenize.NEWLINE:
            prev = first = None
            continue
        first = first or tok.string
        if (tok.type == tokenize.STRING and first not in ("__all__", "API")
                and not (prev is not None and prev.string == "=")):
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string
                value = None
            if value in NAMES:
                out.append((tok.start[0], tok.line.strip()))
        prev = tok
    return out


def test_the_name_check_catches_tests_and_maps_but_not_labels():
    source = ('def f(name, schedule="1f1b"):\n'
              '    """Run "zbv" or 1f1b."""\n'
              '    if name == "naive":  # a test\n'
              '        return {"gpipe": 1}.get(name, Schedule((), 1, 1, (), name="zbv"))\n'
              '    return name in ("zb_h1",\n'
              '                    "GPipe") or check(f"{name}", "dualpipe_v")\n')
    assert [line for line, _ in name_literals(source)] == [3, 4, 5, 6, 6]
    assert name_literals('__all__ = ["naive", "gpipe"]\nAPI: dict = {"zbv": "schedules"}\n') == []


def test_no_schedule_name_is_tested_outside_the_registry():
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for path in sorted((ROOT / "pipelib").rglob("*.py")) if path != REGISTRY_FILE
             for line, text in name_literals(path.read_text())]
    assert not found, ("schedule names compared or mapped outside the registry; use "
                       "`schedule_info(name)` and a `ScheduleInfo` field instead:\n" + "\n".join(found))


def test_schedules_modules_import_without_a_circle():
    """Each module of pipelib/pipeline/schedules imports only modules listed before it."""
    order = ["ir", "validation", "csv_io", "build", "generators", "zero_bubble", "registry"]
    pkg = REGISTRY_FILE.parent
    assert sorted(order) == sorted(p.stem for p in pkg.glob("*.py") if p.stem != "__init__")
    for i, mod in enumerate(order):
        tree = ast.parse((pkg / f"{mod}.py").read_text())
        used = {n.module.rsplit(".", 1)[1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("pipelib.pipeline.schedules.")}
        assert used <= set(order[:i]), f"{mod} imports {used - set(order[:i])}"
