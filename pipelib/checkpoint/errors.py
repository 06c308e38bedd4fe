"""What can be wrong with a checkpoint, one error type each, every message naming the values.

- `NoCheckpointError`: a directory with no committed step (no manifest: nothing was saved, or
  every save was cut before its commit);
- `MissingShardError`: the manifest lists a file that is not there;
- `CorruptCheckpointError`: a file whose size or checksum differs from the manifest's;
- `IncompatibleCheckpointError`: a checkpoint of another model (names, shapes, dtypes), or of a
  run whose fixed settings differ (global batch, data order, optimizer), or pieces that do not
  cover a tensor this layout needs.

All are `ValueError`s: the input is wrong, not the program. Introduced in chapter 18.
"""
from __future__ import annotations


class CheckpointError(ValueError):
    """Any checkpoint that cannot be loaded as asked."""


class NoCheckpointError(CheckpointError, FileNotFoundError):
    """No committed checkpoint where one was asked for."""


class MissingShardError(CheckpointError, FileNotFoundError):
    """A file the manifest lists is missing."""


class CorruptCheckpointError(CheckpointError):
    """A file's bytes differ from what the manifest recorded."""


class IncompatibleCheckpointError(CheckpointError):
    """The checkpoint is of another model or run, or cannot be laid out as asked."""
