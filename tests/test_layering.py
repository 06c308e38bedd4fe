"""The two layers (DESIGN.md section 2): every pure module imports, in a fresh process, without
torch.distributed and without any runtime module of pipelib. And the check can fail: a copy of
pipelib whose simulate imports torch.distributed is caught."""
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The pure layer: starts no process, imports no torch.distributed, testable in microseconds.
PURE = [
    "pipelib.checks", "pipelib.trace", "pipelib.costmodel", "pipelib.memory", "pipelib.results",
    "pipelib.pipeline.schedules", "pipelib.pipeline.schedules.registry", "pipelib.pipeline.simulate",
    "pipelib.comm.alphabeta", "pipelib.hardware.roofline", "pipelib.hardware.published",
    "pipelib.viz.timeline", "pipelib.viz.comm", "pipelib.viz.hardware", "pipelib.viz.display",
    "pipelib.recompute.formulas", "pipelib.viz.recompute",
    "pipelib.context_parallel.costs", "pipelib.viz.ring",
    "pipelib.tensor_parallel.plan", "pipelib.tensor_parallel.formulas", "pipelib.viz.tensor_parallel",
    "pipelib.data_parallel.zero_formulas", "pipelib.viz.zero",
    "pipelib.data_parallel.buckets", "pipelib.data_parallel.efficiency", "pipelib.viz.ddp",
]
# Not even torch itself: the schedules, their simulation and the formulas.
NO_TORCH = {"pipelib.checks", "pipelib.trace", "pipelib.costmodel", "pipelib.memory",
            "pipelib.pipeline.schedules", "pipelib.pipeline.schedules.registry",
            "pipelib.pipeline.simulate", "pipelib.comm.alphabeta",
            "pipelib.recompute.formulas", "pipelib.viz.recompute",
            "pipelib.context_parallel.costs", "pipelib.tensor_parallel.plan",
            "pipelib.tensor_parallel.formulas", "pipelib.viz.tensor_parallel",
            "pipelib.data_parallel.zero_formulas", "pipelib.viz.zero",
            "pipelib.data_parallel.buckets", "pipelib.data_parallel.efficiency", "pipelib.viz.ddp"}

# Run in a fresh interpreter: import each module and report what it pulled in.
PROBE = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    before = set(sys.modules)
    importlib.import_module(name)
    out[name] = sorted(set(sys.modules) - before)
print(json.dumps(out))
"""


def loaded_by(modules, pythonpath=ROOT) -> dict[str, list[str]]:
    """{module: every module its import loaded}, each imported in its own fresh interpreter."""
    out = {}
    for name in modules:
        run = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True,
                             cwd=pythonpath, env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"},
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        out.update(json.loads(run.stdout))
    return out


def _is_pure(mod: str) -> bool:
    """A pipelib module allowed under a pure import: a pure module, its package, the lazy loader."""
    if mod in PURE or mod in ("pipelib", "pipelib._lazy"):
        return True
    return any(p.startswith(mod + ".") for p in PURE) or mod.startswith("pipelib.pipeline.schedules.")


def violations(loaded: dict[str, list[str]]) -> list[str]:
    bad = []
    for name, mods in loaded.items():
        if "torch.distributed" in mods:
            bad.append(f"{name} imports torch.distributed")
        if name in NO_TORCH and "torch" in mods:
            bad.append(f"{name} imports torch")
        runtime = [m for m in mods if m.startswith("pipelib") and not _is_pure(m)]
        if runtime:
            bad.append(f"{name} imports runtime modules {runtime}")
    return bad


@pytest.fixture(scope="module")
def loaded():
    return loaded_by(PURE)


def test_pure_modules_import_no_torch_distributed_and_no_runtime_module(loaded):
    assert violations(loaded) == []


def test_the_list_of_pure_modules_is_current():
    for name in PURE:
        path = ROOT / (name.replace(".", "/") + ".py")
        assert path.exists() or (ROOT / name.replace(".", "/") / "__init__.py").exists(), name


def test_a_pure_module_that_imports_torch_distributed_is_caught(tmp_path):
    """The same check on a copy of pipelib where simulate imports torch.distributed: it fails."""
    shutil.copytree(ROOT / "pipelib", tmp_path / "pipelib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sim = tmp_path / "pipelib" / "pipeline" / "simulate.py"
    sim.write_text(sim.read_text() + "\nimport torch.distributed  # a layering mistake\n")
    stage = tmp_path / "pipelib" / "viz" / "timeline.py"
    stage.write_text(stage.read_text() + "\nimport pipelib.runtime.device  # another\n")
    bad = violations(loaded_by(["pipelib.pipeline.simulate", "pipelib.viz.timeline"], tmp_path))
    assert "pipelib.pipeline.simulate imports torch.distributed" in bad
    assert "pipelib.pipeline.simulate imports torch" in bad
    assert any(b.startswith("pipelib.viz.timeline imports runtime modules ['pipelib.runtime") for b in bad), bad
