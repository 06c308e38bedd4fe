"""Mixed-precision Adam in one process: 16-bit parameters and gradients, fp32 master weights.

Micikevicius et al. 2018: the forward and backward run in 16-bit, but small updates vanish when
added to 16-bit weights (bf16 keeps 8 significant bits: 1 + 2^-9 rounds to 1), so the optimizer
keeps an fp32 copy of every parameter, adds the update there and copies the result back to
16-bit. Per parameter: 2 (16-bit weight) + 2 (16-bit gradient) + 4 (fp32 master) + 4 + 4 (Adam's
two moments) = 16 bytes: ZeRO's K = 12 (Rajbhandari et al. 2020). bf16 has fp32's exponent
range, so no loss scaling is needed; fp16 (5 exponent bits) flushes gradients below about 6e-8 to
zero and needs the loss scaled up before backward and the gradients scaled down before the step.

`MasterWeightAdam` is the single-process reference for `pipelib.data_parallel.zero.ZeRO` with
``mixed_precision=True``, which keeps only its own shard of the master weights.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch


class MasterWeightAdam:
    """torch's Adam on fp32 master copies of a model whose parameters become `param_dtype`."""

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, param_dtype=torch.bfloat16, **adam_kw):
        self.model = model
        self.named = list(model.named_parameters())
        self.masters = [p.detach().float().clone() for _, p in self.named]
        model.to(param_dtype)
        self.optimizer = torch.optim.Adam(self.masters, lr=lr, **adam_kw)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients dropped (`set_to_none` is accepted for torch's signature; they are always None)."""
        for _, p in self.named:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for m, (_, p) in zip(self.masters, self.named):
            m.grad = None if p.grad is None else p.grad.float()
        self.optimizer.step()
        for m, (_, p) in zip(self.masters, self.named):
            m.grad = None
            p.copy_(m)

    def master_parameters(self) -> dict:
        return {n: m.clone() for (n, _), m in zip(self.named, self.masters)}
