"""pipelib's ZeRO-3 against torch's FSDP2, and ZeRO-3's throughput penalty against plain data
parallelism, on real CPU engines, side by side in one run.

`measure(world_size)` starts `Cluster(world_size, device="cpu")` and builds, on every rank, the
same MLP three times (`pipelib.data_parallel.zero_bench`): pipelib's ZeRO-3, pipelib's stage 0
(one all-reduce per layer: the DDP-like baseline) and torch's FSDP2 (`fully_shard`), all with
torch's Adam. After a warm-up step each, it times `steps` rounds; in each round the three run
one step each, in an order that rotates from round to round, and a step's time is the slowest
rank's. Reported: medians and the ratios zero3 / fsdp2 (target <= 1.15) and zero3 / zero0 (the
penalty of gathering parameters: one more psi of traffic per step, seed 003 says 5-15 % on
GPUs; here compute is slow and the link is loopback, so the number says what this machine does).

The model is sized so that messages are large (a 1024 x 1024 layer is 4 MiB in fp32: pipelib's
Python ring reaches most of gloo's bandwidth there, chapter 06) and compute is not negligible.
`main` also times DeepSpeed's ZeRO-3 on the same model (`--no-deepspeed` skips it): in its own
processes after the cluster stopped, so not side by side, and without its set-up step. Nothing
is compiled (`pipelib.data_parallel.deepspeed_twin`), so no build lands in any time.

    .venv/bin/python bench/data_parallel_zero.py [--worlds 2,4] [--steps 7] [--quick] [--no-deepspeed]

Writes bench/results/data_parallel_zero.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, also when imported by path
from _results import load, write  # noqa: E402

from pipelib.model import MLPConfig  # noqa: E402
from pipelib.recipe import Recipe  # noqa: E402

SPEC = Recipe(MLPConfig(in_features=1024, hidden=1024, out_features=1024, num_layers=4), lr=1e-3)
TARGET = 1.15  # pipelib ZeRO-3 / torch FSDP2
ORDER = ("zero3", "fsdp2", "zero0")


def measure(world_size: int, steps: int = 7, batch_per_rank: int = 64, spec: Recipe | None = None,
            deepspeed: bool = False) -> dict:
    """Median step times (seconds) of zero3, fsdp2 and zero0 on `world_size` CPU engines, and
    the ratios zero3/fsdp2 and zero3/zero0. With `deepspeed`, also DeepSpeed's ZeRO-3 on the
    same model, in its own processes after the cluster stopped (not interleaved: a looser
    comparison), its first step (set-up) left out; nothing is compiled."""
    from pipelib import Cluster
    from pipelib.data_parallel.zero_bench import zero_bench_setup, zero_bench_times

    spec = (spec or SPEC).replace(batch_size=batch_per_rank * world_size)
    with Cluster(world_size, device="cpu", timeout=600) as cluster:
        psi = cluster.run(zero_bench_setup, spec)[0]
        times = cluster.run(zero_bench_times, ORDER, steps)[0]  # in turn, the slowest rank's times
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = {}
    if deepspeed:
        from pipelib.data_parallel.deepspeed_twin import run_deepspeed

        ds = run_deepspeed(spec.replace(steps=steps + 1), 3, world_size=world_size)
        extra = {"deepspeed_zero3_s": statistics.median(ds.times[1:]),
                 "zero3_over_deepspeed_zero3": med["zero3"] / statistics.median(ds.times[1:]),
                 "deepspeed_init_s": ds.stats["init_seconds"]}
    return {**extra, "world_size": world_size, "psi": psi, "recipe": spec.to_dict(), "batch_per_rank": batch_per_rank,
            "steps": steps, "median_s": med, "times_s": times,
            "zero3_over_fsdp2": med["zero3"] / med["fsdp2"], "target": TARGET,
            "zero3_over_zero0": med["zero3"] / med["zero0"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 steps, world size 2 only")
    ap.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeed's ZeRO-3 timing")
    a = ap.parse_args(argv)
    worlds = [2] if a.quick else [int(w) for w in a.worlds.split(",")]
    steps = 3 if a.quick else a.steps
    t0 = time.time()
    rows = [measure(n, steps, deepspeed=not a.no_deepspeed) for n in worlds]
    out = {"benchmark": "data_parallel_zero", "rows": rows, "seconds": time.time() - t0,
           "load": load()}
    write("data_parallel_zero", out)
    for r in rows:
        print(f"n={r['world_size']}: zero3 {r['median_s']['zero3'] * 1e3:.1f} ms, fsdp2 "
              f"{r['median_s']['fsdp2'] * 1e3:.1f} ms, zero0 {r['median_s']['zero0'] * 1e3:.1f} ms; "
              f"zero3/fsdp2 {r['zero3_over_fsdp2']:.3f} (target <= {TARGET}), "
              f"zero3/zero0 {r['zero3_over_zero0']:.3f}"
              + (f"; DeepSpeed ZeRO-3 {r['deepspeed_zero3_s'] * 1e3:.1f} ms (separate run)"
                 if "deepspeed_zero3_s" in r else ""))
    return out


if __name__ == "__main__":
    main()
