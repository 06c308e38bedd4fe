"""What a cluster's start-up is doing, shown while the reader waits (4-5 s on a 2-core laptop).

In a notebook, one line per phase goes to the cell's output: the engines starting, the engines
up, the ranks joined in torch.distributed. Plain stream text, so nbval (which compares outputs
only where a cell asks) and the static book keep it as it is; outside a notebook (tests,
scripts) nothing is printed unless asked.

Introduced in chapter 04.
"""
from __future__ import annotations

import sys
import time


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where a reader is watching the cell)."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and "ipykernel" in type(shell).__module__


class StartupProgress:
    """`say(text)` prints `text` with the seconds since start, when `on`; `done()` the total."""

    def __init__(self, on: bool | None = None):
        self.on = in_notebook() if on is None else bool(on)
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, text: str) -> None:
        if self.on:
            print(f"[{self.elapsed():5.1f} s] {text}", flush=True)
