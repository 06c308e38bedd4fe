"""A crash injected at every step of a save, and what the loader finds afterwards.

    rows = crash_table(workdir)     # one row per crash point: exit code, latest step, bits equal

The save's steps are read from a save itself (`fault(event)`: before, during and after each
file, then the manifest). For each, a forked process saves step 2 over a committed step 1 and
dies there with `os._exit` (no cleanup, no `finally`: a killed process), and the parent loads
the latest committed checkpoint: it must be step 1, bit for bit, unless the crash came after
the manifest's rename (then step 2). Chapter 18 prints the table; tests/checkpoint checks the
same property on its own.

POSIX (`os.fork`). Introduced in chapter 18.
"""
from __future__ import annotations

import os

import torch

from pipelib.checkpoint.manifest import MANIFEST, read_manifest
from pipelib.checkpoint.pieces import Piece
from pipelib.checkpoint.sharded import load_whole, save_sharded

CRASH_EXIT = 17


def toy_state(step: int, numel: int = 4096) -> dict:
    """A small training-like state for step `step`: {key: (tensor, whole Piece)}."""
    g = torch.Generator().manual_seed(step)
    return {k: (torch.randn(numel, generator=g), Piece((numel,)))
            for k in ("model/w", "optim/w/exp_avg", "optim/w/exp_avg_sq")}


def save_events(workdir: str) -> list[str]:
    """The crash points of one save, in order, recorded from a save of the toy state."""
    seen: list[str] = []
    save_sharded(os.path.join(workdir, "events"), 1, toy_state(1), fault=seen.append, alone=True)
    return seen


def _crash_at(event: str):
    def fault(e: str) -> None:
        if e == event:
            os._exit(CRASH_EXIT)
    return fault


def crash_table(workdir: str) -> list[dict]:
    """One row per crash point of a save: the event, the child's exit code, the step the loader
    then finds, the step expected, and whether every tensor equals that step's bit for bit."""
    rows = []
    for i, event in enumerate(save_events(workdir)):
        root = os.path.join(workdir, f"crash{i}")
        save_sharded(root, 1, toy_state(1), alone=True)
        pid = os.fork()
        if pid == 0:
            try:
                save_sharded(root, 2, toy_state(2), fault=_crash_at(event), alone=True)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        latest = read_manifest(root).step
        expected = 2 if event == f"after {MANIFEST}" else 1
        whole = load_whole(root)
        equal = all(torch.equal(whole[k], t) for k, (t, _) in toy_state(latest).items())
        rows.append({"event": event, "exit": os.waitstatus_to_exitcode(status), "latest": latest,
                     "expected": expected, "equal": equal})
    return rows
