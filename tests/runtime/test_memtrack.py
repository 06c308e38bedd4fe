"""The memory tracker alone: categories, capacity, peak, and saved activations counted by storage."""
import pytest
import torch

from pipelib.runtime.memtrack import MemoryTracker, SimulatedOutOfMemoryError


def test_categories_peak_and_capacity_name_every_value():
    mem = MemoryTracker(rank=5, capacity=3 * 2**20)
    mem.add("parameters", 2**20)
    mem.set("buffers", 2**20)
    mem.add("buffers", -2**20)
    assert mem.total == 2**20 and mem.peak == 2 * 2**20
    mem.reset_peak()
    assert mem.peak == 2**20
    with pytest.raises(ValueError, match=r"unknown memory category 'weights'; use one of \('parameters'"):
        mem.add("weights", 1)
    with pytest.raises(SimulatedOutOfMemoryError,
                       match=r"rank 5: .* allocating the batch: needs 4\.00 MiB but the device holds "
                             r"3\.00 MiB \(parameters 1\.00 MiB, activations 3\.00 MiB\)") as err:
        mem.add("activations", 3 * 2**20, "the batch")
    assert (err.value.rank, err.value.need, err.value.capacity) == (5, 4 * 2**20, 3 * 2**20)
    assert mem.total == 2**20  # the failed allocation is not counted


def test_saved_activations_off_counts_nothing():
    mem = MemoryTracker(track_activations=False)
    x = torch.randn(16, 16, requires_grad=True)
    with mem.saved_activations():
        y = x.exp()
    assert mem.bytes["activations"] == 0 and y.grad_fn is not None


def test_saved_activations_counted_and_freed_parameters_excluded():
    mem = MemoryTracker()
    lin = torch.nn.Linear(100, 50)
    mem.track_module(lin)
    assert mem.bytes["parameters"] == (100 * 50 + 50) * 4
    x = torch.randn(8, 100)
    with mem.saved_activations():
        y = torch.relu(lin(x))  # saves x (input of linear) and the relu output
    assert mem.bytes["activations"] == (8 * 100 + 8 * 50) * 4
    y.sum().backward()
    del y
    assert mem.bytes["activations"] == 0
    mem.update_gradients(lin)
    assert mem.bytes["gradients"] == mem.bytes["parameters"]
    opt = torch.optim.Adam(lin.parameters())
    opt.step()
    mem.update_optimizer(opt)
    assert mem.bytes["optimizer"] == 2 * mem.bytes["parameters"] + 2 * 4  # exp_avg, exp_avg_sq, 2 steps


def test_activations_freed_when_the_graph_dies_even_with_retain_graph():
    """A node that saves its own output (ReLU, sigmoid) must not keep it alive in a cycle.

    Zero-bubble W runs autograd with retain_graph=True; the activations must go when the graph
    does, not when the garbage collector next runs.
    """
    import gc

    mem = MemoryTracker(0)
    w = torch.randn(32, 32, requires_grad=True)
    mem.track_module(torch.nn.ParameterList([torch.nn.Parameter(w.detach())]))
    gc.disable()
    try:
        with mem.saved_activations():
            h = torch.sigmoid(torch.randn(16, 32) @ w)   # sigmoid saves its output
            loss = h.square().sum()
        assert mem.bytes["activations"] > 0
        (g,) = torch.autograd.grad(loss, [w], retain_graph=True)
        del h, loss, g
        assert mem.bytes["activations"] == 0
    finally:
        gc.enable()
