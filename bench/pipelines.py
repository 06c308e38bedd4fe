"""pipelib's pipeline executor vs torch.distributed.pipelining, and the simulated clock vs simulate().

1. Step time on real CPU engines (Cluster(device="cpu")): GPipe, 1F1B, interleaved 1F1B and
   ZB-V on p = 2 and 4 ranks. Both sides run the same MLP (same seed, stage boundaries and
   placement: `pipeline_torch.compare_step_times`, which also checks that both give the same
   gradients). A repeat builds both once and alternates them step by step (pipelib first on
   even steps, torch first on odd), `--steps` timed steps each after one warm-up step (torch
   infers shapes on its first step, pipelib does its shape handshake once). Each step starts
   from a barrier; its time is the slowest rank's. A repeat's value is the median of its
   steps; we report the median over repeats per side, their ratio pipelib / torch (below 1.0:
   pipelib faster) and the median of the per-step paired ratios (more robust when the load of
   a shared machine drifts). With ablation (default), pipelib also runs with the settings it
   had before this benchmark: comms' header on every message (check=True) and each receive
   posted just before its compute (recv_ahead=0), each change alone, and one receive posted
   ahead instead of two (recv_ahead=1); and on a cluster that counts saved
   activations on its CPU engines too (Cluster(track_memory=True): a Python hook per saved
   tensor, off by default on real devices).
   The ranks share the machine's cores (2 on the reference machine, one thread per rank): with
   p = 4 two ranks share a core. The model is sized so compute dominates: hidden 512, 32 rows
   per microbatch, one (512 x 512) matmul per layer and microbatch is ~17 MFLOP forward, tens of
   ms per stage and microbatch, against 64 KiB messages (~0.5 ms each on loopback gloo).
2. Fidelity of the simulated clock, every schedule: a 4-rank sim cluster with the virtual
   clock runs `run_train_step` with `Costs`; the measured timeline (what the executor really
   ran, timed by the device model) is compared with `simulate()`: max |difference| of per-rank
   busy and idle time and of the step time (all should be 0 up to rounding).

Writes bench/results/pipelines.json.

    .venv/bin/python bench/pipelines.py [--quick] [--repeats 7] [--steps 5] [--worlds 2,4] [--no-ablation]
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

SCHEDULES = ["gpipe", "1f1b", "interleaved_1f1b", "zbv"]
TARGET = {"gpipe": 1.0, "1f1b": 1.0, "interleaved_1f1b": 1.1, "zbv": 1.1}  # pipelib / torch
# pipelib's executor before this benchmark (header on every message, each receive posted just
# before its compute), and each change alone
ABLATION = [{"check": True, "recv_ahead": 0}, {"check": True, "recv_ahead": 2},
            {"check": False, "recv_ahead": 0}, {"check": False, "recv_ahead": 1}]




def compare(cluster, name, p, m, cfg, rows, repeats, steps, **kw) -> dict:
    """`repeats` runs of `run_compare_step_times` (pipelib and torch alternating step by step)."""
    from pipelib.pipeline.torch_twin import run_compare_step_times

    got = {"pipelib": [], "torch": []}
    paired = []
    for _ in range(repeats):
        r = run_compare_step_times(cluster, name, p, m, cfg, batch_size=rows * m, steps=steps,
                                   timeout=600, **kw)
        for side in got:
            got[side].append(r[side]["median_s"])
        paired += [a / b for a, b in zip(r["pipelib"]["steps_s"], r["torch"]["steps_s"])]
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"schedule": name, "p": p, "m": m, **kw, "pipelib_s": med["pipelib"],
            "torch_s": med["torch"], "ratio": med["pipelib"] / med["torch"],
            "ratio_paired_median": statistics.median(paired), "target": TARGET[name],
            "pipelib_repeats_s": got["pipelib"], "torch_repeats_s": got["torch"]}


def fidelity(p: int = 4, m: int = 8) -> list[dict]:
    """Every schedule on a sim cluster (virtual clock): measured timeline vs simulate()."""
    from pipelib import Cluster
    from pipelib.costmodel import get_profile
    from pipelib.model import MLPConfig
    from pipelib.pipeline.schedules import GENERATORS, resolve_schedule
    from pipelib.pipeline.simulate import Costs, simulate
    from pipelib.pipeline.step import run_train_step
    from pipelib.trace import Kind

    cfg = MLPConfig(in_features=16, hidden=16, out_features=10, num_layers=4 * p)
    out = []
    with Cluster(p, timeout=120) as cluster:
        profile = get_profile(cluster.spec.profile)
        costs = Costs(F=1e-3, B=2e-3, I=1e-3, W=1e-3, p2p=profile.message_time,
                      message_bytes=2 * cfg.hidden * 4)
        for name in GENERATORS:
            s = resolve_schedule(name, p, m)
            cluster.reset()
            run_train_step(cluster, name, p, m, cfg, costs=costs, timeout=300)
            measured = cluster.trace().filter(kind=Kind.COMPUTE)
            predicted = simulate(s, costs).events.filter(kind=Kind.COMPUTE)
            row = {"schedule": name, "p": p, "m": m, "actions": sum(len(a) for a in s.actions),
                   "step_measured_s": measured.end, "step_simulated_s": predicted.end,
                   "step_abs_diff_s": abs(measured.end - predicted.end)}
            busy = [abs(measured.busy(r) - predicted.busy(r)) for r in range(p)]
            idle = [abs((measured.end - measured.busy(r)) - (predicted.end - predicted.busy(r)))
                    for r in range(p)]
            row.update(busy_max_abs_diff_s=max(busy), idle_max_abs_diff_s=max(idle),
                       same_order=all([(e.label, e.stage, e.microbatch) for e in measured.filter(rank=r)]
                                      == [(e.label, e.stage, e.microbatch) for e in predicted.filter(rank=r)]
                                      for r in range(p)))
            out.append(row)
            print(f"{name:>24}: step {1e3 * row['step_measured_s']:8.3f} ms measured, "
                  f"{1e3 * row['step_simulated_s']:8.3f} ms simulated; max |diff| step "
                  f"{row['step_abs_diff_s']:.1e} s, busy {row['busy_max_abs_diff_s']:.1e} s, idle "
                  f"{row['idle_max_abs_diff_s']:.1e} s; same order: {row['same_order']}")
    return out


def main(argv=None):
    from pipelib import Cluster
    from pipelib.model import MLPConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps (CI)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--rows", type=int, default=32, help="rows per microbatch")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--ablation", action=argparse.BooleanOptionalAction, default=None,
                    help="also time pipelib with the header check and/or without receives "
                         "posted ahead (default: on, off with --quick)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 7)
    steps = args.steps or (2 if args.quick else 5)
    args.ablation = not args.quick if args.ablation is None else args.ablation
    results = {"repeats": repeats, "steps": steps, "hidden": args.hidden, "rows": args.rows,
               "cpu_count": os.cpu_count(), "load_before": load(), "speed": [],
               "ablation": []}
    t0 = time.perf_counter()
    for p in [int(w) for w in args.worlds.split(",")]:
        m = 2 * p
        cfg = MLPConfig(in_features=args.hidden, hidden=args.hidden, out_features=10, num_layers=4 * p)
        print(f"\np={p}, m={m}: MLP {cfg.num_layers} layers, hidden {cfg.hidden}, {args.rows} rows per "
              f"microbatch; median of {repeats} repeats x {steps} steps")
        print(f"{'schedule':>18} {'pipelib ms':>11} {'torch ms':>9} {'ratio':>6} {'paired':>6} {'target':>6}")
        with Cluster(p, device="cpu", timeout=300) as cluster:
            for name in args.schedules.split(","):
                row = compare(cluster, name, p, m, cfg, args.rows, repeats, steps)
                results["speed"].append(row)
                print(f"{name:>18} {1e3 * row['pipelib_s']:11.2f} {1e3 * row['torch_s']:9.2f} "
                      f"{row['ratio']:6.3f} {row['ratio_paired_median']:6.3f} {row['target']:6.2f}")
            if args.ablation:
                print("  what the two optimisations bring (pipelib / torch with older settings):")
                for name in args.schedules.split(","):
                    for kw in ABLATION:
                        row = compare(cluster, name, p, m, cfg, args.rows, repeats, steps, **kw)
                        results["ablation"].append(row)
                        print(f"{name:>18} {str(kw):>34} ratio {row['ratio']:6.3f} paired "
                              f"{row['ratio_paired_median']:6.3f}")
        if args.ablation:
            with Cluster(p, device="cpu", timeout=300, track_memory=True) as cluster:
                for name in args.schedules.split(","):
                    row = compare(cluster, name, p, m, cfg, args.rows, repeats, steps)
                    row["track_memory"] = True
                    results["ablation"].append(row)
                    print(f"{name:>18} {'track_memory=True':>34} ratio {row['ratio']:6.3f} paired "
                          f"{row['ratio_paired_median']:6.3f}")
    results["load_after_speed"] = load()
    print("\nsimulated clock vs simulate(), 4 ranks, m=8")
    results["fidelity"] = fidelity()
    results["load_after"] = load()
    results["seconds"] = time.perf_counter() - t0
    path = write("pipelines", results)
    print(f"\nwrote {path} ({results['seconds']:.0f} s; load: {results['load_after']})")


if __name__ == "__main__":
    main()
