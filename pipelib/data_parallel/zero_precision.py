"""What reducing gradients in bf16 costs, measured in one process: the reference for fp32 reduction.

Under bf16 mixed precision each rank's gradients come out of autograd in bf16 (8 significant
bits). The data-parallel average is a sum over N ranks; in a ring reduce-scatter each chunk's
partial sum travels around the ring and every hop adds one rank's contribution and rounds the
result to the dtype the reduction runs in. In bf16 every one of those N - 1 additions rounds to
8 bits, so the error grows with N; in fp32 the sum of N bf16 values is exact or nearly so
(24 bits). That is why bf16 practice reduces and accumulates gradients in fp32 (Megatron's
`main_grad`, FSDP2's `MixedPrecisionPolicy(reduce_dtype=torch.float32)`, pipelib's
`ZeRO(..., reduce_dtype=torch.float32)`), paying 4 bytes per gradient instead of 2.

- `rank_mean_gradients`: one process computes every rank's bf16 gradients on its rows (the
  same model, batches and dtype the engines use) and averages them in fp64: what a ZeRO run with
  fp32 reduction must give, to fp32 rounding;
- `ring_sum_error`: N random bf16 gradients summed hop by hop as a ring does, in bf16 or in fp32,
  against the exact mean: the error's growth with N, for any N, without a cluster.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch


def rank_mean_gradients(recipe, world_size: int, param_dtype=torch.bfloat16) -> dict:
    """{name: fp32 tensor}: the mean over `world_size` ranks of each rank's gradients of its rows
    of step 0's batch of `recipe`, each computed in `param_dtype` as a ZeRO rank computes them in mixed
    precision, averaged exactly (fp64)."""
    from pipelib.recipe import loss_of

    model = recipe.build().to(param_dtype)
    total = {}
    for r in range(world_size):
        x, y = recipe.batch(0, r, world_size)
        if x.is_floating_point():
            x = x.to(param_dtype)
        model.zero_grad(set_to_none=True)
        loss_of(model, x, y).backward()
        for n, p in model.named_parameters():
            total[n] = total.get(n, 0) + p.grad.double()
    return {n: (t / world_size).float() for n, t in total.items()}


def ring_sum_error(world_size: int, dtype=torch.bfloat16, numel: int = 1 << 14, seed: int = 0) -> float:
    """Relative error (max |error| / max |mean|) of the mean of `world_size` random bf16
    gradient vectors when the ring's partial sums are kept in `dtype`: the partial sum starts
    as one rank's gradient and each of the N - 1 hops adds the next rank's, rounding to `dtype`
    (what each element of a ring reduce-scatter goes through), then divides by N."""
    if world_size < 1:
        raise ValueError(f"ring_sum_error: world_size={world_size}; use at least 1 rank")
    g = torch.Generator().manual_seed(seed)
    grads = torch.randn(world_size, numel, generator=g).to(torch.bfloat16)  # each rank's bf16 gradient
    exact = grads.double().mean(0)
    acc = grads[0].to(dtype)
    for r in range(1, world_size):
        acc = (acc + grads[r].to(dtype)).to(dtype)
    mean = (acc / world_size).to(dtype)
    return ((mean.double() - exact).abs().max() / exact.abs().max()).item()
