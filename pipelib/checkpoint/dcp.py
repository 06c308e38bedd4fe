"""`torch.distributed.checkpoint` (DCP) beside pipelib's checkpoints: the same tensors, converted.

    dcp_save_whole(tensors, path)              # {key: whole tensor} as a DCP checkpoint
    tensors = dcp_load_whole(path)             # and back, in one process
    to_dcp(root, path); from_dcp(path, root)   # a pipelib checkpoint as DCP's, and DCP's as pipelib's

DCP is torch's own sharded checkpoint (torchtitan, FSDP2): each rank writes `__R_0.distcp`
files, the coordinator writes `.metadata` last (`FileSystemWriter.finish`: `.metadata.tmp`,
fsync, then remove an existing `.metadata` and rename: overwriting a checkpoint in place has a
moment with no metadata, which step directories avoid), and a load plan reads, for each
tensor, the chunks a rank needs: resharding by the saved chunks' offsets, as
`pipelib.checkpoint.pieces` does by placements. pipelib's pieces also express what a DTensor
cannot (q, k and v blocks split alone), so conversions go through whole tensors: a pipelib
checkpoint's tensors are assembled (`load_whole`) and saved by DCP as plain tensors, and a DCP
checkpoint's tensors are read whole and saved as one rank's whole pieces, with the step and
the settings that may not change carried over (`pipelib/step`, `pipelib/fixed` entries).

Both run in one process without a process group (DCP then saves as a single rank).
Introduced in chapter 18.
"""
from __future__ import annotations

import contextlib
import io
import json
import warnings

import torch

META_KEYS = ("pipelib/step", "pipelib/fixed", "pipelib/meta")


def dcp_save_whole(tensors: dict, path: str, *, extra: dict | None = None, sync: bool = True, group=None,
                   no_dist: bool = False):
    """Save {key: tensor} with DCP's FileSystemWriter at `path` (`extra`: JSON-able values
    stored as DCP byte entries). Every rank of `group` (default the world) calls it; replicated
    keys are written once. `no_dist=True`: this process alone, whatever process group exists."""
    import torch.distributed.checkpoint as dcp

    state = dict(tensors)
    for k, v in (extra or {}).items():
        state[k] = json.dumps(v)
    writer = dcp.FileSystemWriter(path, sync_files=sync)
    with _one_process():
        return dcp.save(state, storage_writer=writer, process_group=group, no_dist=no_dist)


@contextlib.contextmanager
def _one_process():
    """DCP warns that it assumes one process when there is no process group: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def dcp_keys(path: str) -> dict:
    """{key: (shape, dtype) or None for a non-tensor entry} of a DCP checkpoint, from its metadata."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(path).read_metadata()
    return {k: ((tuple(m.size), m.properties.dtype) if isinstance(m, TensorStorageMetadata) else None)
            for k, m in meta.state_dict_metadata.items()}


def dcp_load_whole(path: str, keys=None) -> dict:
    """{key: whole tensor} (and the JSON entries, decoded) of a DCP checkpoint, in this process
    alone (whatever process group exists)."""
    import torch.distributed.checkpoint as dcp

    info = dcp_keys(path)
    keys = list(info) if keys is None else list(keys)
    state = {k: (torch.empty(info[k][0], dtype=info[k][1]) if info[k] is not None else io.BytesIO()) for k in keys}
    with _one_process():
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    return {k: (v if torch.is_tensor(v) else _json_entry(v)) for k, v in state.items()}


def _json_entry(v):
    """A JSON entry as DCP hands it back: into a BytesIO, torch-saved (read with weights_only)."""
    if isinstance(v, io.BytesIO):
        v.seek(0)
        v = torch.load(v, weights_only=True)
    return json.loads(v) if isinstance(v, str) else v


def to_dcp(root: str, path: str, step: int | None = None) -> int:
    """Convert pipelib's checkpoint of `step` (default the latest) under `root` into a DCP
    checkpoint at `path`; returns the step."""
    from pipelib.checkpoint.manifest import read_manifest
    from pipelib.checkpoint.sharded import load_whole

    manifest = read_manifest(root, step)
    dcp_save_whole(load_whole(root, manifest.step), path,
                   extra={"pipelib/step": manifest.step, "pipelib/fixed": manifest.fixed,
                          "pipelib/meta": manifest.meta}, no_dist=True)
    return manifest.step


def from_dcp(path: str, root: str, step: int | None = None, *, keep: int | None = None):
    """Convert the DCP checkpoint at `path` into pipelib's, as step `step` (default the one the
    conversion to DCP recorded) under `root`; returns its SaveResult."""
    from pipelib.checkpoint.pieces import Piece
    from pipelib.checkpoint.sharded import save_sharded

    whole = dcp_load_whole(path)
    tensors = {k: (t, Piece(tuple(t.shape))) for k, t in whole.items() if torch.is_tensor(t)}
    step = whole.get("pipelib/step") if step is None else step
    if step is None:
        raise ValueError(f"from_dcp: {path} records no pipelib step; pass step=")
    return save_sharded(root, step, tensors, meta=whole.get("pipelib/meta") or {},
                        fixed=whole.get("pipelib/fixed") or {}, keep=keep, alone=True)
