"""The strategy planner's speed: strategies evaluated per second, and a whole search's time.

Searches every layout `pipelib.planner.strategys` enumerates for GPT-3 175B on 1024 A100s
(global batch 1536, Narayanan et al. 2021's run), with context parallelism 1 and 2, and
reports strategies per second and the search's seconds, beside the machine's load; then the
comparison with published runs (`pipelib.planner.published`): its seconds and each row's error.

Target (issue 22): a search over every plan for GPT-3 175B on 1024 GPUs in under 10 s on one
laptop core.

Writes bench/results/planner.json.

    .venv/bin/python bench/planner.py
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import load, write  # noqa: E402

from pipelib.costmodel import LINKS, PROFILES  # noqa: E402
from pipelib.planner.search import explain, search, strategies  # noqa: E402
from pipelib.planner.published import comparison  # noqa: E402
from pipelib.planner.spec import GPT3_175B, Machine  # noqa: E402


def main() -> None:
    machine = Machine(PROFILES["a100"], gpus_per_node=8, inter_node=LINKS["ib-ndr"])
    args = (GPT3_175B, machine, 1024, 1536)
    n = sum(1 for _ in strategies(*args, cp=(1, 2)))
    start = time.perf_counter()
    found = search(*args, cp=(1, 2))
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    efficiency, rows = comparison()  # a calibration (a bisection of searches) and a search per published run
    published_seconds = time.perf_counter() - start
    data = {"model": GPT3_175B.name, "devices": 1024, "strategies": n, "feasible": len(found),
            "search_seconds": seconds, "layouts_per_second": n / seconds, "target_seconds": 10.0,
            "best": explain(found[0]) if found else None, "published_seconds": published_seconds,
            "published_efficiency": efficiency,
            "published_errors": {r["run"]: r["error"] for r in rows}, "load": load()}
    print(f"{n} strategies ({len(found)} feasible) in {seconds:.2f} s: {n / seconds:,.0f} a second "
          f"(target: the whole search under 10 s); load {data['load']}")
    print(f"published comparison in {published_seconds:.1f} s (efficiency {efficiency:.1%}): "
          + ", ".join(f"{r['run']} {r['error']:+.1%}" for r in rows))
    print(write("planner", data))


if __name__ == "__main__":
    main()
