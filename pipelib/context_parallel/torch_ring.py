"""torch's own ring attention beside pipelib's, on CPU: the private template, guarded.

torch 2.13's public `torch.distributed.tensor.experimental.context_parallel(mesh, buffers=...)`
is not usable on CPU: the non-causal forward works, but a causal forward and any backward raise
``NotImplementedError`` (no sharding strategy for ``_scaled_dot_product_flash_attention_for_cpu``:
its ring dispatch is registered for the CUDA kernels, flash, efficient and cuDNN, only), and
buffers that require grad cannot be sharded in place. The template underneath,
``_templated_ring_attention`` and its ``_backward``, is kernel-agnostic and runs on CPU with the
CPU flash kernel (which returns the log-sum-exp the merge needs). It is private API: it may
change in any release, so every call here is guarded and reports "unavailable" rather than
failing the chapter. On ``cuda`` engines `torch_ring_step` raises a NotImplementedError that names
the CUDA kernels' dtype rule (no float64) and the public API to use there.

Load balancing (torch's round-robin, which is zigzag) is switched off, so the shards are
contiguous; by default torch rotates K/V with an all-gather, not point-to-point sends
(`set_rotate_method("alltoall")` shifts them with all-to-alls).

Introduced in chapter 17.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelib.context_parallel.partition import attention_inputs, split_sequence
from pipelib.results import StepResult


def torch_ring_available() -> str | None:
    """None if torch's private ring template can be imported, else why not."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as A

        A._templated_ring_attention, A._templated_ring_attention_backward, A._cp_options  # noqa: B018
    except (ImportError, AttributeError) as e:  # private API: moved or renamed
        return f"torch {torch.__version__}: {type(e).__name__}: {e}"
    return None


def torch_ring_step(seq_len: int, *, batch: int = 1, heads: int = 4, head_dim: int = 8, causal: bool = True,
                    dtype=torch.float64, seed: int = 0) -> StepResult:
    """Forward and backward with torch's private ring template on the world group (contiguous
    shards), in the format of `attention_step` (compare with `check_attention` and a
    contiguous `reference_attention`)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    from pipelib.runtime.device import current

    if current().torch_device.type != "cpu":
        raise NotImplementedError(
            f"torch_ring_step runs torch's private ring template with the CPU flash kernel, on the CPU only "
            f"(this rank is on {current().torch_device}). On CUDA, torch's ring dispatches on its CUDA kernels "
            f"with a log-sum-exp (flash, efficient, cuDNN), which take float16 or bfloat16 (efficient: float32 "
            f"too) and never {dtype}: use the public torch.distributed.tensor.experimental.context_parallel "
            f"with dtype=torch.bfloat16 or torch.float32 there")
    group = dist.group.WORLD
    n, me = dist.get_world_size(), dist.get_rank()
    q, k, v, dout = [split_sequence(t, n, me, "contiguous")
                     for t in attention_inputs(seq_len, batch, heads, head_dim, dtype, seed)]
    aten = torch.ops.aten
    before = A._cp_options.enable_load_balance
    A._cp_options.enable_load_balance = False
    try:
        out, lse, *_ = A._templated_ring_attention(
            group, 2, aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, is_causal=causal)
        dq, dk, dv, *_ = A._templated_ring_attention_backward(
            group, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out=dout,
            grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=causal,
            dropout_p=0.0)
    finally:
        A._cp_options.enable_load_balance = before
    return StepResult(grads={f"d{x}[{me}]": t for x, t in zip("qkv", (dq, dk, dv))}, stats={"out": out})
