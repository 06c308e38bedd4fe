"""The spine and the strategy cores on a real GPU, with NCCL: skipped where there is no CUDA.

Run on a GPU machine (one GPU is enough: a one-rank NCCL world): the device outside a cluster is
the rank's GPU, the mesh and torch's DeviceMesh are on cuda, and the trainer, DDP and ZeRO keep
every tensor on the GPU and equal one process."""
import os
import socket

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.fixture(scope="module")
def nccl():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    from pipelib.runtime.device import set_current

    set_current(None)
    yield
    set_current(None)
    dist.destroy_process_group()


def test_the_device_outside_a_cluster_is_the_gpu(nccl):
    from pipelib.runtime.device import current
    from pipelib.runtime.mesh import Mesh
    from pipelib.topology import Topology

    dev = current()
    assert dev.kind == "cuda" and dev.torch_device.type == "cuda" and not dev.modelled
    mesh = Mesh(Topology(dp=1))
    assert mesh.to_device_mesh().device_type == "cuda"


def test_trainer_on_cuda_equals_one_process_on_cpu(nccl):
    from pipelib.model import GPTConfig
    from pipelib.plan import Plan
    from pipelib.recipe import Recipe
    from pipelib.results import check_against_reference
    from pipelib.trainer import train_plan

    recipe = Recipe(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16), batch_size=4,
                    steps=3, dtype=torch.float64)
    result = train_plan(recipe, Plan())
    check_against_reference([result], recipe.reference(), rtol=1e-9, atol=1e-10)


def test_ddp_on_cuda_keeps_gradients_on_the_gpu(nccl):
    from pipelib.data_parallel.ddp import BucketedGrads

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()
    ddp = BucketedGrads(model, None, bucket_bytes=256, comm="gloo")
    x = torch.randn(4, 8, device="cuda")
    ddp.backward(model(x).square().mean())
    ddp.finish_gradients()
    ddp.close()
    assert all(p.grad.is_cuda for p in model.parameters())


@pytest.mark.parametrize("stage, options", [(1, {}), (2, {}), (3, {}), (3, {"prefetch": True}),
                                            (3, {"reshard_after_forward": False})])
def test_zero_on_cuda_keeps_its_buffers_on_the_gpu_and_equals_adam(nccl, stage, options):
    from pipelib.data_parallel.zero import ZeRO

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()
    ref.load_state_dict(model.state_dict())
    zero = ZeRO(model, None, stage, optimizer=torch.optim.Adam, lr=1e-2, **options)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = torch.randn(4, 8, device="cuda")
    for _ in range(2):
        zero(x).square().mean().backward()
        zero.step()
        zero.zero_grad()
        ref(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    buffers = [t for u in zero.units for t in (u.flat, u.master, getattr(u, "gflat", None), getattr(u, "gshard", None))
               if isinstance(t, torch.Tensor)]
    assert buffers and all(t.is_cuda for t in buffers), [t.device for t in buffers]
    full = zero.full_parameters()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(full[name].cuda(), p.detach(), rtol=1e-5, atol=1e-6)


def test_ddp_bf16_hook_on_cuda_rounds_each_gradient_to_bf16(nccl):
    from pipelib.data_parallel.ddp import BucketedGrads

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()
    x = torch.randn(4, 8, device="cuda")
    model(x).square().mean().backward()
    want = [p.grad.bfloat16().float() for p in model.parameters()]  # one rank: the sum is the cast
    model.zero_grad(set_to_none=True)
    ddp = BucketedGrads(model, None, bucket_bytes=256, comm="gloo", comm_hook="bf16")
    ddp.backward(model(x).square().mean())
    ddp.finish_gradients()
    ddp.close()
    for p, w in zip(model.parameters(), want):
        assert p.grad.is_cuda and torch.equal(p.grad, w)


def test_parallelize_with_zero_on_cuda(nccl):
    from pipelib.model import GPTConfig
    from pipelib.plan import Plan
    from pipelib.recipe import Recipe
    from pipelib.results import check_against_reference
    from pipelib.trainer import train_plan

    recipe = Recipe(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16), batch_size=4, steps=3)
    result = train_plan(recipe, Plan(data="zero1"))
    check_against_reference([result], recipe.reference(), rtol=1e-4, atol=1e-5)


def test_compute_on_cuda_is_timed_by_events_on_its_stream(nccl):
    """The op's own GPU time (CUDA events on the current stream), not what the stream ran before
    it, and no device-wide synchronize (which would wait on NCCL's streams too)."""
    import time

    from pipelib.runtime.device import current
    from pipelib.trace import Kind

    dev = current()
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for _ in range(20):  # queued before the op: about 20 x 2 ms the op must not be charged
        a @ a
    dev.tracer.clear()
    dev.tracer.enabled = True  # off outside a cluster: measurement is optional
    try:
        t0 = time.perf_counter()
        with dev.compute("matmul"):
            b = a @ a
        wall = time.perf_counter() - t0  # includes the queued work the op waited behind
    finally:
        dev.tracer.enabled = False
    (ev,) = [e for e in dev.tracer.events if e.kind == Kind.COMPUTE]
    op = ev.end - ev.start
    one = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one[0].record()
    a @ a
    one[1].record()
    one[1].synchronize()
    alone = one[0].elapsed_time(one[1]) / 1e3
    assert b.is_cuda and 0 < op < wall / 3, (op, wall)  # not the queue in front of it
    assert 0.5 * alone < op < 2 * alone, (op, alone)    # about one product's GPU time
