"""The other trade: offload activations to host memory instead of recomputing them.

Recomputation pays FLOPs to keep fewer bytes; offloading pays bytes over the host link
(PCIe, or NVLink-C2C on a Grace Hopper) and keeps them in host memory instead
(`torch.autograd.graph.save_on_cpu`, a saved-tensor hook pair, is torch's built-in; Megatron
Core and Transformer Engine offload chosen layers' activations with copies on side streams).
Per block, with L the bytes it keeps, F its forward's FLOPs, beta the host link's bandwidth
one way and R the device's achieved FLOP/s (peak x `mfu`):

- full recomputation adds one forward per block, F / R seconds, all of it compute on the
  critical path, and keeps only the block's input;
- offloading copies L bytes out during the forward, overlapped with the next block's forward
  (F / R), and back during backward, prefetched one block ahead, overlapped with the following
  block's backward (2 F / R; the block after it in the forward runs its backward just before
  it): it adds max(0, L/beta - F/R) + max(0, L/beta - 2F/R) seconds.

So offloading costs less time than recomputing exactly when L / beta < 2 F / R, that is when
the block does more than R / (2 beta) FLOPs per byte it keeps (`OffloadTrade.offload_wins`).
A wide layer (F / L grows with h) on a slow device or a fast host link offloads for free; a
narrow one, or a fast GPU behind PCIe, recomputes. Not modelled: host memory capacity (n L per
micro-batch in flight), the link shared with other traffic (data loading, DDP over PCIe), and
pinned-memory limits. Pure arithmetic. Chapter 14.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipelib.memory import gpt_forward_flops
from pipelib.recompute.formulas import layer_bytes


@dataclass(frozen=True)
class OffloadTrade:
    """One block's two trades on one device and host link (module docstring), in seconds."""

    layer_bytes: int            # L: what the block keeps for backward
    input_bytes: int            # I: what full recomputation keeps instead
    forward_flops: int          # F: the block's forward
    forward_seconds: float      # F / R
    recompute_seconds: float    # full recomputation's extra time: one more forward
    copy_seconds: float         # L / beta: one way over the host link
    offload_seconds: float      # what the copies add, overlapped with forward and backward
    flops_per_byte: float       # F / L
    break_even: float           # R / (2 beta): offloading wins above this F / L

    @property
    def offload_wins(self) -> bool:
        return self.offload_seconds < self.recompute_seconds


def offload_vs_recompute(cfg, batch: int, seq: int, profile, host_beta: float, *,
                         itemsize: int = 2, mask_bytes: int | None = 1, mfu: float = 1.0) -> OffloadTrade:
    """Offloading one block's activations against recomputing it, for `cfg` (a `GPTConfig` or a
    `pipelib.recompute.formulas.Shape`, fused attention or not) on `profile` (a
    `pipelib.costmodel.DeviceProfile`; its FLOP/s x `mfu`) with a host link of `host_beta`
    bytes per second one way."""
    if not 0 < mfu <= 1:
        raise ValueError(f"offload_vs_recompute: mfu={mfu}; use a share of peak in (0, 1]")
    if host_beta <= 0:
        raise ValueError(f"offload_vs_recompute: host_beta={host_beta}; bytes per second, > 0")
    B, T, C = batch, seq, cfg.n_embd
    L = layer_bytes(cfg, B, T, itemsize, mask_bytes)
    head = gpt_forward_flops(replace(cfg, n_layer=0), B, T)  # the tied head alone
    F = (gpt_forward_flops(cfg, B, T) - head) // cfg.n_layer  # one block's forward
    rate = profile.flops * mfu
    fwd, copy = F / rate, L / host_beta
    exposed = max(0.0, copy - fwd) + max(0.0, copy - 2 * fwd)
    return OffloadTrade(L, itemsize * B * T * C, F, fwd, fwd, copy, exposed, F / L, rate / (2 * host_beta))
