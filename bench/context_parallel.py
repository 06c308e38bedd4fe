"""Ring attention against the all-gather of K/V (Llama 3) and DeepSpeed-Ulysses, on real CPU
engines, and ring attention's overhead over one process doing the same FLOPs.

For each world size (2 and 4 ranks, `Cluster(device="cpu")`, one thread per engine), one causal
forward + backward of each variant on the same inputs (zigzag shards; `--seq` positions,
`--heads` heads of `--head-dim`, fp32). Beside them, "alone": every engine does its own rank's
ring work (the same blockwise kernels on the same shards, every K/V block already at hand)
with no message at all: one process doing the same FLOPs, under the same core sharing.
After one warm-up step of each, `--repeats` rounds run the four in turn (the order rotating
each round), each step from a barrier; a step's time is the slowest rank's. Reported: the
median time of each, and the medians of the per-round ratios against the ring (paired, so the
drifting load of a shared machine cancels): all-gather / ring and Ulysses / ring (below 1.0:
faster than the ring), and ring / alone, the ring's overhead (1.0: none). With more ranks
than cores (4 ranks on 2 cores) the ranks share cores in both, so the ratio stays fair.

Bytes per rank are not timed: they are exact and checked in tests/context_parallel.
Wall-clock numbers on a shared 2-core machine are noisy: read the ratios, and the load printed.

Writes bench/results/context_parallel.json.

    .venv/bin/python bench/context_parallel.py [--quick] [--worlds 2,4] [--seq 2048] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _results import load, write  # noqa: E402  (bench/, the script's own folder)


def _timers() -> dict:
    """Each variant of the registry by name, and "alone": every rank's ring work without messages."""
    from functools import partial

    from pipelib.context_parallel.timing import time_alone, time_attention
    from pipelib.context_parallel.variants import REGISTRY

    return {**{name: partial(time_attention, name) for name in REGISTRY}, "alone": time_alone}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a short sequence, 2 rounds (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.repeats = 512, 2

    import torch

    from pipelib import Cluster

    timers = _timers()
    names = tuple(timers)
    kw = dict(heads=a.heads, head_dim=a.head_dim, dtype=torch.float32)
    out = {"seq_len": a.seq, "heads": a.heads, "head_dim": a.head_dim, "dtype": "float32", "causal": True,
           "layout": "zigzag", "cores": os.cpu_count(), "repeats": a.repeats, "load_before": load(), "worlds": {}}
    for n in [int(w) for w in a.worlds.split(",")]:
        t0 = time.time()
        with Cluster(n, device="cpu", timeout=600) as cluster:
            for v in names:                         # warm-up: first calls, first messages
                cluster.run(timers[v], a.seq, 1, **kw)
            rounds = []
            for i in range(a.repeats):
                order = names[i % len(names):] + names[:i % len(names)]
                rounds.append({v: max(t[0] for t in cluster.run(timers[v], a.seq, 1, warmup=False, **kw))
                               for v in order})
        med = {v: statistics.median(r[v] for r in rounds) for v in names}
        ratio = {f"{v}/ring": statistics.median(r[v] / r["ring"] for r in rounds) for v in ("allgather", "ulysses")}
        ratio["ring/alone"] = statistics.median(r["ring"] / r["alone"] for r in rounds)
        out["worlds"][n] = {"median_step_s": med, "ratios": ratio, "rounds": rounds, "wall_s": time.time() - t0,
                            "load_after": load()}
        print(f"n={n}: ring {med['ring'] * 1e3:.0f} ms, all-gather {med['allgather'] * 1e3:.0f} ms, Ulysses "
              f"{med['ulysses'] * 1e3:.0f} ms, every rank's work alone {med['alone'] * 1e3:.0f} ms | paired: "
              f"all-gather/ring {ratio['allgather/ring']:.2f}, Ulysses/ring {ratio['ulysses/ring']:.2f}, "
              f"ring/alone {ratio['ring/alone']:.2f} (load {out['worlds'][n]['load_after']} on {os.cpu_count()} cores)")
    path = write("context_parallel", out)
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return out


if __name__ == "__main__":
    main()
