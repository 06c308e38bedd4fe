"""`pipelib.runtime.place`: what a runner makes goes to the rank's device, results come back on
the CPU. Without a GPU the move is shown on the ``meta`` device (no data, a real device change)."""
import inspect
from collections import namedtuple
from types import MappingProxyType

import torch

from pipelib.results import StepResult
from pipelib.runtime import engine, errors
from pipelib.runtime.device import Device, DeviceSpec, set_current
from pipelib.runtime.place import _cpu_copy, _moved, rng_devices, to_cpu, to_rank_device

Pair = namedtuple("Pair", "x y")


def _nest():
    t, m = torch.ones(2, 3), torch.nn.Linear(3, 2)
    return t, m, {"a": [t, (t, 1.5)], "p": Pair(t, "label"), "n": None}


def test_on_the_cpu_nothing_is_copied():
    t, m, nest = _nest()
    got = to_rank_device((t, m, nest))
    assert got[0] is t and got[1] is m and got[2]["a"][0] is t and got[2]["a"][1][0] is t
    assert got[2]["a"][1][1] == 1.5 and isinstance(got[2]["p"], Pair) and got[2]["p"].y == "label"
    assert got[2]["n"] is None and to_rank_device(m) is m


def test_every_tensor_and_module_moves_to_the_device_given():
    t, m, nest = _nest()
    got = to_rank_device((t, m, nest), torch.device("meta"))
    assert got[0].is_meta and all(p.is_meta for p in m.parameters()) and got[1] is m  # in place, as Module.to
    assert got[2]["a"][0].is_meta and got[2]["a"][1][0].is_meta and got[2]["p"].x.is_meta
    assert not t.is_meta  # the caller's tensor is not changed


def test_a_typed_result_keeps_its_type_and_its_frozen_mappings():
    r = StepResult(loss=torch.tensor(1.0), grads={"w": torch.ones(2)},
                   stats=MappingProxyType({"out": [torch.zeros(1)]}), times=(0.5,))
    got = _moved(r, torch.device("meta"))
    assert isinstance(got, StepResult) and got.loss.is_meta and got.grads["w"].is_meta
    assert isinstance(got.stats, MappingProxyType) and got.stats["out"][0].is_meta and got.times == (0.5,)
    assert to_cpu(r).grads["w"] is r.grads["w"]  # already on the CPU: the same tensors


def test_a_gpu_tensor_comes_back_a_leaf_and_a_parameter_stays_one():
    p = torch.nn.Parameter(torch.ones(3))
    q = _cpu_copy(p)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.is_leaf and q is not p
    y = _cpu_copy(p * 2)  # a non-leaf: its graph does not travel
    assert y.is_leaf and not y.requires_grad and torch.equal(y, torch.full((3,), 2.0))


def test_cluster_run_returns_a_cpu_rank_s_result_as_is():
    set_current(Device(0, 1, DeviceSpec("cpu")))
    try:
        t = torch.ones(2)
        assert engine._run_on_rank(lambda x: x, (t,), {}) is t
        assert rng_devices() == []
    finally:
        set_current(None)


def test_the_traceback_is_still_cut_at_the_user_s_call():
    assert errors._CALL.strip() in inspect.getsource(engine._call)
