"""One entry per collective: its implementation, torch's twin, the bytes a rank sends, its time.

    info = collective_info("all_reduce")
    info.run(x, group=g)                        # pipelib.comm.collectives.all_reduce(x, "sum", g)
    info.twin(x, group=g)                       # torch.distributed.all_reduce, the same result
    info.expected_bytes((1024,), 4, n=4, rank=0)    # 1536: 2 (N-1)/N n, exactly
    info.predicted_time(4096, 4, alpha, beta)   # 6 alpha + 1.5 n / beta

A `CollectiveInfo` holds where the from-scratch function lives, how it is called (a root? an
op?), its twin (`pipelib.comm.twins`: torch.distributed's built-in with the same semantics, what
the tests and chapter 06 compare against), the exact bytes each rank sends (checked against the
counters) and the alpha-beta time (Hockney 1994; Thakur, Rabenseifner & Gropp 2005; the table of
`pipelib.comm.alphabeta`). Only this module compares or maps a collective's name (a test greps
the rest of pipelib): a new collective (chapter 16's uneven all-to-all) is its function, its
twin, one entry below, and its tests.

Bytes: of the tensor a rank passes (all_gather, gather, scatter: one rank's block); chunked
collectives cut dim 0 as `torch.tensor_split` does (`chunk_sizes`). Pure: torch is imported only
when a twin or the implementation is used, so `alphabeta` and the figures predict without it.
Introduced in chapter 06.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from types import MappingProxyType

from pipelib.checks import is_int_at_least
from pipelib.comm import twins


def tree_steps(n: int) -> int:
    """Steps of a binomial tree on n ranks: ceil(log2 n) (0 on one rank)."""
    return math.ceil(math.log2(n)) if n > 1 else 0


def chunk_sizes(length: int, n: int) -> list[int]:
    """Rows per chunk under torch.tensor_split: the first length % n chunks get one more."""
    q, r = divmod(length, n)
    return [q + 1 if i < r else q for i in range(n)]


def ranks_per_node_of(n: int, ranks_per_node=None) -> int:
    """The node size P of the hierarchical all-reduce on n ranks: `ranks_per_node`, or when None
    gcd(n, 8) (8 GPUs a node); a ValueError unless P is a positive integer dividing n."""
    p = math.gcd(n, 8) if ranks_per_node is None else ranks_per_node
    if not is_int_at_least(p) or n % p:
        raise ValueError(f"all_reduce_hierarchical: ranks_per_node={ranks_per_node!r} does not divide the "
                         f"group of {n} ranks into nodes; pass a divisor of {n} (ranks on one node)")
    return p


def check_power_of_two(name: str, n: int) -> None:
    """A ValueError unless the group size n is a power of two (recursive halving/doubling)."""
    if n < 1 or n & (n - 1):
        below = 1 << (n.bit_length() - 1)
        raise ValueError(f"{name} needs a power-of-two group size, got {n} ranks; use all_reduce (the ring: "
                         f"any size), or run it on a sub-group of {below} ranks")


@dataclass(frozen=True)
class Sent:
    """What the bytes one rank sends depend on: the tensor, the group, this rank, the root."""

    shape: tuple
    itemsize: int
    n: int
    rank: int
    root: int = 0
    ranks_per_node: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def v(self) -> int:  # this rank relative to the root
        return (self.rank - self.root) % self.n


# ------------------------------------------------------------------ bytes one rank sends (n > 1)
def tree_down(s: Sent) -> int:
    """Binomial broadcast: n x the children of relative rank v, #{k : v < 2^k, v + 2^k < N}."""
    return s.nbytes * sum(1 for k in range(tree_steps(s.n)) if s.v < (1 << k) and s.v + (1 << k) < s.n)


def whole_each_step(s: Sent) -> int:
    """Naive ring all-reduce, ring all-gather: the whole tensor (one block) at each of N-1 steps."""
    return (s.n - 1) * s.nbytes


def ring_twice(s: Sent) -> int:
    """Ring all-reduce: every chunk but chunks r and r+1, twice: 2N - |chunk r| - |chunk r+1|."""
    sz = chunk_sizes(s.numel, s.n)
    return (2 * s.numel - sz[s.rank] - sz[(s.rank + 1) % s.n]) * s.itemsize


def all_rows_but_mine(s: Sent) -> int:
    """Ring reduce-scatter, pairwise all-to-all: every dim-0 chunk but chunk r, N - |chunk r|."""
    row = s.numel // s.shape[0] * s.itemsize if s.shape[0] else 0
    return (s.shape[0] - chunk_sizes(s.shape[0], s.n)[s.rank]) * row


def _block(sizes, r: int, d: int) -> int:  # elements in the aligned block of d chunks holding chunk r
    return sum(sizes[r // d * d:r // d * d + d])


def halving_doubling(s: Sent) -> int:
    """Rabenseifner: at each distance d, the partner's block of d chunks, then its own."""
    check_power_of_two("all_reduce_halving_doubling", s.n)
    sz, ds = chunk_sizes(s.numel, s.n), [1 << k for k in range(tree_steps(s.n))]
    return s.itemsize * sum(_block(sz, s.rank ^ d, d) + _block(sz, s.rank, d) for d in ds)


def hierarchical(s: Sent) -> int:
    """Tree reduce and broadcast inside the node, a ring all-reduce across the leaders."""
    p = ranks_per_node_of(s.n, s.ranks_per_node)
    node, local = divmod(s.rank, p)
    own = (tree_down(Sent(s.shape, s.itemsize, p, local)) if p > 1 else 0) + (s.nbytes if local else 0)
    leaders = s.n // p
    if local or leaders == 1:
        return own
    return own + ring_twice(Sent(s.shape, s.itemsize, leaders, (node + 1) % leaders))  # leader j ends with chunk j+1


def _low_bit(s: Sent) -> int:  # the lowest set bit of v (the root: above the top of the tree)
    return s.v & -s.v if s.v else 1 << tree_steps(s.n)


def gather_up(s: Sent) -> int:
    """Binomial gather: relative rank v sends its min(2^k, N - v) blocks once (k its lowest bit)."""
    return s.nbytes * (min(_low_bit(s), s.n - s.v) if s.v else 0)


def scatter_down(s: Sent) -> int:
    """Binomial scatter: at each level below its own, the blocks of the subtree it hands down."""
    v, n = s.v, s.n
    return s.nbytes * sum(min(1 << k, n - v - (1 << k)) for k in range(tree_steps(n))
                          if (1 << k) < _low_bit(s) and v + (1 << k) < n)


# ------------------------------------------------------------------ alpha-beta times (n > 1)
@dataclass(frozen=True)
class LinkCosts:
    """What a collective's time depends on: bytes, ranks, the link (and the node's, for the
    hierarchical all-reduce), gamma seconds per byte reduced (0: the textbook model)."""

    nbytes: int
    n: int
    alpha: float
    beta: float
    gamma: float = 0.0
    ranks_per_node: int | None = None
    intra: tuple[float, float] | None = None

    @property
    def hop(self) -> float:  # one message of the whole tensor: alpha + n / beta
        return self.alpha + self.nbytes / self.beta

    @property
    def share(self) -> float:  # (N-1)/N of the tensor, in bytes
        return (self.n - 1) / self.n * self.nbytes


def ring_allreduce_time(k: LinkCosts) -> float:
    """Ring all-reduce: 2(N-1) alpha + 2(N-1)/N n / beta, plus (N-1)/N n gamma reduced."""
    return 2 * (k.n - 1) * k.alpha + 2 * k.share / k.beta + k.share * k.gamma


def hierarchical_time(k: LinkCosts) -> float:
    """Trees inside the node (intra link), 2 ceil(log2 P) hops, and the leaders' ring."""
    p = ranks_per_node_of(k.n, k.ranks_per_node)
    a_i, b_i = k.intra or (k.alpha, k.beta)
    inside = 2 * tree_steps(p) * (a_i + k.nbytes / b_i) + tree_steps(p) * k.nbytes * k.gamma
    leaders = k.n // p
    ring = 0.0 if leaders == 1 else ring_allreduce_time(LinkCosts(k.nbytes, leaders, k.alpha, k.beta, k.gamma))
    return inside + ring


# ------------------------------------------------------------------ the entries
@dataclass(frozen=True)
class CollectiveInfo:
    """What pipelib knows about one collective (module docstring)."""

    name: str
    module: str                              # "collectives" or "algorithms": where it is written
    bytes_sent: Callable[[Sent], int]        # exact bytes one rank sends, n > 1
    time: Callable[[LinkCosts], float]            # alpha-beta(-gamma) time, n > 1
    twin: Callable                           # (tensor, group=None, *, root=0, op="sum") -> result
    root_arg: str | None = None              # keyword of its root ("src", "dst"), if it has one
    reduces: bool = False                    # takes op= (sum, avg, max, min)
    bus_factor: Callable[[int], float] = lambda n: 1.0   # nccl-tests' busbw / algbw on n ranks
    slots: str = "whole"                     # replay grid: the "whole" tensor, or n "chunks"
    start: str = "own"                       # replay start: each slot its "own" rank, the "root"'s, "diagonal"
    result_on_root: bool = False             # only the root's result is defined (reduce, gather)
    call: Callable | None = None             # how `run` calls it, if not (tensor, root_arg=, op=, group=)
    twin_even: bool = False                  # the built-in itself needs dim 0 divisible by n
    run_shape: Callable | None = None        # (shape, n) -> the shape `run` passes on, if not shape

    @functools.cached_property
    def implementation(self) -> Callable:  # the from-scratch function, imported on first use, kept
        return getattr(import_module(f"pipelib.comm.{self.module}"), self.name)

    def run(self, tensor, group=None, *, root: int = 0, op: str = "sum", **kw):
        """The from-scratch collective, called alike for every entry (kw: check=, label=, ...)."""
        if self.call is not None:
            return self.call(self.implementation, tensor, group, root, op, kw)
        if self.root_arg:
            kw[self.root_arg] = root
        if self.reduces:
            kw["op"] = op
        return self.implementation(tensor, group=group, **kw)

    def holds_result(self, rank: int, root: int = 0) -> bool:
        """Whether group rank `rank` ends with a defined result (reduce, gather: the root only)."""
        return not self.result_on_root or rank == root

    def expected_bytes(self, shape, itemsize: int, n: int, rank: int, root: int = 0, *,
                       ranks_per_node: int | None = None) -> int:
        """Bytes group rank `rank` sends, exactly (of which tensor: the module docstring)."""
        if n == 1:
            return 0
        return self.bytes_sent(Sent(tuple(shape) or (1,), itemsize, n, rank, root, ranks_per_node))

    def run_bytes(self, shape, itemsize: int, n: int, rank: int, root: int = 0, **kw) -> int:
        """Bytes `run` sends for a tensor of `shape` (scatter: it passes one block on)."""
        shape = tuple(shape) if self.run_shape is None else self.run_shape(tuple(shape), n)
        return self.expected_bytes(shape, itemsize, n, rank, root, **kw)

    def predicted_time(self, nbytes: int, n: int, alpha: float, beta: float, gamma: float = 0.0, *,
                       ranks_per_node: int | None = None, intra: tuple[float, float] | None = None) -> float:
        """Alpha-beta time on n ranks (`pipelib.comm.alphabeta.predicted_time`)."""
        return 0.0 if n == 1 else self.time(LinkCosts(nbytes, n, alpha, beta, gamma, ranks_per_node, intra))


def _ring_factor(n: int) -> float:  # bus bandwidth: (N-1)/N of the tensor crosses each link
    return (n - 1) / n


def _twice(n: int) -> float:  # an all-reduce: 2 (N-1)/N
    return 2 * (n - 1) / n


REGISTRY: MappingProxyType[str, CollectiveInfo] = MappingProxyType({info.name: info for info in (
    CollectiveInfo("broadcast", "collectives", tree_down, lambda k: tree_steps(k.n) * k.hop,
                   twins.torch_broadcast, root_arg="src", start="root"),
    CollectiveInfo("reduce", "collectives", lambda s: 0 if s.rank == s.root else s.nbytes,  # n once
                   lambda k: tree_steps(k.n) * (k.hop + k.nbytes * k.gamma),
                   twins.torch_reduce, root_arg="dst", reduces=True, result_on_root=True),
    CollectiveInfo("all_reduce_naive", "collectives", whole_each_step,
                   lambda k: (k.n - 1) * (k.hop + k.nbytes * k.gamma), twins.torch_all_reduce, reduces=True,
                   bus_factor=_twice),
    CollectiveInfo("all_reduce", "collectives", ring_twice, ring_allreduce_time, twins.torch_all_reduce, reduces=True,
                   bus_factor=_twice, slots="chunks"),
    CollectiveInfo("reduce_scatter", "collectives", all_rows_but_mine, lambda k: (k.n - 1) * k.alpha
                   + k.share / k.beta + k.share * k.gamma, twins.torch_reduce_scatter, reduces=True,
                   bus_factor=_ring_factor, slots="chunks", twin_even=True),
    CollectiveInfo("all_gather", "collectives", whole_each_step, lambda k: (k.n - 1) * k.hop,
                   twins.torch_all_gather, bus_factor=_ring_factor, slots="chunks", start="diagonal"),
    CollectiveInfo("all_to_all", "collectives", all_rows_but_mine,
                   lambda k: (k.n - 1) * k.alpha + k.share / k.beta, twins.torch_all_to_all,
                   bus_factor=_ring_factor, slots="chunks"),
    CollectiveInfo("all_to_all_uneven", "uneven", all_rows_but_mine,  # even chunks; splits: uneven.uneven_bytes
                   lambda k: (k.n - 1) * k.alpha + k.share / k.beta, twins.torch_all_to_all_uneven,
                   bus_factor=_ring_factor, slots="chunks"),
    CollectiveInfo("all_reduce_halving_doubling", "algorithms", halving_doubling,
                   lambda k: 2 * tree_steps(k.n) * k.alpha + 2 * k.share / k.beta + k.share * k.gamma,
                   twins.torch_all_reduce, reduces=True, bus_factor=_twice),
    CollectiveInfo("all_reduce_hierarchical", "algorithms", hierarchical, hierarchical_time,
                   twins.torch_all_reduce, reduces=True, bus_factor=_twice),
    CollectiveInfo("gather_tree", "algorithms", gather_up,
                   lambda k: tree_steps(k.n) * k.alpha + (k.n - 1) * k.nbytes / k.beta,
                   twins.torch_gather, root_arg="dst", bus_factor=_ring_factor, result_on_root=True),
    CollectiveInfo("scatter_tree", "algorithms", scatter_down,
                   lambda k: tree_steps(k.n) * k.alpha + (k.n - 1) * k.nbytes / k.beta,
                   twins.torch_scatter, root_arg="src", bus_factor=_ring_factor, call=twins.call_scatter,
                   twin_even=True, run_shape=twins.scatter_block),
    CollectiveInfo("barrier", "algorithms", lambda s: tree_steps(s.n),  # a 1-byte token a round
                   lambda k: tree_steps(k.n) * (k.alpha + 1 / k.beta), twins.torch_barrier, call=twins.call_barrier),
)})

NAMES: tuple[str, ...] = tuple(REGISTRY)  # in this order: the agreement check codes a name by its index


def collective_info(name: str) -> CollectiveInfo:
    """The registry entry for `name`; a ValueError lists the names."""
    info = REGISTRY.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"unknown collective {name!r}; use one of {NAMES}")
    return info
