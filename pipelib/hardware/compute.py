"""Compute measured: matmul, softmax and attention, as `MeasuredOp`s for the roofline.

A matmul of (m, k) @ (k, n) does 2 m k n FLOPs (`costmodel.matmul_flops`); bytes are the
compulsory traffic (inputs read once, output written once). A written-out attention also
writes and reads its T x T score matrix, and that is counted: that traffic is what
FlashAttention (Dao et al. 2022) removes. Each is timed by `best_time` on `threads` threads.

Introduced in chapter 01.
"""
from __future__ import annotations

import torch

from pipelib.costmodel import matmul_flops
from pipelib.hardware.machine import best_time, num_threads
from pipelib.hardware.roofline import MeasuredOp

SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide (exp counted as one FLOP)


def measure_matmul(n: int, device="cpu", dtype=torch.float32, threads: int | None = None,
                   repeats: int = 5) -> MeasuredOp:
    """(n, n) @ (n, n): 2 n^3 FLOPs over 3 n^2 elements (A and B read, C written)."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    c = torch.empty(n, n, device=device, dtype=dtype)
    with num_threads(threads):
        t = best_time(lambda: torch.matmul(a, b, out=c), device, repeats)
    return MeasuredOp(f"matmul {n}", matmul_flops(n, n, n), 3 * n * n * a.element_size(), t)


def measure_softmax(rows: int, cols: int, device="cpu", threads: int | None = None,
                    repeats: int = 5) -> MeasuredOp:
    """Row softmax: about 5 FLOPs per element over 2 words (read x, write y)."""
    x = torch.randn(rows, cols, device=device)
    with num_threads(threads):
        t = best_time(lambda: torch.softmax(x, dim=-1), device, repeats)
    n = rows * cols
    return MeasuredOp(f"softmax {rows}x{cols}", SOFTMAX_FLOPS_PER_ELEMENT * n, 2 * 4 * n, t)


def measure_attention(heads: int, seq: int, head_size: int, written_out: bool = True,
                      device="cpu", threads: int | None = None, repeats: int = 5) -> MeasuredOp:
    """softmax(q k^T / sqrt(d)) v over `heads` (batch x heads) independent heads, fp32.

    FLOPs: 4 h T^2 d for the two products, 5 h T^2 for the softmax. Bytes: q, k, v read and y
    written (4 h T d words); written out (as `pipelib.model` does) the scores are also written,
    read and written by the softmax, and read again by the second product (4 h T^2 words more).
    A fused kernel (F.scaled_dot_product_attention) keeps them out of memory.
    """
    q, k, v = (torch.randn(heads, seq, head_size, device=device) for _ in range(3))
    scale = head_size ** -0.5

    def math_attention():
        return torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v

    def fused():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    with num_threads(threads):
        t = best_time(math_attention if written_out else fused, device, repeats)
    flops = 4 * heads * seq * seq * head_size + SOFTMAX_FLOPS_PER_ELEMENT * heads * seq * seq
    words = 4 * heads * seq * head_size + (4 * heads * seq * seq if written_out else 0)
    name = f"attention T={seq} " + ("written out" if written_out else "fused (SDPA)")
    return MeasuredOp(name, flops, 4 * words, t)
