"""The strategy cores used as a library: plain torch.distributed, no pipelib Cluster.

What a user of another project would write (issue 20, item 8): two gloo ranks started by
`torch.multiprocessing.spawn`, `init_process_group` on a FileStore, an arbitrary `nn.Module`
(not the book's GPT), and pipelib's `DDP(model, group)`, `ZeRO(model, group, stage,
optimizer=...)`, the tensor-parallel layers, the pipeline executor and ring attention. Each
must equal one process doing the whole batch. Outside a cluster `runtime.device.current()` is
the real device (the CPU under gloo) with the tracer off, so DDP's all-reduces really run
beside backward and a long run holds no growing trace.

One spawn for every group of checks (a spawn costs seconds of imports on two busy cores); each
rank computes the single-process reference itself (same seed) and checks against it, and
returns what the parent asserts as well.
"""
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from spawned import spawn_ranks  # tests/spawned.py

# ----------------------------------------------------------------------------- the harness
GROUPS = ("ddp", "zero", "tp_pipeline_ring")
DEADLINE_S = 240  # for all groups together: a hang fails the tests instead of the suite


def _worker(rank, path):
    import datetime
    import traceback

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(path, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))  # a rank left waiting raises
    out = {}
    try:
        for name in GROUPS:
            try:
                out[name] = globals()[f"_{name}"](rank)
            except Exception:
                out[name] = {"error": traceback.format_exc()}
        torch.save(out, os.path.join(path, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every group of checks on two spawned gloo ranks, in one spawn: {group: [rank 0's
    result, rank 1's]} (a group that raised on a rank holds {"error": traceback} there)."""
    outs = spawn_ranks(_worker, 2, tmp_path_factory.mktemp("library_use"), DEADLINE_S)
    return {name: [o[name] for o in outs] for name in GROUPS}


def _facts(runs, name) -> list:
    errors = [f"rank {r}:\n{f['error']}" for r, f in enumerate(runs[name]) if "error" in f]
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return runs[name]


class Net(nn.Module):
    """Any model: blocks in a ModuleList, a parameter of the root, a frozen layer."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU())
                                    for _ in range(3))
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(16, 5)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        h = self.embed(x) * self.scale
        for block in self.blocks:
            h = h + block(h)
        return self.head(self.frozen(h))


def _batch(step: int, rank: int | None = None):
    """Step `step`'s global batch of 8 rows, or rank's half of it."""
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8, 6, generator=g), torch.randint(5, (8,), generator=g)
    return (x, y) if rank is None else (x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4])


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- DDP
def _ddp(rank):
    from pipelib.data_parallel.ddp import DDP, OverlappedGrads
    from pipelib.runtime.device import current

    dev = current()
    facts = {"kind": dev.kind, "modelled": dev.modelled, "tracing": dev.tracer.enabled}
    ref = Net()
    x, y = _batch(0)
    F.cross_entropy(ref(x), y).backward()
    for cls, comm in ((DDP, "pipelib"), (OverlappedGrads, "gloo")):
        model = Net()
        ddp = cls(model, None, bucket_bytes=1024, comm=comm)
        assert not ddp.stream.simulated
        x, y = _batch(0, rank)
        ddp.backward(F.cross_entropy(ddp(x), y))
        ddp.finish_gradients()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            if p.requires_grad:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
            else:
                assert p.grad is None, name
        ddp.close()
    # overlap: rank 1 starts backward late; rank 0's backward only launches the all-reduces
    model = Net()
    ddp = DDP(model, None, bucket_bytes=1024)
    x, y = _batch(1, rank)
    loss = F.cross_entropy(ddp(x), y)
    dist.barrier()
    if rank == 1:
        time.sleep(1.5)
    t0 = time.perf_counter()
    ddp.backward(loss)
    t1 = time.perf_counter()
    ddp.finish_gradients()
    facts["backward_s"], facts["finish_s"] = t1 - t0, time.perf_counter() - t1
    facts["buckets"] = len(ddp.buckets)
    ddp.close()
    # 200 steps: nothing accumulates (the tracer is off; Python's heap does not grow)
    import tracemalloc

    model = Net()
    ddp = DDP(model, None, bucket_bytes=1024)
    opt = torch.optim.SGD(_trainable(model), lr=0.01)
    for step in range(200):
        if step == 50:
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
        x, y = _batch(step, rank)
        ddp.backward(F.cross_entropy(ddp(x), y))
        ddp.finish_gradients()
        opt.step()
        opt.zero_grad()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    facts["heap_growth"] = sum(s.size_diff for s in after.compare_to(before, "filename"))
    facts["events"] = len(dev.tracer.events)
    ddp.close()
    # with the tracer on, it keeps a bounded window
    dev.tracer.enabled, dev.tracer.limit = True, 64
    ddp = DDP(model, None, bucket_bytes=1024)
    for step in range(40):
        x, y = _batch(step, rank)
        ddp.backward(F.cross_entropy(ddp(x), y))
        ddp.finish_gradients()
        opt.zero_grad()
    facts["events_traced"], facts["dropped"] = len(dev.tracer.events), dev.tracer.dropped
    ddp.close()
    return facts


def test_ddp_without_a_cluster(runs):
    facts = _facts(runs, "ddp")
    for f in facts:
        assert (f["kind"], f["modelled"], f["tracing"]) == ("cpu", False, False)
        assert f["events"] == 0
        assert abs(f["heap_growth"]) < 64 * 1024, f  # 150 steps: no per-step growth
        assert f["events_traced"] <= 64 and f["dropped"] > 0
    # rank 0 did not wait for rank 1 inside backward: it waited in finish_gradients
    assert facts[0]["buckets"] > 1
    assert facts[0]["backward_s"] < 0.75 < facts[0]["finish_s"], facts[0]


# ----------------------------------------------------------------------------- ZeRO
def _reference(optimizer, kw, steps, scheduler):
    model = Net()
    frozen = model.frozen.weight.detach().clone()
    opt = optimizer(_trainable(model), **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) if scheduler else None
    grads = {}
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        opt.step()
        if sched:
            sched.step()
    assert torch.equal(model.frozen.weight, frozen)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, grads


def _zero(rank):
    import copy

    from pipelib.data_parallel.zero import ZeRO

    cases = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, True),
             (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}, False)]
    facts = {}
    for optimizer, kw, scheduler in cases:
        params, grads = _reference(optimizer, kw, 3, scheduler)
        for stage in (1, 2, 3):
            model = Net()
            frozen = model.frozen.weight.detach().clone()
            zero = ZeRO(model, None, stage, optimizer=optimizer, **kw)
            assert isinstance(zero.optimizer, optimizer)
            sched = torch.optim.lr_scheduler.StepLR(zero.optimizer, 1, gamma=0.5) if scheduler else None
            held = []
            hooks = [b.register_forward_pre_hook(lambda *a: held.append(  # noqa: B023 (removed each round)
                sum(u.flat.untyped_storage().nbytes() for u in zero.units))) for b in model.blocks]  # noqa: B023
            for step in range(3):
                x, y = _batch(step, rank)
                F.cross_entropy(zero(x), y).backward()
                if step == 2:  # this rank's pieces of the averaged gradients
                    ranges, shards = zero.shard_ranges(), zero.grad_shards()
                    for name, (a, b) in ranges.items():
                        torch.testing.assert_close(shards[name], grads[name].reshape(-1)[a:b], rtol=1e-5,
                                                   atol=1e-6, msg=name)
                    facts[optimizer.__name__, stage, "sharded"] = sum(b - a for a, b in ranges.values())
                zero.step()
                zero.zero_grad()
                if sched:
                    sched.step()
            for h in hooks:
                h.remove()
            full = zero.full_parameters()
            assert "frozen.weight" not in full and len(zero.optimizer.param_groups[0]["params"]) == len(zero.units)
            for name, p in params.items():
                got = full[name] if name in full else model.get_parameter(name).detach()
                torch.testing.assert_close(got, p, rtol=1e-5, atol=1e-6, msg=f"{optimizer.__name__} {stage} {name}")
            assert torch.equal(model.frozen.weight, frozen) and model.frozen.weight.grad is None
            unit_bytes = {u.name: u.nbytes for u in zero.units}
            facts[optimizer.__name__, stage, "held"] = max(held)
            facts[optimizer.__name__, stage, "units"] = unit_bytes
    # nested in what the device already tracks (a pipeline stage's module, its activations):
    # ZeRO swaps the full trainable parameters for its own bytes and leaves the rest alone;
    # a measurement scope counts one step's bytes as differences of the device's counters
    from pipelib.data_parallel.zero_formulas import zero_comm_bytes
    from pipelib.runtime.device import Device, DeviceSpec, current, set_current

    real, dev = current(), set_current(Device(rank, 2, DeviceSpec("cpu")))
    try:
        model = Net()
        dev.memory.track_module(model)
        dev.memory.add("activations", 1000, "a stage's saved activations")
        before = dict(dev.memory.bytes)
        zero = ZeRO(model, None, 3)
        x, y = _batch(0, rank)
        with dev.measure() as step:
            F.cross_entropy(zero(x), y).backward()
            zero.step()
        facts["nested"] = {"before": before, "after": dict(dev.memory.bytes), "zero": zero.memory(),
                           "frozen": sum(p.numel() * 4 for p in model.frozen.parameters()),
                           "sent": step.bytes_sent, "padded": sum(u.padded for u in zero.units),
                           "formula": zero_comm_bytes(sum(u.padded for u in zero.units), 2, 3, False)}
    finally:
        set_current(real)
    # a rank's checkpoint: the shards and the optimizer's state, loaded into a new wrapper
    saved = ZeRO(Net(), None, 3, optimizer=torch.optim.AdamW, lr=0.01)
    for step in range(2):
        x, y = _batch(step, rank)
        F.cross_entropy(saved(x), y).backward()
        saved.step()
        saved.zero_grad()
    restored = ZeRO(Net(), None, 3, optimizer=torch.optim.AdamW, lr=0.01)
    restored.load_state_dict(copy.deepcopy(saved.state_dict()))  # as torch.save and torch.load would
    for zero in (saved, restored):
        x, y = _batch(2, rank)
        F.cross_entropy(zero(x), y).backward()
        zero.step()
    a, b = saved.full_parameters(), restored.full_parameters()
    facts["restored"] = all(torch.equal(a[k], b[k]) for k in a)
    return facts


def test_zero_without_a_cluster(runs):
    facts = _facts(runs, "zero")
    for f in facts:
        assert f["restored"]
        for opt in ("SGD", "AdamW"):
            units = f[opt, 3, "units"]
            assert sorted(units) == ["blocks.0", "blocks.1", "blocks.2", "embed", "head", "rest"]
            # ZeRO-3 holds one block (and the root's scale) during a block's forward ...
            assert f[opt, 3, "held"] == units["blocks.0"] + units["rest"]
            # ... ZeRO-1 and 2 hold every unit
            assert f[opt, 1, "held"] == f[opt, 2, "held"] == sum(units.values())
        nested = f["nested"]
        before, after, zero = nested["before"], nested["after"], nested["zero"]
        assert after["activations"] == before["activations"] == 1000
        assert after["parameters"] == nested["frozen"] + zero["parameters"] < before["parameters"]
        assert (after["gradients"], after["optimizer"]) == (zero["gradients"], zero["optimizer"])
        assert nested["sent"] == nested["formula"] > 0
    trainable = sum(p.numel() for p in _trainable(Net()))
    assert facts[0]["SGD", 3, "sharded"] + facts[1]["SGD", 3, "sharded"] == trainable


# ----------------------------------------------------------------------------- TP, pipeline, ring
def _tp(rank):
    from pipelib.model import GPT, GPTConfig
    from pipelib.tensor_parallel.apply import apply_tensor_parallel, tp_full_gradients
    from pipelib.tensor_parallel.plan import gpt_tp_plan

    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
    ref, model = GPT(cfg, seed=0), GPT(cfg, seed=0)
    x = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, 1, 1)
    apply_tensor_parallel(model, None, gpt_tp_plan(vocab=False))
    loss = model(x, y)[1]
    loss.backward()
    want = ref(x, y)[1]
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    grads = tp_full_gradients(model, None)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)
    return loss.item()


def _pipeline(rank):
    import copy

    from pipelib.pipeline.executor import execute
    from pipelib.pipeline.schedules.generators import one_f_one_b
    from pipelib.pipeline.stage import Stage

    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(8, 4), torch.randint(3, (8,))
    part = full[:2] if rank == 0 else full[2:]
    mine = copy.deepcopy(part)
    loss = execute(one_f_one_b(2, 4), [Stage(mine, rank, 2)], x if rank == 0 else None,
                   y if rank == 1 else None, F.cross_entropy)
    want = F.cross_entropy(full(x), y)
    want.backward()
    if rank == 1:
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(mine.parameters(), part.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    return None if loss is None else loss.item()


def _ring(rank):
    from pipelib.context_parallel.partition import shard_pieces
    from pipelib.context_parallel.ring import ring_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g, requires_grad=True) for _ in range(3))
    gout = torch.randn(1, 2, 8, 4, generator=g)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(gout)
    pos = torch.cat([p for _, _, p in shard_pieces(8, 2, rank, "zigzag")])
    mine = [t.detach()[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
    got = ring_attention(*mine, None, layout="zigzag", causal=True)
    got.backward(gout[:, :, pos])
    torch.testing.assert_close(got, out.detach()[:, :, pos], rtol=1e-5, atol=1e-6)
    for t, full in zip(mine, (q, k, v)):
        torch.testing.assert_close(t.grad, full.grad[:, :, pos], rtol=1e-5, atol=1e-6)
    return pos.tolist()


def _tp_pipeline_ring(rank):
    return {"tp": _tp(rank), "pipeline": _pipeline(rank), "ring": _ring(rank)}


def test_tensor_parallel_pipeline_and_ring_attention_without_a_cluster(runs):
    facts = _facts(runs, "tp_pipeline_ring")
    assert facts[0]["tp"] == pytest.approx(facts[1]["tp"])
    assert facts[0]["pipeline"] is None and facts[1]["pipeline"] > 0
    assert sorted(facts[0]["ring"] + facts[1]["ring"]) == list(range(8))
