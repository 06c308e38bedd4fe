"""The bf16 communication hook: half the bytes, gradients within bf16's rounding of fp32's, and
the same as torch's DDP with default_hooks.bf16_compress_hook (same gradients, same bytes)."""
import contextlib

import pytest
import torch

from pipelib.data_parallel.buckets import plan_buckets, ring_bytes_per_rank
from pipelib.data_parallel.runner import run_ddp
from pipelib.model import GPTConfig

ODD = GPTConfig(vocab_size=33, block_size=8, n_layer=2, n_head=3, n_embd=15)   # 6435 parameters
BF16_REL = 2.0**-7  # two roundings to bf16's 8 significant bits (the cast, then the sum)


def _close_in_bf16(a, b):
    """|a - b| within bf16's rounding of the larger gradient of the tensor."""
    return bool(((a - b).abs() <= BF16_REL * torch.maximum(a.abs(), b.abs()).max() + 1e-12).all())


@pytest.mark.cluster
@pytest.mark.parametrize("n", [2, 4])
def test_bf16_hook_halves_the_bytes_on_the_trace(cluster4, n):
    steps = 1   # the gradients of one all-reduce (after an optimizer step, Adam would amplify the rounding)
    kw = dict(ranks=n, steps=steps, batch=8, bucket_bytes=2048, accumulate=2)
    fp32 = run_ddp(cluster4, "no_sync", ODD, **kw)
    trace32 = cluster4.trace()
    bf16 = run_ddp(cluster4, "bf16", ODD, **kw)
    trace16 = cluster4.trace()
    sizes = [(k, v.numel()) for k, v in fp32[0].params.items()]
    buckets = plan_buckets(sizes, 2048)
    for r in range(n):   # the ring's exact bytes at 2 bytes per element: half of fp32's when N divides
        assert trace16.bytes_sent(r) == steps * sum(ring_bytes_per_rank(b.numel, n, 2, r) for b in buckets)
        assert trace32.bytes_sent(r) == steps * sum(ring_bytes_per_rank(b.numel, n, 4, r) for b in buckets)
        assert 2 * trace16.bytes_sent(r) == trace32.bytes_sent(r)   # exactly half
    worst = 0.0
    for a, b in zip(bf16[:n], fp32[:n]):
        for k in a.grads:
            assert _close_in_bf16(a.grads[k], b.grads[k]), k
            worst = max(worst, (a.grads[k] - b.grads[k]).abs().max().item())
    assert worst > 0   # the hook did round: not fp32's gradients


@contextlib.contextmanager
def _spy_all_reduce(seen):
    """Record (dtype, bytes) of every tensor handed to torch.distributed.all_reduce."""
    import torch.distributed as dist

    real = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        seen.append((str(tensor.dtype), tensor.numel() * tensor.element_size()))
        return real(tensor, *args, **kwargs)
    dist.all_reduce = spy
    try:
        yield seen
    finally:
        dist.all_reduce = real


def _one_step(kind, config, batch, bucket_bytes):
    import torch.distributed as dist

    from pipelib.data_parallel.steps import DDP_STEPS
    from pipelib.recipe import build_model, global_batch, loss_of

    n, r = dist.get_world_size(), dist.get_rank()
    model = build_model(config, 0)
    if kind == "torch":  # torch's fp32 all-reduce through its Python allreduce_hook, for the spy to see it
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        from pipelib.data_parallel.steps import TorchDDP

        wrapped = TorchDDP(model, None, bucket_bytes=bucket_bytes, comm_hook=allreduce_hook)
    else:
        wrapped = DDP_STEPS[kind].wrap(model, None, comm="gloo", bucket_bytes=bucket_bytes)
    x, y = global_batch(config, batch * n, 0, 0)
    loss = loss_of(wrapped, x[r * batch:(r + 1) * batch], y[r * batch:(r + 1) * batch])
    seen = []
    with _spy_all_reduce(seen):
        wrapped.backward(loss)
        wrapped.finish_gradients()
    wrapped.close()
    return {"grads": {k: p.grad.detach().clone() for k, p in model.named_parameters()}, "wire": seen}


@pytest.mark.cluster
def test_bf16_hook_equals_torchs_bf16_compress_hook(cpu2):
    """Real processes, gloo: ours and torch's DDP (bf16_compress_hook) hand all_reduce bf16
    tensors of 2 psi bytes in all, half of what both send in fp32, and get the same gradients
    within bf16's rounding; both differ from fp32's by that rounding."""
    runs = {k: cpu2.run(_one_step, k, ODD, 4, 2048) for k in ("bf16", "torch_bf16", "no_sync", "torch")}
    psi = sum(g.numel() for g in runs["torch"][0]["grads"].values())
    for r in range(2):
        wire = {k: runs[k][r]["wire"] for k in runs}
        assert {d for d, _ in wire["bf16"]} == {d for d, _ in wire["torch_bf16"]} == {"torch.bfloat16"}
        assert {d for d, _ in wire["no_sync"]} == {d for d, _ in wire["torch"]} == {"torch.float32"}
        total = {k: sum(b for _, b in w) for k, w in wire.items()}
        assert total["bf16"] == total["torch_bf16"] == 2 * psi
        assert total["no_sync"] == total["torch"] == 4 * psi
        for k, g in runs["bf16"][r]["grads"].items():
            theirs = runs["torch_bf16"][r]["grads"][k]
            assert _close_in_bf16(g, theirs), k
            assert _close_in_bf16(g, runs["torch"][r]["grads"][k]), k
            torch.testing.assert_close(runs["no_sync"][r]["grads"][k], runs["torch"][r]["grads"][k],
                                       rtol=1e-5, atol=1e-6)
    diff = max((runs["torch_bf16"][0]["grads"][k] - runs["torch"][0]["grads"][k]).abs().max().item()
               for k in runs["torch"][0]["grads"])
    assert diff > 0   # torch's hook rounds too
