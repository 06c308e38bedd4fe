"""The order of the mesh axes on nodes: which axis's messages cross between nodes, and what it costs.

Ranks are numbered node by node (`gpus_per_node` consecutive ranks a node), and the order of
the axes (outermost first, `Topology.order`) decides which ranks form each group: the innermost
axis's groups are runs of consecutive ranks, inside a node, and the outermost axis's groups
are ranks a world / size apart, across nodes. Frameworks agree that tensor parallelism goes
innermost (its all-reduces sit on every layer's critical path) and disagree on the outermost:

- PP outermost, `("pp", "dp", "cp", "tp")`: Megatron-LM ("tp-cp-ep-dp-pp", innermost first,
  Narayanan et al. 2021, section 3.3) and torchtitan's `ParallelDims` (pp, dp, cp, tp);
- DP outermost, `("dp", "pp", "cp", "tp")`: Llama 3 (Dubey et al. 2024, section 3.3.2, "[TP, CP,
  PP, DP]" innermost first): the data-parallel (FSDP) traffic tolerates latency and is
  overlapped, so it takes the slowest links, and the pipeline's many small messages stay close;
- TP outermost, `("tp", "pp", "dp", "cp")`: the placement rule broken, tp across nodes.

Measured on simulated nodes: a Cluster started with `machine.profile` (the GPU with its node
map, `DeviceProfile.with_nodes`) clocks every message on the link its sender and receiver share
(`pipelib.comm.message`), so a step's time on two-speed nodes is measured, not priced. From the
run's trace too: every SEND event names its global sender, receiver, bytes and mesh axis, so
`crossing_bytes` splits each axis's bytes into inside a node and between nodes, and
`link_seconds` prices every message on the link its two ranks share.

Predicted: `planner.timing.link_of` (an axis crosses nodes when its group's span, its size times
the sizes of the axes inside it, exceeds a node) and `search.evaluate` with the strategy's
`order`. Pure. Introduced in chapter 15.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from pipelib.costmodel import PROFILES, Link
from pipelib.planner.search import evaluate
from pipelib.planner.spec import Machine, ModelSpec
from pipelib.planner.strategy import Strategy
from pipelib.planner.timing import link_of
from pipelib.trace import Kind

ORDERS = MappingProxyType({
    "PP outermost (Megatron-LM, torchtitan)": ("pp", "dp", "cp", "tp"),
    "DP outermost (Llama 3)": ("dp", "pp", "cp", "tp"),
    "TP outermost (the rule broken)": ("tp", "pp", "dp", "cp"),
})
# simulated nodes of 4 toy GPUs: their own link inside a node, one 10 times slower between nodes
# (toy-gpu's 1 GB/s against 0.1 GB/s, 4 times the latency: an NVLink : InfiniBand-like gap)
TOY_INTER_NODE = Link("toy-inter-node", alpha=4 * PROFILES["toy-gpu"].link.alpha,
                      beta=PROFILES["toy-gpu"].link.beta / 10)
TOY_NODES = Machine(PROFILES["toy-gpu"], gpus_per_node=4, inter_node=TOY_INTER_NODE)


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node


def link_between(a: int, b: int, machine: Machine) -> Link:
    """The link ranks `a` and `b` share: the device's inside a node, `inter_node` between."""
    return machine.profile.link_between(a, b)  # the one rule the simulated clock uses too


def _sends(trace):
    return (e for e in trace.events if e.kind == Kind.SEND and e.axis is not None and e.peer is not None)


def crossing_bytes(trace, gpus_per_node: int) -> dict[str, dict[str, int]]:
    """{axis: {"inside": bytes, "between": bytes}}: every message sent, by whether its sender
    and receiver share a node."""
    out: dict[str, dict[str, int]] = {}
    for e in _sends(trace):
        where = "inside" if node_of(e.rank, gpus_per_node) == node_of(e.peer, gpus_per_node) else "between"
        out.setdefault(e.axis, {"inside": 0, "between": 0})[where] += e.bytes
    return out


def link_seconds(trace, machine: Machine, steps: int = 1) -> dict[str, float]:
    """{axis: seconds per step}: the busiest rank's messages of each axis, each alpha + bytes / beta
    on the link its sender and receiver share (what the axis's sends keep one rank's links
    busy), over `steps` steps in the trace."""
    per: dict[tuple[str, int], float] = {}
    for e in _sends(trace):
        key = (e.axis, e.rank)
        per[key] = per.get(key, 0.0) + link_between(e.rank, e.peer, machine).time(e.bytes)
    axes = sorted({a for a, _ in per})
    return {a: max(v for (b, _), v in per.items() if b == a) / steps for a in axes}


def predicted_crossing(lay: Strategy, machine: Machine) -> dict[str, bool]:
    """{axis: True if its groups cross nodes}, for the axes of more than one rank (`link_of`)."""
    return {a: link_of(a, lay, machine) is machine.inter_node for a in ("dp", "tp", "pp", "cp")
            if getattr(lay, a) > 1}


def order_costs(model: ModelSpec, machine: Machine, n_devices: int, global_batch: int, lay: Strategy,
                orders=ORDERS, *, accounting: str = "megatron") -> dict:
    """{name: Candidate}: the same strategy evaluated under each order of `orders` ({name: order})."""
    return {name: evaluate(model, machine, n_devices, global_batch, replace(lay, order=tuple(order)),
                           accounting=accounting) for name, order in orders.items()}
