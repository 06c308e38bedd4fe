"""The gpu-check table, printed, and the same rows as JSON.

One line per row: the check, what it is held against, the tolerance, the largest difference
measured, ok / FAIL / skip, pipelib's median step time and its twin's (with the twin's name),
the peak memory of the most loaded rank (every rank's is in the JSON), and for a failing row
what failed (the tensor and by how much, or the error's first line).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pipelib.gpucheck.rows import Row, memory_source_of

COLUMNS = ("check", "against", "tol", "max |diff|", "status", "pipelib", "twin", "torch's", "peak MiB", "note")


@dataclass(frozen=True)
class Report:
    """Every row of one gpu-check run, and where it ran."""

    device: str            # "cuda" or "cpu"
    backend: str           # "nccl" or "gloo"
    world: int
    devices: tuple[str, ...]   # each rank's device, as its engine reported it
    torch_version: str
    rows: tuple[Row, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def memory_source(self) -> tuple[str, str]:
        """(name, what it counts) of the memory column's source on this device."""
        return memory_source_of(self.device)

    def to_dict(self) -> dict:
        name, means = self.memory_source
        return {"device": self.device, "backend": self.backend, "world": self.world, "devices": list(self.devices),
                "torch": self.torch_version, "memory_source": name, "memory_means": means,
                "seconds": self.seconds, "passed": self.passed, "rows": [r.to_dict() for r in self.rows]}

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    def table(self) -> str:
        """The printed table (module docstring), with a header saying where it ran."""
        name, means = self.memory_source
        head = [f"gpu-check: {self.world} rank(s) on {self.device} ({self.backend}), torch {self.torch_version}: "
                f"{', '.join(self.devices)}",
                f"times: median seconds per step (pipelib's beside torch's twin, raced step by step); "
                f"memory: the {name}'s peak on the busiest rank ({means})"]
        cells = [COLUMNS] + [_row_cells(r) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
        lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(widths))) + "  " + c[-1] for c in cells]
        failed = [r.name for r in self.rows if not r.passed]
        tail = (f"FAILED: {len(failed)} of {len(self.rows)} rows ({', '.join(failed)})" if failed else
                f"all {len(self.rows)} rows ok ({sum(r.status == 'skip' for r in self.rows)} skipped)")
        return "\n".join(head + [""] + [line.rstrip() for line in lines] + ["", f"{tail} in {self.seconds:.0f} s"])


def _number(x: float | None) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.1e}")


def _seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


def _row_cells(r: Row) -> tuple[str, ...]:
    m = r.measured
    peak = "-" if not m.memory else f"{max(m.memory) / 2**20:.1f}"
    note = r.failure or (f"skipped: {m.skipped}" if m.skipped else
                         m.note or (f"largest at {m.worst}" if m.worst else ""))
    return (r.name, r.against, _number(r.tolerance), _number(m.diff), r.status, _seconds(m.pipelib_s),
            r.twin or "-", _seconds(m.torch_s), peak, note)
