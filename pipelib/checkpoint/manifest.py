"""The manifest, a checkpoint's commit record, and the step directories it commits.

    root/step-00000040/rank-00000.pt ...     every rank's shard (written first)
    root/step-00000040/manifest.json         written last: the step is committed once it exists
    committed_steps(root) -> [20, 30, 40]    read_manifest(root) -> the latest, or a clear error

The manifest says everything a loader needs without opening a shard: the step, the world and
its plan (mesh degrees), the fixed settings of the run (global batch, data order, model), and
for every tensor (`model/NAME`, `optim/NAME/exp_avg`, ...) its whole shape, dtype and the
pieces the files hold (`pipelib.checkpoint.pieces`), with each file's size and checksum.

Each save goes to a new step directory, so the last good checkpoint is never opened for
writing. A directory without a manifest is a save cut short: ignored by the loader, removed by
the next save of the same step and by pruning. Pruning keeps the last `keep` committed steps and
deletes older ones manifest first, so that a crash half-way through a deletion leaves an
uncommitted directory, never a committed one with files missing. (DCP writes `.metadata.tmp`,
removes an existing `.metadata`, then renames: saving over a checkpoint in place has a moment
with no metadata at all. A new directory per step, as torchtitan's `step-N`, has no such
moment: the old step is untouched until the new one is committed.)

Introduced in chapter 18.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field

from pipelib.checkpoint.errors import IncompatibleCheckpointError, NoCheckpointError
from pipelib.checkpoint.files import FileRecord

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


@dataclass(frozen=True)
class Manifest:
    """What one committed checkpoint holds (JSON: `to_json`, `from_json`)."""

    step: int
    world_size: int
    tensors: dict            # {key: {"shape", "dtype", "pieces": [{"file", "shape", "split", "flat"}]}}
    files: tuple             # FileRecord of every file
    meta: dict = field(default_factory=dict)  # plan, recipe, placements, optimizer groups
    fixed: dict = field(default_factory=dict)  # what may not change across a resume
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "step": self.step, "world_size": self.world_size,
                           "fixed": self.fixed, "meta": self.meta, "files": [f.to_dict() for f in self.files],
                           "tensors": self.tensors}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        if d.get("version") != FORMAT_VERSION:
            raise IncompatibleCheckpointError(f"manifest version {d.get('version')!r}; this pipelib reads "
                                              f"version {FORMAT_VERSION}")
        return cls(step=d["step"], world_size=d["world_size"], tensors=d["tensors"],
                   files=tuple(FileRecord.from_dict(f) for f in d["files"]), meta=d["meta"],
                   fixed=d["fixed"], version=d["version"])

    def file(self, name: str) -> FileRecord:
        for f in self.files:
            if f.name == name:
                return f
        raise IncompatibleCheckpointError(f"manifest of step {self.step}: no file {name!r}; it lists "
                                          f"{[f.name for f in self.files]}")

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.files)


def _dirs(root: str) -> dict[int, str]:
    if not os.path.isdir(root):
        return {}
    return {int(m.group(1)): os.path.join(root, n) for n in os.listdir(root) if (m := _STEP_DIR.match(n))}


def is_committed(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MANIFEST))


def committed_steps(root: str) -> list[int]:
    """The steps under `root` whose manifest exists, oldest first."""
    return sorted(s for s, d in _dirs(root).items() if is_committed(d))


def read_manifest(root: str, step: int | None = None) -> Manifest:
    """The manifest of `step` (default: the latest committed) under `root`, or a clear error."""
    steps = committed_steps(root)
    partial = sorted(s for s, d in _dirs(root).items() if not is_committed(d))
    if step is None:
        if not steps:
            raise NoCheckpointError(f"no committed checkpoint under {root!r}: "
                                    + (f"step directories {partial} have no {MANIFEST} (saves cut short)"
                                       if partial else "no step-NNNNNNNN directory at all")
                                    + "; start from scratch or point at another directory")
        step = steps[-1]
    elif step not in steps:
        raise NoCheckpointError(f"no committed checkpoint of step {step} under {root!r}; committed: {steps}"
                                + (f", cut short: {partial}" if partial else ""))
    with open(os.path.join(step_dir(root, step), MANIFEST)) as f:
        return Manifest.from_json(f.read())


def remove_partial(root: str, step: int) -> None:
    """Delete the uncommitted directory of `step` a crashed save left (never a committed one)."""
    d = step_dir(root, step)
    if os.path.isdir(d) and not is_committed(d):
        shutil.rmtree(d)


def prune(root: str, keep: int, writer) -> list[int]:
    """Keep the last `keep` committed steps; delete older steps (manifest first, so a crash in the
    middle leaves an uncommitted directory) and directories of saves cut short before the latest.
    Returns the steps deleted. The latest committed step is never touched."""
    if keep < 1:
        raise ValueError(f"prune: keep={keep}; keep at least the last checkpoint (keep >= 1)")
    steps = committed_steps(root)
    if not steps:
        return []
    latest = steps[-1]
    doomed = steps[:-keep] + [s for s, d in _dirs(root).items() if s < latest and not is_committed(d)]
    for s in sorted(doomed):
        d = step_dir(root, s)
        if is_committed(d):
            os.remove(os.path.join(d, MANIFEST))  # uncommit first
            writer.fsync_dir(d)
        shutil.rmtree(d)
    if doomed:
        writer.fsync_dir(root)
    return sorted(doomed)
