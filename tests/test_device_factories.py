"""Tensor factories in pipelib take a device (issue 26, placement): on a ``cuda`` engine a tensor
made without one lands on the CPU, and NCCL refuses it ("No backend type associated with device
type cpu") or a kernel mixes devices. Runtime code gives every factory the device of the tensor it
serves (``device=t.device``, ``device=dev.torch_device``) or uses a ``*_like`` factory.

The scan reads every module of the package with `ast` and lists each ``torch.<factory>(...)`` call
with no ``device=`` keyword, by file:line. What is made on the CPU by design is allowed below, one
function at a time, each with its reason; an entry that no longer matches anything is an error
too, so the list only shrinks with the code. The last test shows the scan failing on a mutated
source.
"""
import ast
import pathlib
from types import MappingProxyType

ROOT = pathlib.Path(__file__).resolve().parents[1]

# torch functions that make a new tensor and take device= (the *_like ones take their input's)
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "range", "linspace",
                       "logspace", "eye", "rand", "randn", "randint", "randperm", "normal", "empty_strided",
                       "scalar_tensor", "tril_indices", "triu_indices"})

_DATA = "data generation on the CPU with a private generator: the same numbers on every device, moved after"
_RESULT = "a result or report for the notebook, which compares on the CPU (Cluster.run returns CPU tensors)"
_FORMULA = "a pure formula or index bookkeeping on the CPU, no tensor of a step"
_INIT = "model initialisation on the CPU (private generators or buffers), moved with the model by to_rank_device"
_KEEPS = _RESULT + "; as_tensor keeps a tensor's own device"
_FILES = "checkpoint files are read and assembled on the CPU, then copied into the parameters"

# "path::function" -> (factories allowed there, why). CPU by design:
ALLOWED = MappingProxyType({
    "pipelib/batches.py::_random": ({"randint"}, _DATA),
    "pipelib/batches.py::_counting": ({"randint", "arange"}, _DATA),
    "pipelib/batches.py::global_batch": ({"randint", "arange", "randn"}, _DATA),
    "pipelib/data.py::CharCorpus.__init__": ({"tensor"}, _DATA),
    "pipelib/data.py::CharCorpus.get_batch": ({"randint"}, _DATA),
    "pipelib/data.py::MarkovChain.__init__": ({"randn"}, _DATA),
    "pipelib/data.py::MarkovChain._stationary": ({"zeros", "arange", "eye", "ones"}, _FORMULA),
    "pipelib/data.py::spirals": ({"arange", "rand", "randn"}, _DATA),
    "pipelib/train.py::train_mlp": ({"randint"}, _DATA),
    "pipelib/pipeline/handwritten.py::_minibatches": ({"randint"}, _DATA + " (to_rank_device)"),
    "pipelib/context_parallel/partition.py::attention_inputs": ({"randn"}, _DATA),
    "pipelib/tensor_parallel/dtensor_twin.py::_tp_inputs": ({"randn"}, _DATA),
    "pipelib/expert_parallel/pipelined.py::pipeline_batch": ({"randn", "randint"}, _DATA),
    "pipelib/data_parallel/ddp_order.py::ddp_orders": ({"randn"}, _DATA),
    "pipelib/scaling_step.py::_scaling_step": ({"randn"}, _DATA),
    "pipelib/checkpoint/crashes.py::toy_state": ({"randn"}, _DATA),
    "pipelib/gpucheck/collectives.py::collective_on_rank": ({"randint"}, _DATA),
    "pipelib/expert_parallel/experts.py::init_expert": ({"randn"}, _INIT),
    "pipelib/expert_parallel/layer.py::MoE.__init__": ({"zeros"}, _INIT),
    "pipelib/model.py::CausalSelfAttention.__init__": ({"ones"}, _INIT),
    "pipelib/expert_parallel/layer.py::MoESpec.__post_init__": ({"zeros"}, "a shape check of the arguments"),
    "pipelib/pipeline/handwritten.py::train": ({"tensor"}, _RESULT),
    "pipelib/recipe.py::Recipe.reference": ({"tensor"}, _RESULT),
    "pipelib/trainer.py::train_plan": ({"tensor"}, _RESULT),
    "pipelib/expert_parallel/training.py::train_expert_parallel": ({"tensor"}, _RESULT),
    "pipelib/expert_parallel/training.py::moe_reference": ({"tensor"}, _RESULT),
    "pipelib/results.py::check_against_reference": ({"tensor"}, _RESULT),
    "pipelib/results.py::_as_tensor": ({"tensor", "as_tensor"}, _KEEPS),
    "pipelib/gpucheck/spine.py::max_difference": ({"tensor"}, _RESULT),
    "pipelib/expert_parallel/balance.py::load_imbalance": ({"as_tensor"}, _KEEPS),
    "pipelib/data_parallel/zero_precision.py::ring_sum_error": ({"randn"}, _FORMULA + " (bf16 rounding)"),
    "pipelib/context_parallel/partition.py::shard_pieces": ({"arange"}, _FORMULA + "; callers move positions"),
    "pipelib/context_parallel/partition.py::work_per_rank": ({"arange"}, _FORMULA),
    "pipelib/runtime/mesh.py::Mesh.to_device_mesh": ({"tensor"}, "the rank grid DeviceMesh takes as a CPU tensor"),
    "pipelib/checkpoint/pieces.py::Piece.indices": ({"arange"}, _FORMULA),
    "pipelib/checkpoint/pieces.py::check_covered": ({"zeros"}, _FORMULA),
    "pipelib/checkpoint/sharded.py::load_sharded": ({"zeros"}, _FILES),
    "pipelib/checkpoint/dcp.py::dcp_load_whole": ({"empty"}, _FILES + " (one process, no group)"),
})

# LEAD: none left (the comm layer's allocations take their tensor's device since issue 26's rules).
LEAD = MappingProxyType({})


def factories_without_device(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function's qualified name, factory) of each torch.<factory>(...) call in
    `source` with no device= keyword (a **kwargs splat counts as none)."""
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "torch"
                    and child.func.attr in FACTORIES and not any(k.arg == "device" for k in child.keywords)):
                found.append((child.lineno, ".".join(_outer(scope)), child.func.attr))
            visit(child, scope)

    visit(ast.parse(source), [])
    return sorted(found)


def _outer(scope: list[str]) -> list[str]:
    """A nested function counts as its enclosing top-level function or method."""
    return scope[:2] if len(scope) > 1 and scope[0][:1].isupper() else scope[:1]


def scan(root: pathlib.Path, allowed) -> tuple[list[str], set[str]]:
    """(file:line of every factory without a device outside `allowed`, the entries of `allowed` used)."""
    bad, used = [], set()
    for path in sorted((root / "pipelib").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, func, name in factories_without_device(path.read_text()):
            key = f"{rel}::{func}"
            if key in allowed and name in allowed[key][0]:
                used.add(key)
            else:
                bad.append(f"{rel}:{line}: torch.{name}(...) without device= in {func or 'the module'}")
    return bad, used


def test_every_tensor_factory_takes_a_device_or_is_cpu_by_design():
    allowed = {**ALLOWED, **LEAD}
    bad, used = scan(ROOT, allowed)
    assert not bad, ("give these the device of the tensor they serve (device=t.device, dev.torch_device) "
                     "or a *_like factory; or, if CPU by design, allow them in tests/test_device_factories.py "
                     "with the reason:\n" + "\n".join(bad))
    stale = sorted(set(allowed) - used)
    assert not stale, f"these allowed places make no device-less factory any more; remove them: {stale}"


def test_the_allowlist_is_short_and_every_entry_says_why():
    for key, (names, why) in {**ALLOWED, **LEAD}.items():
        assert names <= FACTORIES and len(why) > 10, key
    assert not set(ALLOWED) & set(LEAD)


def test_the_scan_catches_a_factory_without_a_device(tmp_path):
    pkg = tmp_path / "pipelib" / "comm"
    pkg.mkdir(parents=True)
    (pkg / "mutant.py").write_text(
        "import torch\n\n"
        "def ring(t):\n"
        "    buf = torch.empty(4, dtype=t.dtype)\n"                    # line 4: caught
        "    ok = torch.empty(4, dtype=t.dtype, device=t.device)\n"
        "    like = torch.zeros_like(t)\n"
        "    return torch.tensor([1.0]), buf, ok, like\n\n"           # line 7: caught
        "class Stage:\n"
        "    def forward(self, x):\n"
        "        def inner():\n"
        "            return torch.arange(3)\n"                         # line 12: caught, as Stage.forward
        "        return inner()\n")
    bad, _ = scan(tmp_path, {})
    assert [b.split(": ")[0] for b in bad] == ["pipelib/comm/mutant.py:4", "pipelib/comm/mutant.py:7",
                                               "pipelib/comm/mutant.py:12"], bad
    assert "in Stage.forward" in bad[-1]
    allowed = {"pipelib/comm/mutant.py::ring": ({"empty", "tensor"}, "why"),
               "pipelib/comm/mutant.py::Stage.forward": ({"arange"}, "why")}
    assert scan(tmp_path, allowed)[0] == []
    assert scan(tmp_path, {"pipelib/comm/mutant.py::ring": ({"empty"}, "why")})[0] == bad[1:]
