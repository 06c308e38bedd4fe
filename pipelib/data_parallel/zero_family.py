"""The ZeRO family in one table: bytes per parameter held and moved per step, as formulas.

Pure arithmetic (no torch). Mixed precision throughout (16-bit parameters and gradients, K = 12
bytes of fp32 master weights and Adam moments), one micro-batch per step, N GPUs in nodes of
G, and ring collectives whose (n-1)/n is taken as 1 (large groups). Per parameter, per GPU:

- `gpu`: model-state bytes held on the GPU between steps (activations and transients apart);
- `host`: bytes held in CPU memory or on NVMe instead;
- `sent`: bytes each GPU sends per step over GPU links, all groups together (but for ZeRO++'s
  qgZ only its cross-node hop: see below);
- `cross_node`: the part of `sent` in collectives whose group spans nodes (ZeRO++'s accounting:
  an intra-node group's bytes stay on NVLink);
- `host_link`: bytes each GPU moves over PCIe to or from host memory per step.

Sources: ZeRO and ZeRO-R (Rajbhandari et al. 2020: Pos, Pg, Pp; Pa partitions activation
checkpoints over the tensor-parallel group, CB and MD are constant buffers and defragmentation:
they move no model-state byte); ZeRO-Offload (Ren et al. 2021: fp32 master weights, moments and
the gradients on the CPU, Adam there; 16-bit parameters on the GPU); ZeRO-Infinity (Rajbhandari
et al. 2021: everything on CPU or NVMe, fetched per layer); ZeRO++ (Wang et al. 2023 and
DeepSpeed's tutorial: qwZ all-gathers weights in int8, hpZ keeps a second, intra-node shard of
the 16-bit weights so backward's all-gather stays in the node, qgZ sends gradients in int4
through all-to-all: cross-node volume 3 M -> 0.75 M, M the 16-bit model); MiCS (Zhang et al.
2022: shards within a partition group of s GPUs, replicates across groups, hierarchical
collectives) and FSDP2's HSDP (`fully_shard(mesh=2-D)`, `(Replicate(), Shard(0))`), which hold
and move the same bytes here; FSDP2's `reshard_after_forward=False` (2 psi: no backward
all-gather, all parameters unsharded from forward to backward).

ZeRO++'s row counts qgZ as the paper does: only its cross-node hop (int4 gradients, 0.5 byte
per parameter), in `sent` as in `cross_node`. qgZ's all-to-all is hierarchical (DeepSpeed's
`all_to_all_quant_reduce`): each GPU first sends its whole gradient in int4 to the other GPUs of
its node (about 0.5 byte per parameter more, over NVLink), and only the node-reduced result
crosses nodes; `sent` leaves that intra-node hop out.

Quantization scales (a few bytes per block of weights) are left out. These are the papers'
accountings, not measurements: chapter 08 measures ZeRO 0-3, prefetching and
`reshard_after_forward` on its simulated GPUs and prints this table beside them.

Introduced in chapter 08.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipelib.checks import check_int


@dataclass(frozen=True)
class FamilyRow:
    """One member of the family: bytes per parameter per GPU (the module docstring)."""

    name: str
    gpu: float
    host: float
    sent: float
    cross_node: float
    host_link: float
    note: str


def zero_family(world_size: int, node_size: int = 8, shard_group: int | None = None) -> tuple[FamilyRow, ...]:
    """The table's rows for N = `world_size` GPUs in nodes of `node_size`; HSDP and MiCS shard
    over `shard_group` GPUs (one node by default) and replicate over N / shard_group groups."""
    n = check_int(world_size, "world_size", context="zero_family", hint="GPUs")
    g = check_int(node_size, "node_size", context="zero_family", hint="GPUs per node")
    s = check_int(g if shard_group is None else shard_group, "shard_group", context="zero_family",
                  hint="GPUs a model is sharded over")
    if n % g or n % s or s > n:
        raise ValueError(f"zero_family: world_size={n} must be a multiple of node_size={g} and of "
                         f"shard_group={s}; use whole nodes and whole groups")
    cross = 1.0 if n > g else 0.0      # a group of all N GPUs crosses nodes
    s_cross = 1.0 if s > g else 0.0    # a shard group larger than a node does too
    replicas = 4 / s if n // s > 1 else 0.0  # HSDP/MiCS: all-reduce of the gradient shard across groups
    return (
        FamilyRow("DDP (stage 0)", 16, 0, 4, 4 * cross, 0, "all-reduce of 16-bit gradients"),
        FamilyRow("ZeRO-1 (Pos)", 4 + 12 / n, 0, 4, 4 * cross, 0, "reduce-scatter + all-gather"),
        FamilyRow("ZeRO-2 (Pos+g)", 2 + 14 / n, 0, 4, 4 * cross, 0,
                  "k micro-batches: 2k + 2 sent (a reduce-scatter per backward)"),
        FamilyRow("ZeRO-3 / FSDP (Pos+g+p)", 16 / n, 0, 6, 6 * cross, 0, "gather in forward and backward"),
        FamilyRow("FSDP reshard_after_forward=False", 16 / n, 0, 4, 4 * cross, 0,
                  "+ all 16-bit parameters unsharded from forward to backward"),
        FamilyRow(f"HSDP (shard over {s}, replicate over {n // s})", 16 / s, 0, 6 + replicas,
                  6 * s_cross + replicas * cross, 0, "FSDP2 2-D mesh (Replicate(), Shard(0))"),
        FamilyRow(f"MiCS (partition groups of {s})", 16 / s, 0, 6 + replicas,
                  6 * s_cross + replicas * cross, 0, "the same bytes; hierarchical collectives"),
        FamilyRow("ZeRO++ (qwZ + hpZ + qgZ)", 16 / n + 2 / g, 0, 1 + 2 + 0.5, 1.5 * cross, 0,
                  "int8 weights, intra-node backward gather, int4 gradients (qgZ's NVLink hop not in sent)"),
        FamilyRow("ZeRO-Offload (ZeRO-2 + CPU Adam)", 2, 14 / n, 4, 4 * cross, 4 / n,
                  "16-bit gradient shard down, 16-bit parameter shard up"),
        FamilyRow("ZeRO-Infinity (all offloaded)", 0, 16 / n, 6, 6 * cross, 6 / n,
                  "GPU holds the working set only; parameter shard in for forward and backward, gradients out"),
        FamilyRow("ZeRO-R (Pa, CB, MD)", float("nan"), 0, 0, 0, 0,
                  "with any stage: activation checkpoints / TP degree, constant buffers, defragmentation"),
    )


def root_unsharded_bytes(vocab_size: int, hidden: int, bytes_per_element: int = 2) -> int:
    """Bytes of an embedding (vocab x hidden) kept unsharded from forward to backward: FSDP2
    leaves the root module's parameters gathered after forward by default
    (reshard_after_forward is False for the root), and the embedding often lives there."""
    return int(vocab_size) * int(hidden) * int(bytes_per_element)
