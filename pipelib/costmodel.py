"""Device profiles and the alpha-beta link model: how long modelled work takes.

A simulated device (`device="sim"`) does real math on the CPU but takes its *time* from a
profile: a compute op lasts max(flops / peak FLOP/s, bytes / memory bandwidth) (the roofline,
Williams et al. 2009), a message lasts alpha + bytes / beta (Hockney 1994): on the profile's
`link`, or with a node map (`with_nodes`: GPUs per node, a slower `inter_node` link) on the link
its two ranks share (chapter 15's two-speed nodes). The presets hold
published figures; `toy-gpu`, the default, is a small round-numbered teaching device, sized so
the book's tiny models take milliseconds on a laptop.

toy-gpu's *ratios* are not a real accelerator's, and nothing claims they are: its ridge point
(`ridge_point`) is 1 FLOP/B where an H100's is about 295, and its compute : link ratio
(`flops_per_link_byte`) is 10 FLOP/B where an H100's is about 2,200 over NVLink and 19,800 over
PCIe. Making them real would make the tiny models' ops memory- and message-bound in ways no real
model is. What toy-gpu keeps is the *shape* of each law: the roofline's max of two times, and
the link's alpha + n / beta with a latency that dominates small messages. Where a chapter's
conclusion depends on how long a message takes against an op, it sets the op times itself
(`pipelib.pipeline.simulate.Costs`) and says what ratio it uses; chapter 12 compares it with an
H100's.

Introduced in chapter 04; the alpha-beta model is fitted to measurements in chapter 05.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType

from pipelib.checks import check_ints

KiB, MiB, GiB = 1024, 1024**2, 1024**3


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Link:
    """A point-to-point link: a message of n bytes takes alpha + n / beta seconds."""

    name: str
    alpha: float  # latency, seconds
    beta: float   # bandwidth, bytes per second (one direction)

    def __post_init__(self):
        # beta = inf is an ideal link (chapter 11: a message costs its latency alone); NaN is refused
        if not (_finite(self.alpha) and self.alpha >= 0 and self.beta == self.beta and self.beta > 0):
            raise ValueError(f"Link {self.name!r}: alpha={self.alpha!r}, beta={self.beta!r}; pass a finite latency "
                             f"alpha >= 0 seconds and a bandwidth beta > 0 bytes per second (inf: an ideal link)")

    def time(self, nbytes: int) -> float:
        if not (nbytes >= 0 and nbytes != float("inf")):  # NaN fails too
            raise ValueError(f"Link {self.name!r}: nbytes={nbytes!r}; pass a finite message size >= 0 bytes")
        return self.alpha + nbytes / self.beta


@dataclass(frozen=True)
class DeviceProfile:
    """What a simulated GPU can do. Figures are peak, per direction, dense."""

    name: str
    flops: float          # peak FLOP/s for the dtype the book trains in
    mem_bandwidth: float  # bytes per second to device memory
    memory: int           # capacity in bytes
    link: Link            # link to the neighbouring device (inside a node)
    source: str = ""
    # nodes (chapter 15): ranks r // gpus_per_node share a node and talk on `link`; two ranks on
    # different nodes talk on `inter_node`. None (the default): every pair on `link`, one speed
    gpus_per_node: int | None = None
    inter_node: Link | None = None

    def __post_init__(self):
        bad = {k: getattr(self, k) for k in ("flops", "mem_bandwidth", "memory")
               if not (_finite(getattr(self, k)) and getattr(self, k) > 0)}
        if bad:
            raise ValueError(f"DeviceProfile {self.name!r}: {bad}; pass finite numbers > 0 (FLOP/s, bytes per "
                             f"second, bytes of memory)")
        nodes = (self.gpus_per_node, self.inter_node)
        if (nodes[0] is None) != (nodes[1] is None) or not (
                nodes[0] is None or (isinstance(nodes[0], int) and not isinstance(nodes[0], bool) and nodes[0] >= 1
                                     and isinstance(nodes[1], Link))):
            raise ValueError(f"DeviceProfile {self.name!r}: gpus_per_node={nodes[0]!r}, inter_node={nodes[1]!r}; "
                             f"pass both (a positive integer and a Link between nodes) or neither (one link)")

    def link_between(self, src: int, dst: int) -> Link:
        """The link global ranks `src` and `dst` talk on: `link` inside a node (or on a profile
        without nodes), `inter_node` between nodes (ranks numbered node by node)."""
        if self.gpus_per_node is None or src // self.gpus_per_node == dst // self.gpus_per_node:
            return self.link
        return self.inter_node

    def with_nodes(self, gpus_per_node: int, inter_node: Link) -> DeviceProfile:
        """This GPU in nodes of `gpus_per_node`, joined by `inter_node` (chapter 15's two-speed
        nodes: the simulated clock charges each message the link of its pair of ranks)."""
        return replace(self, gpus_per_node=gpus_per_node, inter_node=inter_node,
                       name=f"{self.name} nodes of {gpus_per_node}")

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where compute and memory time are equal."""
        return self.flops / self.mem_bandwidth

    @property
    def flops_per_link_byte(self) -> float:
        """FLOPs the device computes in the time its link moves one byte: how much compute a
        message must be hidden behind (the link's ridge point)."""
        return self.flops / self.link.beta

    def compute_time(self, flops: float = 0.0, nbytes: float = 0.0) -> float:
        """Roofline time of an op doing `flops` FLOPs over `nbytes` bytes of memory traffic."""
        if not (flops >= 0 and nbytes >= 0) or flops == float("inf") or nbytes == float("inf"):  # NaN fails too
            raise ValueError(f"flops and nbytes must be finite and >= 0, got flops={flops}, nbytes={nbytes}")
        return max(flops / self.flops, nbytes / self.mem_bandwidth)

    def message_time(self, nbytes: int, src: int | None = None, dst: int | None = None) -> float:
        """alpha + nbytes / beta of the link between global ranks `src` and `dst` (`link_between`);
        without them, of `link`."""
        return (self.link if src is None or dst is None else self.link_between(src, dst)).time(nbytes)

    def with_memory(self, nbytes: int) -> DeviceProfile:
        return replace(self, memory=int(nbytes))


LINKS = MappingProxyType({
    # NVLink 4 (H100 SXM): 900 GB/s both directions over 18 links -> 450 GB/s one way.
    "nvlink4": Link("nvlink4", alpha=2e-6, beta=450e9),
    # NVLink 3 (A100 SXM): 600 GB/s both directions -> 300 GB/s one way.
    "nvlink3": Link("nvlink3", alpha=2e-6, beta=300e9),
    # PCIe 4.0 x16 (an A100 PCIe card): 32 GB/s one way raw, about 25 GB/s achieved.
    "pcie4": Link("pcie4", alpha=5e-6, beta=25e9),
    # PCIe 5.0 x16: 64 GB/s one way raw, about 50 GB/s achieved.
    "pcie5": Link("pcie5", alpha=5e-6, beta=50e9),
    # InfiniBand NDR 400 Gb/s per port = 50 GB/s one way.
    "ib-ndr": Link("ib-ndr", alpha=5e-6, beta=50e9),
    # 10 Gigabit Ethernet with TCP.
    "ethernet-10g": Link("ethernet-10g", alpha=30e-6, beta=1.25e9),
    # The toy GPU's link: round numbers, 50 us latency; not an H100's compute : link ratio
    # (10 FLOP/B here, about 2,200 over NVLink 4): see the module's docstring.
    "toy-link": Link("toy-link", alpha=50e-6, beta=1e9),
})

PROFILES = MappingProxyType({
    "toy-gpu": DeviceProfile(
        "toy-gpu", flops=10e9, mem_bandwidth=10e9, memory=256 * MiB, link=LINKS["toy-link"],
        source="pipelib's teaching device: 10 GFLOP/s, 10 GB/s, 256 MiB, 1 GB/s link",
    ),
    "h100": DeviceProfile(
        "h100", flops=989e12, mem_bandwidth=3.35e12, memory=80 * GiB, link=LINKS["nvlink4"],
        source="NVIDIA H100 SXM datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB",
    ),
    "a100": DeviceProfile(
        "a100", flops=312e12, mem_bandwidth=2.039e12, memory=80 * GiB, link=LINKS["nvlink3"],
        source="NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s dense BF16, 2.039 TB/s HBM2e",
    ),
    "h100-pcie-cluster": DeviceProfile(
        "h100-pcie-cluster", flops=756e12, mem_bandwidth=2.0e12, memory=80 * GiB, link=LINKS["ib-ndr"],
        source="NVIDIA H100 PCIe datasheet (756 TFLOP/s BF16, 2.0 TB/s) across NDR InfiniBand",
    ),
})

DEFAULT_PROFILE = "toy-gpu"


def get_profile(profile: str | DeviceProfile) -> DeviceProfile:
    """Look up a preset by name (or pass a DeviceProfile through)."""
    if isinstance(profile, DeviceProfile):
        return profile
    try:
        return PROFILES[profile]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown device profile {profile!r}; choose one of {sorted(PROFILES)} "
            f"or pass a pipelib.costmodel.DeviceProfile"
        ) from None


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) @ (k, n) product: one multiply and one add per term."""
    check_ints("matmul_flops", 0, m=m, k=k, n=n)
    return 2 * m * k * n
