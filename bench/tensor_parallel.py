"""pipelib's tensor parallelism against torch's DTensor TP, on real CPU engines, side by side.

The same GPT split three ways on t ranks, first its blocks alone (same seed, same input,
gradient of sum(y * w)), then the whole GPT (vocabulary-parallel embedding, head and loss:
torch's `loss_parallel` for DTensor; same tokens):
pipelib with its own ring collectives (`backend="pipelib"`, chapter 06's, traced), pipelib with
torch's built-in collectives (`backend="torch"`), and DTensor (`ColwiseParallel`,
`RowwiseParallel`; with `--sp` also `SequenceParallel`). `timed_tp_steps`
(`pipelib.tensor_parallel.dtensor_twin`) builds the three side by side on the same engines and
times forward + backward from a barrier to a barrier, one step of each in turn (the order
rotating every step), `--steps` steps after a warm-up. A repeat's value per side is its median
step; we report the median over repeats, the ratios pipelib / DTensor (below 1.0: pipelib
faster) and the median of the per-step paired ratios (each step against the DTensor step beside
it: robust when the load of a shared machine drifts). t = 2 uses ranks 0-1 of a
4-engine cluster (the others idle), t = 4 all four: both in one run. The ranks share the
machine's cores (2 on the reference machine); numbers are noisy, ratios less so.

Target (issue 14): pipelib TP step <= 1.1 x DTensor TP.

Writes bench/results/tensor_parallel.json.

    .venv/bin/python bench/tensor_parallel.py [--quick] [--repeats 5] [--steps 5] [--sp]
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _results import load, write  # noqa: E402  (bench/, the script's own folder)

IMPLS = ("pipelib", "pipelib-torch", "dtensor")
TARGET = 1.1




def compare(cluster, cfg, b, s, t, sp, repeats, steps, whole) -> dict:
    from pipelib.tensor_parallel.dtensor_twin import timed_tp_steps

    per = {impl: [] for impl in IMPLS}          # median step per repeat
    paired = {impl: [] for impl in IMPLS[:2]}   # per-step ratios against DTensor, all repeats
    for _ in range(repeats):
        res = cluster.run(timed_tp_steps, cfg, b, s, t, IMPLS, steps=steps, warmup=1, sequence_parallel=sp,
                          whole=whole)
        times = res[0].stats["times"]
        for impl in IMPLS:
            per[impl].append(statistics.median(times[impl]))
        for impl in paired:
            paired[impl] += [a / d for a, d in zip(times[impl], times["dtensor"])]
    med = {impl: statistics.median(v) for impl, v in per.items()}
    row = {"model": "whole GPT" if whole else "blocks", "t": t, "sequence_parallel": sp, "seconds": med,
           "per_repeat": per}
    for impl in paired:
        row[f"ratio {impl} / dtensor"] = med[impl] / med["dtensor"]
        row[f"paired ratio {impl} / dtensor"] = statistics.median(paired[impl])
    return row


def main(argv=None):
    from pipelib import Cluster
    from pipelib.model import GPTConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps (CI)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--sp", action=argparse.BooleanOptionalAction, default=True,
                    help="also sequence parallelism (default on)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    steps = args.steps or (3 if args.quick else 5)
    cfg = GPTConfig(vocab_size=256, block_size=args.seq, n_layer=2, n_head=8, n_embd=args.hidden)
    t0 = time.perf_counter()
    results = {"repeats": repeats, "steps": steps, "config": cfg.__dict__, "batch": args.batch,
               "seq": args.seq, "target": TARGET, "load_before": load(), "rows": []}
    with Cluster(4, device="cpu", timeout=300) as cluster:
        sps = (False, True) if args.sp else (False,)
        for whole, t, sp in itertools.product((False, True), (2, 4), sps):
            row = compare(cluster, cfg, args.batch, args.seq, t, sp, repeats, steps, whole)
            results["rows"].append(row)
            ms = {k: f"{v * 1e3:.1f} ms" for k, v in row["seconds"].items()}
            print(f"{row['model']:9} t={t} {'TP+SP' if sp else 'TP   '}: {ms}; pipelib/DTensor "
                  f"{row['ratio pipelib / dtensor']:.2f} (paired {row['paired ratio pipelib / dtensor']:.2f}), "
                  f"pipelib(torch collectives)/DTensor {row['ratio pipelib-torch / dtensor']:.2f} "
                  f"(paired {row['paired ratio pipelib-torch / dtensor']:.2f})")
    results["load_after"] = load()
    results["seconds"] = time.perf_counter() - t0
    best = {k: max(r[f"ratio {k} / dtensor"] for r in results["rows"]) for k in ("pipelib", "pipelib-torch")}
    paired = {k: max(r[f"paired ratio {k} / dtensor"] for r in results["rows"]) for k in ("pipelib", "pipelib-torch")}
    results["worst ratio"], results["worst paired ratio"] = best, paired
    results["meets target"] = {k: v <= TARGET for k, v in best.items()}
    results["meets target (paired)"] = {k: v <= TARGET for k, v in paired.items()}
    path = write("tensor_parallel", results)
    print(f"worst ratio over t and SP: {best}, worst paired ratio: {paired} (target <= {TARGET}); wrote {path} "
          f"({results['seconds']:.0f} s; load: {results['load_after']})")


if __name__ == "__main__":
    main()
