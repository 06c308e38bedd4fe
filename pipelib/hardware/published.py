"""Published figures of GPUs, links, memory and drives, each with its source, and the table
that sets this machine's measurements beside them.

Decimal prefixes (`fmt`), as datasheets use. Pure: no torch. Introduced in chapter 01.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.costmodel import LINKS, PROFILES


@dataclass(frozen=True)
class Published:
    """A figure from a datasheet or standard. value in base units (FLOP/s, bytes/s, bytes)."""

    item: str
    quantity: str
    value: float
    unit: str
    source: str


_H, _A = PROFILES["h100"], PROFILES["a100"]
PUBLISHED = (
    Published("H100 SXM", "compute, BF16 dense", _H.flops, "FLOP/s", _H.source),
    Published("H100 SXM", "compute, FP32 (no tensor cores)", 67e12, "FLOP/s",
              "NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TFLOPS (SXM)"),
    Published("H100 SXM", "memory bandwidth (HBM3)", _H.mem_bandwidth, "B/s", _H.source),
    Published("H100 SXM", "memory capacity", 80e9, "B", _H.source),
    Published("A100 SXM 80GB", "compute, BF16 dense", _A.flops, "FLOP/s", _A.source),
    Published("A100 SXM 80GB", "compute, FP32 (no tensor cores)", 19.5e12, "FLOP/s",
              "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS"),
    Published("A100 SXM 80GB", "memory bandwidth (HBM2e)", _A.mem_bandwidth, "B/s", _A.source),
    Published("A100 SXM 80GB", "memory capacity", 80e9, "B", _A.source),
    Published("NVLink 4 (H100)", "GPU-to-GPU, both directions", 2 * LINKS["nvlink4"].beta, "B/s",
              "NVIDIA H100 datasheet: NVLink 900 GB/s (18 links, total of both directions)"),
    Published("NVLink 3 (A100)", "GPU-to-GPU, both directions", 2 * LINKS["nvlink3"].beta, "B/s",
              "NVIDIA A100 datasheet: NVLink 600 GB/s"),
    Published("PCIe 5.0 x16", "CPU-to-GPU, per direction", 64e9, "B/s",
              "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s x 16 lanes, 128b/130b"),
    Published("InfiniBand NDR", "node-to-node, per port, per direction", LINKS["ib-ndr"].beta,
              "B/s", "NVIDIA ConnectX-7 / Quantum-2 NDR datasheets: 400 Gb/s per port"),
    Published("Ethernet 10GBASE-T", "LAN, per direction", 10e9 / 8, "B/s",
              "IEEE 802.3an-2006: 10 Gb/s"),
    Published("DDR5-4800", "CPU memory, per channel", 4800e6 * 8, "B/s",
              "JEDEC JESD79-5 DDR5: 4800 MT/s x 8 bytes per 64-bit channel"),
    Published("NVMe SSD (PCIe 4.0 x4)", "sequential read", 7.45e9, "B/s",
              "Samsung 990 PRO datasheet: up to 7,450 MB/s sequential read"),
)


def fmt(value: float, unit: str) -> str:
    """1.23e12, 'FLOP/s' -> '1.23 TFLOP/s' (decimal prefixes, as datasheets use)."""
    for p, s in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= p:
            return f"{value / p:.3g} {s}{unit}"
    return f"{value:.3g} {unit}"


def comparison_markdown(measured: dict, machine: str) -> str:
    """A markdown table: rows measured here (quantity -> (value, unit)), then PUBLISHED."""
    rows = ["| machine | quantity | value | source |", "|---|---|---|---|"]
    for quantity, (value, unit) in measured.items():
        rows.append(f"| **this machine** | {quantity} | **{fmt(value, unit)}** | measured above on {machine} |")
    for p in PUBLISHED:
        rows.append(f"| {p.item} | {p.quantity} | {fmt(p.value, p.unit)} | {p.source} |")
    return "\n".join(rows)
