"""Save and load a sharded checkpoint: every rank writes its own file, rank 0 commits the manifest.

    result = save_sharded(root, step, {key: (tensor, piece)}, extra={...}, fixed={...}, keep=2)
    loaded = load_sharded(root, {key: piece}, fixed={...})   # this layout's pieces, from any layout

Who does what on a save (every rank of the world calls it; no process group: one rank):

1. every rank refuses a step already committed (the last good checkpoint is never touched);
   rank 0 removes what a crashed save of the same step left and makes the step directory;
2. the ranks exchange the list of their pieces (one `all_gather_object` of a few hundred bytes
   per tensor): a piece several ranks hold alike (a replicated weight, a tied embedding on the
   first and last pipeline stages) is written once, by the lowest rank holding it, as DCP's
   planner deduplicates;
3. every rank writes `rank-NNNNN.pt`: its pieces and its own `extra` (random states, step,
   data position), temp name, fsync, rename (`pipelib.checkpoint.files`);
4. rank 0 gathers every file's size and checksum and writes the manifest last, the commit
   (`pipelib.checkpoint.manifest`), then prunes to the last `keep`; a barrier lets no rank
   return before the step is committed.

Loading needs no process group: each rank reads the manifest, checks what may not change,
and for each tensor it needs assembles the whole tensor from the saved pieces (files read
lazily, each checksummed once) and cuts its own piece: "gather by placement, split by the new
placement", through the file system, as DCP's load plan reads only the chunks it needs.

Introduced in chapter 18.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelib.checkpoint.errors import IncompatibleCheckpointError
from pipelib.checkpoint.files import Writer, read_tensors
from pipelib.checkpoint.manifest import (MANIFEST, Manifest, is_committed, prune, rank_file, read_manifest,
                                         remove_partial, step_dir)
from pipelib.checkpoint.pieces import Piece, check_covered


@dataclass(frozen=True)
class SaveResult:
    """One rank's view of a save: where, how many bytes it wrote, fsyncs, seconds, steps pruned."""

    step: int
    directory: str
    nbytes: int
    fsyncs: int
    seconds: float
    pruned: tuple[int, ...] = ()


@dataclass(frozen=True)
class Loaded:
    """What a load hands back: {key: this rank's piece}, this rank's saved `extra` (None when the
    saved world had no such rank), the manifest, and the bytes read."""

    tensors: dict
    extra: dict | None
    manifest: Manifest
    nbytes_read: int


def _rank_world(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def save_sharded(root: str, step: int, tensors: dict, *, extra: dict | None = None, meta: dict | None = None,
                 fixed: dict | None = None, keep: int | None = None, fault=None, algorithm: str = "crc32",
                 group=None, sync: bool = True, alone: bool = False) -> SaveResult:
    """Save this rank's `tensors` ({key: (local tensor, Piece)}) as step `step` under `root`;
    `meta` and `fixed` are taken from rank 0. `fault(event)` is called before each step of
    the write (a test's crash). `alone=True`: this process is the only rank (a conversion),
    whatever process group exists. Returns this rank's `SaveResult`."""
    t0 = time.perf_counter()
    rank, world = (0, 1) if alone else _rank_world(group)
    directory = step_dir(root, step)
    if is_committed(directory):
        raise FileExistsError(f"save: step {step} is already committed in {directory}; a checkpoint is never "
                              f"overwritten (the last good one must survive a crash): save a later step")
    writer = Writer(fault=fault, algorithm=algorithm, sync=sync)
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        remove_partial(root, step)
        os.makedirs(directory)
    mine = {k: (piece.to_dict(), _dtype_name(t.dtype)) for k, (t, piece) in tensors.items()}
    everyone = [mine]
    if world > 1:
        everyone = [None] * world
        dist.all_gather_object(everyone, mine, group=group)
    owner = {}
    for r, theirs in enumerate(everyone):  # the lowest rank holding a piece writes it
        for key, (piece, _) in theirs.items():
            owner.setdefault((key, repr(piece)), r)
    written = {k: t.detach().contiguous() for k, (t, piece) in tensors.items()
               if owner[(k, repr(mine[k][0]))] == rank}
    record = writer.save_tensors(directory, rank_file(rank), {"tensors": written, "extra": extra or {}}, rank)
    records = [record]
    if world > 1:
        records = [None] * world if rank == 0 else None
        dist.gather_object(record, records, dst=dist.get_global_rank(group, 0) if group is not None else 0,
                           group=group)
    pruned = ()
    if rank == 0:
        table = {}
        for (key, _), r in sorted(owner.items(), key=lambda kv: (kv[0][0], kv[1])):
            piece, dtype = everyone[r][key]
            entry = table.setdefault(key, {"shape": piece["shape"], "dtype": dtype, "pieces": []})
            if piece["shape"] != entry["shape"] or dtype != entry["dtype"]:
                raise ValueError(f"save: ranks disagree on {key}: shape {entry['shape']} / {piece['shape']}, "
                                 f"dtype {entry['dtype']} / {dtype}")
            entry["pieces"].append({"file": rank_file(r), **piece})
        manifest = Manifest(step=step, world_size=world, tensors=table, files=tuple(records),
                            meta=meta or {}, fixed=fixed or {})
        writer.write_bytes(directory, MANIFEST, manifest.to_json().encode())  # the commit
        writer.fsync_dir(root)
        pruned = tuple(prune(root, keep, writer)) if keep else ()
    if world > 1:
        dist.barrier(group=group)  # nobody goes on before the step is committed
    return SaveResult(step, directory, writer.bytes_written, writer.fsyncs, time.perf_counter() - t0, pruned)


def check_fixed(manifest: Manifest, fixed: dict | None) -> None:
    """Raise naming every setting of `fixed` that differs from what the checkpoint was saved with."""
    diffs = [f"{k}: saved {manifest.fixed.get(k)!r}, now {v!r}" for k, v in (fixed or {}).items()
             if manifest.fixed.get(k, v) != v]
    if diffs:
        raise IncompatibleCheckpointError(
            f"checkpoint of step {manifest.step}: what may not change across a resume changed: "
            + "; ".join(diffs) + ". The degrees (dp, tp, pp, ZeRO stage) may change; the global batch, "
            "the data order, the model and the optimizer may not: restore them, or start a new run")


def check_names(manifest: Manifest, wanted: dict, expected: set | None = None) -> None:
    """Raise naming the tensors missing from the checkpoint, those it has that the model does not
    (`expected`: every model key of the whole model), and every shape or dtype that differs."""
    saved = {k for k in manifest.tensors if k.startswith("model/")}
    mine = {k for k in (expected if expected is not None else wanted) if k.startswith("model/")}
    missing, extra = sorted(mine - saved), sorted(saved - mine) if expected is not None else []
    shapes = [f"{k}: saved {tuple(manifest.tensors[k]['shape'])}, now {tuple(p.shape)}" for k, p in wanted.items()
              if k in manifest.tensors and tuple(manifest.tensors[k]["shape"]) != tuple(p.shape)]
    if missing or extra or shapes:
        raise IncompatibleCheckpointError(
            f"checkpoint of step {manifest.step} is of another model: "
            + (f"missing {missing[:6]}{'...' if len(missing) > 6 else ''} ({len(missing)}); " if missing else "")
            + (f"not in this model {extra[:6]}{'...' if len(extra) > 6 else ''} ({len(extra)}); " if extra else "")
            + (f"shapes differ: {'; '.join(shapes[:6])}" if shapes else "")
            + ". Load it into the model it was saved from")


def load_sharded(root: str, wanted: dict, *, step: int | None = None, fixed: dict | None = None,
                 expected: set | None = None, rank: int | None = None, verify: bool = True) -> Loaded:
    """This rank's pieces `wanted` ({key: Piece}) from the checkpoint of `step` (default the
    latest committed) under `root`, laid out as asked whatever the saved layout."""
    manifest = read_manifest(root, step)
    check_names(manifest, wanted, expected)
    check_fixed(manifest, fixed)
    directory = step_dir(root, manifest.step)
    rank = _rank_world(None)[0] if rank is None else rank
    files: dict[str, dict] = {}

    def read(name):
        if name not in files:
            files[name] = read_tensors(directory, manifest.file(name), verify=verify)
        return files[name]

    out = {}
    for key, piece in wanted.items():
        entry = manifest.tensors.get(key)
        if entry is None:
            raise IncompatibleCheckpointError(f"checkpoint of step {manifest.step} has no {key}; it has "
                                              f"{sorted(manifest.tensors)[:8]}...")
        saved = [(p["file"], Piece.from_dict(p)) for p in entry["pieces"]]
        same = [f for f, p in saved if p == piece or p.whole]
        if same:  # held alike (or whole) in one file: no assembly
            p = dict(saved)[same[0]]
            t = read(same[0])["tensors"][key]
            out[key] = t if p == piece else piece.cut(t)
            continue
        check_covered(key, entry["shape"], [p for _, p in saved])
        full = torch.zeros(entry["shape"], dtype=getattr(torch, entry["dtype"]))
        for f, p in saved:
            p.put(full, read(f)["tensors"][key])
        out[key] = piece.cut(full)
    own = rank_file(rank)
    extra = read(own)["extra"] if any(f.name == own for f in manifest.files) else None
    nbytes = sum(manifest.file(n).nbytes for n in files)
    return Loaded(out, extra, manifest, nbytes)


def load_whole(root: str, step: int | None = None, *, verify: bool = True) -> dict:
    """{key: whole tensor} of every tensor of a checkpoint, in one process, no process group
    (a check, a conversion, a look at what a run saved)."""
    manifest = read_manifest(root, step)
    wanted = {k: Piece(tuple(e["shape"])) for k, e in manifest.tensors.items()}
    return load_sharded(root, wanted, step=manifest.step, rank=-1, verify=verify).tensors
