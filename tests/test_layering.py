"""The walls of the package (DESIGN.md sections 2 and 10), each checked on the package and each
shown to fail on a mutated copy of it:

- the pure layer: every module of `PURE`, imported in a fresh process, imports no torch (so no
  torch.distributed) and no runtime module of pipelib; `import pipelib` is one of them;
- no module keeps state in a module-level dict, list or set (process groups, caches, counters
  belong to an object: the `Device`, a runner), and read-only tables are frozen;
- strategy code leaves the device alone: it never resets the message counters, never replaces
  the device's memory tracker or profile, never changes its capacity (`Device` does that), in
  every subpackage but `NOT_STRATEGIES`; no module but the mesh makes a process group.
"""
import ast
import json
import pathlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- the pure layer
# Starts no process, imports neither torch nor any runtime module, testable in microseconds.
PURE = [
    "pipelib",  # the root: `pipelib.Cluster` imports the cluster only when it is used
    "pipelib.checks", "pipelib.trace", "pipelib.costmodel", "pipelib.memory", "pipelib.results",
    "pipelib.scaling", "pipelib.topology", "pipelib.frameworks",
    "pipelib.comm.registry", "pipelib.comm.twins", "pipelib.tensor_parallel.styles", "pipelib.recompute.registry",
    "pipelib.pipeline.schedules", "pipelib.pipeline.schedules.registry", "pipelib.pipeline.simulate",
    "pipelib.comm.alphabeta", "pipelib.hardware.roofline", "pipelib.hardware.published",
    "pipelib.recompute.formulas", "pipelib.context_parallel.costs", "pipelib.context_parallel.layouts",
    "pipelib.tensor_parallel.plan", "pipelib.tensor_parallel.formulas",
    "pipelib.data_parallel.zero_formulas", "pipelib.data_parallel.buckets", "pipelib.data_parallel.efficiency",
    "pipelib.viz", "pipelib.viz.timeline", "pipelib.viz.comm", "pipelib.viz.hardware", "pipelib.viz.display",
    "pipelib.viz.recompute", "pipelib.viz.ring", "pipelib.viz.tensor_parallel", "pipelib.viz.zero",
    "pipelib.viz.ddp", "pipelib.recompute.offload", "pipelib.data_parallel.zero_family", "pipelib.planner",
    "pipelib.planner.spec", "pipelib.planner.strategy",
    "pipelib.planner.memory", "pipelib.planner.timing", "pipelib.planner.search", "pipelib.planner.book",
    "pipelib.viz.experts", "pipelib.expert_parallel.policies", "pipelib.expert_parallel.sizes",
    "pipelib.planner.orders", "pipelib.planner.published", "pipelib.viz.mesh",
    "pipelib.checkpoint.interval", "pipelib.viz.faults", "pipelib.topology_groups",
]

# Run in a fresh interpreter: import one module and report what it pulled in.
PROBE = r"""
import importlib, json, sys
before = set(sys.modules)
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by(modules, pythonpath=ROOT) -> dict[str, list[str]]:
    """{module: every module its import loaded}, each imported in its own fresh interpreter."""
    env = {"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"}

    def probe(name):
        run = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True,
                             cwd=pythonpath, env=env, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        return name, json.loads(run.stdout)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(probe, modules))


def _is_pure(mod: str) -> bool:
    """A pipelib module allowed under a pure import: a pure module, its package, the lazy loader."""
    if mod in PURE or mod == "pipelib._lazy":
        return True
    return any(p.startswith(mod + ".") for p in PURE) or mod.startswith("pipelib.pipeline.schedules.")


def layer_violations(loaded: dict[str, list[str]]) -> list[str]:
    bad = []
    for name, mods in loaded.items():
        bad += [f"{name} imports {m}" for m in ("torch", "torch.distributed") if m in mods]
        runtime = [m for m in mods if m.startswith("pipelib") and not _is_pure(m)]
        if runtime:
            bad.append(f"{name} imports runtime modules {runtime}")
    return bad


def test_pure_modules_import_no_torch_and_no_runtime_module():
    assert layer_violations(loaded_by(PURE)) == []


def test_the_list_of_pure_modules_is_current():
    for name in PURE:
        path = ROOT / (name.replace(".", "/") + ".py")
        assert path.exists() or (ROOT / name.replace(".", "/") / "__init__.py").exists(), name


def test_pipelib_cluster_is_imported_on_first_use():
    import pipelib
    from pipelib.runtime.cluster import Cluster

    assert pipelib.Cluster is Cluster and pipelib.__all__ == ["Cluster"]


def test_a_pure_module_that_imports_torch_or_the_runtime_is_caught(tmp_path):
    """The same check on a copy of pipelib where simulate imports torch.distributed and the
    timeline figure a runtime module: both are caught."""
    copy = _copy(tmp_path)
    _append(copy / "pipeline" / "simulate.py", "import torch.distributed  # a layering mistake")
    _append(copy / "viz" / "timeline.py", "import pipelib.runtime.device  # another")
    bad = layer_violations(loaded_by(["pipelib.pipeline.simulate", "pipelib.viz.timeline"], tmp_path))
    assert "pipelib.pipeline.simulate imports torch.distributed" in bad
    assert "pipelib.pipeline.simulate imports torch" in bad
    assert any(b.startswith("pipelib.viz.timeline imports runtime modules ['pipelib.runtime") for b in bad), bad


# ----------------------------------------------------------------------------- module state
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}


def _module_statements(body):
    """The statements that run at import: the module's, and those inside its if/try/with/for."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                yield from _module_statements(getattr(node, field, None) or [])
            for handler in getattr(node, "handlers", []):
                yield from _module_statements(handler.body)


def _is_mutable(value) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        return (f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)) in MUTABLE_CALLS
    return False


def module_state(root: pathlib.Path) -> dict[str, int]:
    """{"path:NAME": line} of each module-level name bound to a dict, list or set (a literal, a
    comprehension or a dict()/list()/set()/defaultdict() call); `__all__` excepted."""
    found = {}
    for path in sorted((root / "pipelib").rglob("*.py")):
        for node in _module_statements(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id != "__all__" and _is_mutable(value):
                    found[f"{path.relative_to(root)}:{target.id}"] = node.lineno
    return found


def test_no_module_level_mutable_state():
    found = module_state(ROOT)
    assert not found, ("module-level dict/list/set: state belongs to an object (Device.groups, a "
                       f"runner), a constant table to a tuple, a frozenset or a MappingProxyType: {found}")


def test_module_state_check_catches_a_cache(tmp_path):
    copy = _copy(tmp_path)
    _append(copy / "trace.py", "_CACHE = {}\nif True:\n    SEEN: set = set()\nGROUPS = defaultdict(list)")
    _append(copy / "costmodel.py", "NAMES = ('a', 'b')\nFROZEN = frozenset({1})\n__all__ = ['x']")
    found = module_state(tmp_path)
    assert {"pipelib/trace.py:_CACHE", "pipelib/trace.py:SEEN", "pipelib/trace.py:GROUPS"} <= set(found)
    fine = {"pipelib/costmodel.py:NAMES", "pipelib/costmodel.py:FROZEN", "pipelib/costmodel.py:__all__"}
    assert not fine & set(found)


# ----------------------------------------------------------------------------- the device's own
# Every subpackage is strategy code but these, each with its reason: a new pipelib/fp8/ is guarded.
NOT_STRATEGIES = {
    "runtime": "owns the device: Device, its measurement spans and the cluster reset and swap it",
    "viz": "pure: draws figures from events and never sees a device (the pure-layer test)",
    "planner": "pure: evaluates plans on paper, no device (the pure-layer test)",
}
DEVICE_CALLS = frozenset({"reset_counters", "fresh_memory"})
DEVICE_FIELDS = frozenset({"memory", "profile"})


def _targets(node):
    """Every assignment target of `node`, tuples unpacked."""
    todo = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo += t.elts
        else:
            yield t


def strategy_packages(root: pathlib.Path) -> list[str]:
    """Every subpackage of `root`/pipelib (a folder with an __init__.py) not in NOT_STRATEGIES."""
    return sorted(p.parent.name for p in (root / "pipelib").glob("*/__init__.py")
                  if p.parent.name not in NOT_STRATEGIES)


def device_meddling(root: pathlib.Path) -> dict[str, list[int]]:
    """{"path: what": lines} of each place in strategy code that calls reset_counters() or
    fresh_memory(), or assigns x.memory, x.profile (x not `self`) or x.memory.capacity."""
    found: dict[str, list[int]] = {}
    for package in strategy_packages(root):
        for path in sorted((root / "pipelib" / package).rglob("*.py")):
            where = str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text())):
                what = None
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                    if name in DEVICE_CALLS:
                        what = f"calls {name}()"
                    elif (name == "setattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                          and node.args[1].value in DEVICE_FIELDS):
                        what = f"assigns {ast.unparse(node.args[0])}.{node.args[1].value}"
                    if what:
                        found.setdefault(f"{where}: {what}", []).append(node.lineno)
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    for t in _targets(node):
                        if not isinstance(t, ast.Attribute):
                            continue
                        owner = t.value
                        capacity = t.attr == "capacity" and isinstance(owner, ast.Attribute) and owner.attr == "memory"
                        field = t.attr in DEVICE_FIELDS and not (isinstance(owner, ast.Name) and owner.id == "self")
                        if capacity or field:
                            found.setdefault(f"{where}: assigns {ast.unparse(t)}", []).append(node.lineno)
    return found


def test_strategy_code_leaves_the_device_alone():
    packages = strategy_packages(ROOT)  # discovered; the exclusions are current folders
    assert {"data_parallel", "tensor_parallel", "pipeline", "context_parallel", "recompute", "comm",
            "expert_parallel", "checkpoint", "hf"} <= set(packages), packages
    assert all((ROOT / "pipelib" / name / "__init__.py").exists() for name in NOT_STRATEGIES)
    found = device_meddling(ROOT)
    assert not found, ("strategy code resets counters or replaces the device's memory tracker, profile "
                       f"or capacity; read counters as differences, and let Device do the rest: {found}")


def test_device_check_catches_a_strategy_that_resets_the_device(tmp_path):
    copy = _copy(tmp_path)
    _append(copy / "tensor_parallel" / "ops.py",
            "def _meddle(dev, p2p):\n    p2p.reset_counters()\n    dev.memory = dev.fresh_memory()\n"
            "    before, dev.memory.capacity = dev.memory.capacity, 1\n    setattr(dev, 'profile', None)\n"
            "    self.memory = []  # an object's own field: fine")
    (copy / "fp8").mkdir()  # a new strategy folder, listed nowhere
    (copy / "fp8" / "__init__.py").write_text('"""FP8."""\ndef scale(dev):\n    dev.reset_counters()\n')
    found = device_meddling(tmp_path)
    ops = "pipelib/tensor_parallel/ops.py"
    assert {f"{ops}: calls reset_counters()", f"{ops}: calls fresh_memory()", f"{ops}: assigns dev.memory",
            f"{ops}: assigns dev.memory.capacity", f"{ops}: assigns dev.profile",
            "pipelib/fp8/__init__.py: calls reset_counters()"} <= set(found), found
    assert f"{ops}: assigns self.memory" not in found


# ----------------------------------------------------------------------------- process groups
GROUP_MAKERS = frozenset({"new_group", "make_group", "_make_group"})


def group_makers(root: pathlib.Path) -> dict[str, list[int]]:
    """{"path: what": lines} of each module but runtime/mesh.py importing or using GROUP_MAKERS."""
    found: dict[str, list[int]] = {}
    for path in sorted((root / "pipelib").rglob("*.py")):
        if path != root / "pipelib" / "runtime" / "mesh.py":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    what = [f"imports {a.name}" for a in node.names if a.name in GROUP_MAKERS]
                else:
                    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
                    what = [f"uses {ast.unparse(node)}"] if name in GROUP_MAKERS else []
                for w in what:
                    found.setdefault(f"{path.relative_to(root)}: {w}", []).append(node.lineno)
    return found


def test_only_the_mesh_makes_process_groups():
    found = group_makers(ROOT)
    assert not found, ("only pipelib.runtime.mesh.Mesh makes groups (collective: once per engine, in one order): "
                       f"take mesh[axis], Mesh.first(n)[axis], mesh.tied_group(), mesh.grid_group(): {found}")


def test_group_check_catches_a_module_that_makes_its_own_group(tmp_path):
    copy = _copy(tmp_path)
    _append(copy / "data_parallel" / "ddp.py", "def _mine(dist, ranks):\n    return dist.new_group(ranks)")
    _append(copy / "checkpoint" / "training.py", "from pipelib.runtime.mesh import _make_group\n"
            "from torch.distributed import new_group\nmine = _make_group((0,), None), new_group([0])")
    _append(copy / "runtime" / "mesh.py", "def _fine(dist):\n    return dist.new_group([0])  # the mesh's own")
    found, ckpt = group_makers(tmp_path), "pipelib/checkpoint/training.py"
    assert set(found) == {"pipelib/data_parallel/ddp.py: uses dist.new_group", f"{ckpt}: imports _make_group",
                          f"{ckpt}: imports new_group", f"{ckpt}: uses _make_group", f"{ckpt}: uses new_group"}


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    shutil.copytree(ROOT / "pipelib", tmp_path / "pipelib", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "pipelib"


def _append(path: pathlib.Path, code: str) -> None:
    path.write_text(path.read_text() + "\n" + code + "\n")


if __name__ == "__main__":  # the current findings, line by line
    for key, line in sorted(module_state(ROOT).items()):
        print(f"state  {key} (line {line})")
    for key, lines in sorted(device_meddling(ROOT).items()):
        print(f"device {key} (lines {lines})")
    print("\n".join(f"groups {key} (lines {lines})" for key, lines in sorted(group_makers(ROOT).items())))
