"""Where a rank's tensors live: `to_rank_device` puts what a runner makes on the rank's device,
`to_cpu` brings what it returns back to the notebook's side.

    model, x, y = to_rank_device((build(config), *batch(config, step)))   # the GPU under ``cuda``

Every runner and strategy core calls `to_rank_device` on its models and batches, so the same
code runs on ``sim``, ``cpu`` and ``cuda`` engines: the device is
`pipelib.runtime.device.current().torch_device`, the CPU everywhere but under ``cuda``. Data are
made first on the CPU with private generators (identical numbers on every device and every
rank), then moved: a seed means one batch, whatever the device. Tensor factories inside the
runtime code take the device of the tensor they serve (``device=t.device``, ``empty_like``);
tests/test_device_factories.py scans the package for ones that do not.

`to_cpu` is what `Cluster.run` applies to a rank's result before it is pickled
(`pipelib.runtime.engine`): the notebook compares with CPU references and does not open a CUDA
context of its own to unpickle GPU tensors.

Introduced in chapter 04 with the devices; every chapter with a cluster uses it.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from types import MappingProxyType
from typing import Any, TypeVar

from pipelib.runtime.device import current

T = TypeVar("T")


def to_rank_device(obj: T, device=None) -> T:
    """`obj` with every tensor and module in it on `device` (default: this rank's device).

    Tensors, `nn.Module`s (moved in place, as `Module.to` does, and returned), and tuples, lists,
    dicts and frozen dataclasses of them, nested (torch's pytree); anything else is returned
    unchanged. A tensor already there is returned as is (no copy)."""
    return _moved(obj, device or current().torch_device)


def to_cpu(obj: T) -> T:
    """`obj` with every tensor in it on the CPU: what a rank returns to the notebook (a GPU
    tensor's copy is detached: its graph does not travel)."""
    return _moved(obj, "cpu", returned=True)


def _moved(obj: Any, device, returned: bool = False) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    def leaf(x):
        if returned and isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return _cpu_copy(x)
        if isinstance(x, (torch.Tensor, torch.nn.Module)):
            return x.to(device)
        if is_dataclass(x) and not isinstance(x, type):  # a typed result (StepResult, ...)
            changed = {f.name: _moved(getattr(x, f.name), device, returned) for f in fields(x) if f.init}
            return replace(x, **changed) if changed else x
        if isinstance(x, MappingProxyType):
            return MappingProxyType(_moved(dict(x), device, returned))
        return x

    return tree_map(leaf, obj)


def _cpu_copy(x):
    """A GPU tensor's CPU copy that pickles like the original: a leaf (a parameter stays one)."""
    import torch

    y = x.detach().cpu()
    if isinstance(x, torch.nn.Parameter):
        return torch.nn.Parameter(y, requires_grad=x.requires_grad)
    return y.requires_grad_(x.requires_grad and x.is_leaf)


def rng_devices() -> list:
    """The GPUs whose generators `torch.random.fork_rng` must save around a `torch.manual_seed`
    (dropout masks): the rank's GPU under ``cuda``, none on the CPU. `manual_seed` reseeds CUDA's
    generators too, and `fork_rng(devices=[])` restores only the CPU's, which would leave the
    GPU's reseeded behind the caller's back."""
    dev = current().torch_device
    return [dev] if dev.type == "cuda" else []
