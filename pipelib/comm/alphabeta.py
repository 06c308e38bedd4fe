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

Each row is one entry of `pipelib.comm.registry` (its bytes and time formulas, beside the
collective and torch's twin); `expected_bytes` and `predicted_time` look the name up there.
`NAMES` is the registry's tuple of the collectives' names (the lab, the agreement check and the
figures use it) and `OPS` the one tuple of reduction ops.

Pure: imports nothing but the standard library and the pure registry (no torch), so figures and
planners can predict without starting a process (a test checks). Introduced in chapter 05 (the fit) and chapter 06
(the collectives' formulas, `compare`).
"""
from __future__ import annotations

from pipelib.comm.registry import NAMES, check_power_of_two, chunk_sizes, collective_info, ranks_per_node_of, tree_steps

__all__ = ["NAMES", "OPS", "check_name", "chunk_sizes", "tree_steps", "ranks_per_node_of", "check_power_of_two",
           "expected_bytes", "predicted_time", "predict_collectives", "message_times", "bus_bandwidth_factor",
           "tree_all_reduce_time", "ring_latency_bound_ranks", "fit_alpha_beta", "compare"]

OPS = ("sum", "avg", "max", "min")


def check_name(name: str) -> str:
    """`name` if it is one of `NAMES`; else a ValueError that lists them."""
    return collective_info(name).name


# ------------------------------------------------------------------ exact bytes, predicted times
def expected_bytes(name: str, shape, itemsize: int, n: int, rank: int, root: int = 0, *,
                   ranks_per_node: int | None = None) -> int:
    """Bytes group rank `rank` sends in collective `name` (the table above, exactly):
    `collective_info(name).expected_bytes(...)`."""
    return collective_info(name).expected_bytes(shape, itemsize, n, rank, root, ranks_per_node=ranks_per_node)


def predicted_time(name: str, nbytes: int, n: int, alpha: float, beta: float, gamma: float = 0.0, *,
                   ranks_per_node: int | None = None, intra: tuple[float, float] | None = None) -> float:
    """Alpha-beta time of collective `name` on n ranks for an N-byte tensor (divisible sizes;
    all_gather: N is one rank's input). `gamma` (seconds per byte reduced, default 0: the
    textbook model ignores the reduction's compute) adds the local reductions on the critical
    path: (n-1)/n N for the rings, (n-1) N for the naive ring, ceil(log2 n) N for the tree
    (Thakur, Rabenseifner & Gropp 2005). A simulated device does not model it: gamma = 0.
    all_reduce_hierarchical: `ranks_per_node` P as in the collective, `intra` = (alpha, beta) of
    the links inside a node (default: the same link); halving/doubling: N a power of two
    (others take ceil(log2 N) steps here, an estimate); barrier ignores nbytes (1-byte tokens).
    `collective_info(name).predicted_time(...)`."""
    return collective_info(name).predicted_time(nbytes, n, alpha, beta, gamma, ranks_per_node=ranks_per_node,
                                                intra=intra)


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
    return collective_info(name).bus_factor(n)


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
