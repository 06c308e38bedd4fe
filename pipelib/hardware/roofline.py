"""The roofline (Williams, Waterman and Patterson 2009), and one measured operation on it.

An op of intensity I = FLOPs / byte can at best reach min(peak, bandwidth * I) FLOP/s. Here
the roof is built from *measured* peak and bandwidth (`Roofline.from_ops`, the best of
`pipelib.hardware.compute` and `pipelib.hardware.bandwidth`), or from a datasheet
(`Roofline.from_profile`, the profiles of `pipelib.costmodel`). A `MeasuredOp` counts FLOPs as
2 m k n for a matmul and bytes as the *compulsory* traffic, each input read once and each
output written once (STREAM's rule, McCalpin 1995).

Pure: no torch. Introduced in chapter 01.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.costmodel import PROFILES


@dataclass(frozen=True)
class MeasuredOp:
    """One measured operation: its FLOPs, its compulsory bytes and its best time."""

    name: str
    flops: float
    nbytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte of memory traffic."""
        return self.flops / self.nbytes

    @property
    def achieved(self) -> float:
        """FLOP/s reached."""
        return self.flops / self.seconds

    @property
    def bandwidth(self) -> float:
        """Bytes per second moved."""
        return self.nbytes / self.seconds


@dataclass(frozen=True)
class Roofline:
    """Peak FLOP/s and memory bandwidth (bytes/s): the two roofs of Williams et al. 2009."""

    name: str
    peak: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """Intensity (FLOP/byte) where the two roofs meet: below it an op is memory-bound."""
        return self.peak / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The most FLOP/s an op of this intensity can reach: min(peak, bandwidth * I)."""
        return min(self.peak, self.bandwidth * intensity)

    def time(self, flops: float, nbytes: float) -> float:
        """Least time for `flops` over `nbytes`: max(flops / peak, bytes / bandwidth)."""
        return max(flops / self.peak, nbytes / self.bandwidth)

    def bound(self, intensity: float) -> str:
        return "memory-bound" if intensity < self.ridge else "compute-bound"

    @classmethod
    def from_ops(cls, name: str, compute_ops, memory_ops) -> Roofline:
        """The measured roofline: best FLOP/s of `compute_ops`, best bytes/s of `memory_ops`."""
        return cls(name, max(o.achieved for o in compute_ops), max(o.bandwidth for o in memory_ops))

    @classmethod
    def from_profile(cls, name: str) -> Roofline:
        """A published roofline from `costmodel.PROFILES` (e.g. "h100": BF16 dense, HBM3)."""
        p = PROFILES[name]
        return cls(f"{name} (published)", p.flops, p.mem_bandwidth)
