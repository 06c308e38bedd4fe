"""The alpha-beta model of the collectives: their names, exact bytes, predicted times, the fit.

A message of n bytes takes t(n) = alpha + n / beta (Hockney 1994): alpha, the latency,
dominates small messages; beta, the bandwidth, large ones. `fit_alpha_beta` fits both to a
ping-pong or a ring step (`pipelib.comm.lab` measures them), and from them `predicted_time`
gives the time of every collective of `pipelib.comm.collectives` (Thakur, Rabenseifner &
Gropp 2005), without the reduction's compute unless `gamma` is given.

The book writes N for the size of the group and n for the tensor's bytes (book/notation.md);
here the group size is the argument `n` and the bytes `nbytes`, and the table below uses the
book's symbols. Chunked collectives split dim 0 with
`torch.tensor_split` semantics (the first ``len % n`` chunks are one row longer, `chunk_sizes`),
so any size works. Bytes sent per rank (exact: `expected_bytes`, the tests check them against
the counters) and time (divisible sizes):

=====================  =============================  ==========================================
collective             bytes sent by one rank         time (divisible sizes)
=====================  =============================  ==========================================
broadcast (tree)       n x children in the tree       ceil(log2 N) (alpha + n/beta)
reduce (tree)          n (0 on the root)              ceil(log2 N) (alpha + n/beta)
all_reduce_naive       (N-1) n                        (N-1) (alpha + n/beta)
all_reduce (ring)      2 (N-1)/N n                    2(N-1) alpha + 2(N-1)/N n/beta
reduce_scatter (ring)  (N-1)/N n                      (N-1) alpha + (N-1)/N n/beta
all_gather (ring)      (N-1) n   (n = one input)      (N-1) (alpha + n/beta)
all_to_all (pairwise)  (N-1)/N n                      (N-1) alpha + (N-1)/N n/beta
all_reduce_halving_    2 (N-1)/N n                    2 log2 N alpha + 2(N-1)/N n/beta
 doubling (Rabenseifner, N a power of two)
all_reduce_hierarchi-  n (reduce) + n x children      2 ceil(log2 P)(alpha_i + n/beta_i)
 cal (P ranks a node)   (broadcast); leaders + ring   + ring all_reduce on N/P leaders
gather_tree, scatter_  n x blocks sent                ceil(log2 N) alpha + (N-1) n/beta
 tree (binomial)        (n = one rank's block)
barrier (dissemina-    ceil(log2 N) one-byte tokens   ceil(log2 N) (alpha + 1/beta)
 tion)
=====================  =============================  ==========================================

`NAMES` is the one tuple of the collectives' names (the lab, the agreement check and the
figures use it) and `OPS` the one tuple of reduction ops.

Pure: imports nothing but the standard library and `pipelib.checks` (no torch), so figures and planners can predict
without starting a process (a test checks). Introduced in chapter 05 (the fit) and chapter 06
(the collectives' formulas, `compare`).
"""
from __future__ import annotations

import math

from pipelib.checks import is_int_at_least

NAMES = ("broadcast", "reduce", "all_reduce_naive", "all_reduce", "reduce_scatter", "all_gather", "all_to_all",
         "all_reduce_halving_doubling", "all_reduce_hierarchical", "gather_tree", "scatter_tree", "barrier")
OPS = ("sum", "avg", "max", "min")


def check_name(name: str) -> str:
    """`name` if it is one of `NAMES`; else a ValueError that lists them."""
    if name not in NAMES:
        raise ValueError(f"unknown collective {name!r}; use one of {NAMES}")
    return name


def tree_steps(n: int) -> int:
    """Steps of a binomial tree on n ranks: ceil(log2 n) (0 on one rank)."""
    return math.ceil(math.log2(n)) if n > 1 else 0


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


def _block(sizes, r: int, d: int) -> int:
    """Elements in the aligned block of d chunks that holds chunk r."""
    lo = r // d * d
    return sum(sizes[lo:lo + d])


def _tree_blocks_sent(name: str, v: int, n: int) -> int:
    """Blocks relative rank v sends in the binomial gather (up) or scatter (down)."""
    low = v & -v if v else 1 << tree_steps(n)
    if name == "gather_tree":
        return min(low, n - v) if v else 0
    return sum(min(1 << k, n - v - (1 << k)) for k in range(tree_steps(n)) if (1 << k) < low and v + (1 << k) < n)


# ------------------------------------------------------------------ exact byte counts
def chunk_sizes(length: int, n: int) -> list[int]:
    """Rows per chunk under torch.tensor_split: the first length % n chunks get one more."""
    q, r = divmod(length, n)
    return [q + 1 if i < r else q for i in range(n)]


def expected_bytes(name: str, shape, itemsize: int, n: int, rank: int, root: int = 0, *,
                   ranks_per_node: int | None = None) -> int:
    """Bytes group rank `rank` sends in collective `name` (the table above, exactly)."""
    check_name(name)
    shape = tuple(shape) or (1,)
    numel = math.prod(shape)
    N = numel * itemsize
    if n == 1:
        return 0
    if name == "barrier":
        return tree_steps(n)
    if name in ("gather_tree", "scatter_tree"):
        return N * _tree_blocks_sent(name, (rank - root) % n, n)
    if name == "all_reduce_halving_doubling":
        check_power_of_two(name, n)
        sz, ds = chunk_sizes(numel, n), [1 << k for k in range(tree_steps(n))]
        return itemsize * sum(_block(sz, rank ^ d, d) + _block(sz, rank, d) for d in ds)
    if name == "all_reduce_hierarchical":
        p = ranks_per_node_of(n, ranks_per_node)
        node, local = divmod(rank, p)
        own = expected_bytes("broadcast", shape, itemsize, p, local) + (N if local else 0)
        sz, L = chunk_sizes(numel, n // p), n // p
        return own + (0 if local or L == 1 else (2 * numel - sz[(node + 1) % L] - sz[(node + 2) % L]) * itemsize)
    if name == "broadcast":
        v = (rank - root) % n
        return N * sum(1 for k in range(tree_steps(n)) if v < (1 << k) and v + (1 << k) < n)
    if name == "reduce":
        return 0 if rank == root else N
    if name in ("all_reduce_naive", "all_gather"):
        return (n - 1) * N
    if name == "all_reduce":
        sz = chunk_sizes(numel, n)
        return (2 * numel - sz[rank] - sz[(rank + 1) % n]) * itemsize
    row = numel // shape[0] * itemsize if shape[0] else 0  # reduce_scatter, all_to_all
    return (shape[0] - chunk_sizes(shape[0], n)[rank]) * row


# ------------------------------------------------------------------ predicted times
def predicted_time(name: str, nbytes: int, n: int, alpha: float, beta: float, gamma: float = 0.0, *,
                   ranks_per_node: int | None = None, intra: tuple[float, float] | None = None) -> float:
    """Alpha-beta time of collective `name` on n ranks for an N-byte tensor (divisible sizes;
    all_gather: N is one rank's input). `gamma` (seconds per byte reduced, default 0: the
    textbook model ignores the reduction's compute) adds the local reductions on the critical
    path: (n-1)/n N for the rings, (n-1) N for the naive ring, ceil(log2 n) N for the tree
    (Thakur, Rabenseifner & Gropp 2005). A simulated device does not model it: gamma = 0.
    all_reduce_hierarchical: `ranks_per_node` P as in the collective, `intra` = (alpha, beta) of
    the links inside a node (default: the same link); halving/doubling: N a power of two
    (others take ceil(log2 N) steps here, an estimate); barrier ignores nbytes (1-byte tokens)."""
    check_name(name)
    if n == 1:
        return 0.0
    steps = tree_steps(n)
    if name == "all_reduce_hierarchical":
        p = ranks_per_node_of(n, ranks_per_node)
        a_i, b_i = intra or (alpha, beta)
        inside = 2 * tree_steps(p) * (a_i + nbytes / b_i) + tree_steps(p) * nbytes * gamma
        return inside + predicted_time("all_reduce", nbytes, n // p, alpha, beta, gamma)
    return {
        "broadcast": steps * (alpha + nbytes / beta),
        "reduce": steps * (alpha + nbytes / beta + nbytes * gamma),
        "all_reduce_naive": (n - 1) * (alpha + nbytes / beta + nbytes * gamma),
        "all_reduce": 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / beta + (n - 1) / n * nbytes * gamma,
        "reduce_scatter": (n - 1) * alpha + (n - 1) / n * nbytes / beta + (n - 1) / n * nbytes * gamma,
        "all_gather": (n - 1) * (alpha + nbytes / beta),
        "all_to_all": (n - 1) * alpha + (n - 1) / n * nbytes / beta,
        "all_reduce_halving_doubling": 2 * steps * alpha + 2 * (n - 1) / n * nbytes / beta
        + (n - 1) / n * nbytes * gamma,
        "gather_tree": steps * alpha + (n - 1) * nbytes / beta,
        "scatter_tree": steps * alpha + (n - 1) * nbytes / beta,
        "barrier": steps * (alpha + 1 / beta),
    }[name]


def predict_collectives(nbytes: int, n: int, alpha: float, beta: float) -> dict[str, float]:
    """Alpha-beta time of every from-scratch collective for an N-byte tensor on n ranks."""
    return {k: predicted_time(k, nbytes, n, alpha, beta) for k in NAMES}


def message_times(nbytes, alpha: float, beta: float) -> list[float]:
    """The fitted line at each size: alpha + n / beta seconds for a message of n bytes."""
    return [alpha + n / beta for n in nbytes]


# ------------------------------------------------------------------ at scale (chapter 06's Deepen)
def bus_bandwidth_factor(name: str, n: int) -> float:
    """nccl-tests' bus bandwidth = algorithm bandwidth (bytes / time) x this factor, so that a
    collective reaching the link's speed shows the link's speed whatever n (nccl-tests,
    doc/PERFORMANCE.md): 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and
    all-to-all (bytes of the *whole* tensor: all-gather's output), 1 for broadcast and reduce."""
    check_name(name)
    if name.startswith("all_reduce"):
        return 2 * (n - 1) / n
    if name in ("reduce_scatter", "all_gather", "all_to_all", "gather_tree", "scatter_tree"):
        return (n - 1) / n
    return 1.0


def tree_all_reduce_time(nbytes: int, n: int, alpha: float, beta: float) -> float:
    """A pipelined (double) binary tree all-reduce, model only: up and down a tree of depth
    ceil(log2 n), 2 ceil(log2 n) alpha, with the tensor streamed through in pieces so the
    bytes cost about 2 nbytes/beta (two trees, each carrying half: Sanders, Speck & Traeff 2009;
    NCCL's trees since 2.4). Against the ring's 2(n-1) alpha: logarithmic latency."""
    return 2 * tree_steps(n) * alpha + 2 * nbytes / beta


def ring_latency_bound_ranks(nbytes: int, alpha: float, beta: float) -> float:
    """Ranks beyond which the ring all-reduce's latency term 2(n-1) alpha exceeds its bandwidth
    term 2(n-1)/n nbytes/beta: n alpha = nbytes/beta, so n* = nbytes / (alpha beta)."""
    return nbytes / (alpha * beta)


# ------------------------------------------------------------------ fitting and comparing
def fit_alpha_beta(nbytes, times, *, relative: bool = False) -> tuple[float, float]:
    """Least squares of t = alpha + n / beta; returns (alpha seconds, beta bytes/s).

    Ordinary least squares weighs the big messages most, which is what beta needs; alpha comes
    out of the intercept (chapter 05 shows the residuals), and on a noisy machine it can come
    out tiny or even negative. ``relative=True`` minimises the *relative* residuals instead
    (weights 1/t^2): every size counts alike, so alpha is set by the small messages and beta by
    the large ones; that is the fit to predict times across sizes within a percentage (ch. 06)."""
    xs, ys = [float(x) for x in nbytes], [float(y) for y in times]
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError(f"need at least two different message sizes to fit alpha and beta, got {xs}")
    if relative and min(ys) <= 0:
        raise ValueError(f"a relative fit needs positive times, got {ys}")
    ws = [1.0 / y**2 for y in ys] if relative else [1.0] * len(ys)
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx
    if slope <= 0:
        raise ValueError(f"time does not grow with size (slope {slope:.3g} s/B): measure larger messages")
    return my - slope * mx, 1.0 / slope


def compare(name: str, rows: list[dict], n: int, alpha: float, beta: float, gamma: float = 0.0) -> list[dict]:
    """Measured (rows of `pipelib.comm.lab.measure_collective`) beside the alpha-beta(-gamma)
    prediction of `predicted_time`: bytes, measured, predicted, error = measured / predicted - 1
    (positive: slower than the model). On real cores ``gamma = 1 / rate`` of
    `pipelib.comm.lab.reduce_rate` adds the bytes each rank reduces (Thakur et al. 2005)."""
    out = []
    for r in rows:
        p = predicted_time(name, r["bytes"], n, alpha, beta, gamma)
        out.append({"bytes": r["bytes"], "measured": r["time"], "predicted": p,
                    "error": r["time"] / p - 1 if p > 0 else float("nan")})
    return out
