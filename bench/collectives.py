"""From-scratch ring all-reduce (pipelib.collectives) vs gloo's built-in dist.all_reduce.

Real CPU engines, world 2 and 4, 1 KiB .. 64 MiB. A and B alternate within every repeat (same
tensors, same moment), each timed between barriers on every rank; the time of a repeat is the
slowest rank's; we report medians and the bandwidth ratio built-in time / ours (1.0 = as fast
as gloo). Also times the metadata check (one 12-integer all-gather) that every call pays by
default. Writes bench/results/collectives.json.

    .venv/bin/python bench/collectives.py [--quick] [--repeats 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _bench(sizes, repeats):
    import time

    import torch
    import torch.distributed as dist

    from pipelib import collectives as C

    out = {}
    for nbytes in sizes:
        x = torch.randn(nbytes // 4)
        a, b = x.clone(), x.clone()
        C.all_reduce(a)  # warm-up, and the results must agree
        dist.all_reduce(b)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-3)
        rows = {"ours": [], "gloo": [], "ours_nocheck": []}
        for _ in range(repeats):
            for name in rows:
                y = x.clone()
                dist.barrier()
                t0 = time.perf_counter()
                if name == "gloo":
                    dist.all_reduce(y)
                else:
                    C.all_reduce(y, check=name == "ours")
                rows[name].append(time.perf_counter() - t0)
        out[nbytes] = rows
    return out


def main(argv=None):
    from pipelib import Cluster

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (CI)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--worlds", default="2,4")
    args = p.parse_args(argv)
    top = 22 if args.quick else 26
    sizes = [2**k for k in range(10, top + 1, 2)]
    repeats = args.repeats or (3 if args.quick else 7)
    results = {"sizes": sizes, "repeats": repeats, "cpu_count": os.cpu_count(), "worlds": {}}
    for n in [int(w) for w in args.worlds.split(",")]:
        with Cluster(n, device="cpu", timeout=300) as cluster:
            per_rank = cluster.run(_bench, sizes, repeats, timeout=3000)
        table = []
        print(f"\nworld {n}: ring all-reduce (ours) vs gloo dist.all_reduce, median of {repeats}")
        print(f"{'size':>9} {'ours ms':>9} {'gloo ms':>9} {'nocheck ms':>10} {'ours GB/s':>9} {'gloo GB/s':>9} {'ratio':>6} {'check cost':>10}")
        for nbytes in sizes:
            med = {k: statistics.median(max(r[nbytes][k][i] for r in per_rank) for i in range(repeats))
                   for k in ("ours", "gloo", "ours_nocheck")}
            bus = 2 * (n - 1) / n * nbytes  # bus bandwidth convention (nccl-tests)
            row = {"bytes": nbytes, **{f"{k}_s": v for k, v in med.items()},
                   "ours_busbw": bus / med["ours"], "gloo_busbw": bus / med["gloo"],
                   "ratio": med["gloo"] / med["ours"], "ratio_nocheck": med["gloo"] / med["ours_nocheck"],
                   "check_cost_s": med["ours"] - med["ours_nocheck"]}
            table.append(row)
            size = f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 1024} KiB"
            print(f"{size:>9} {1e3 * med['ours']:9.3f} {1e3 * med['gloo']:9.3f} {1e3 * med['ours_nocheck']:10.3f} "
                  f"{row['ours_busbw'] / 1e9:9.3f} {row['gloo_busbw'] / 1e9:9.3f} {row['ratio']:6.2f} "
                  f"{1e3 * row['check_cost_s']:8.3f}ms")
        results["worlds"][n] = table
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "collectives.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
