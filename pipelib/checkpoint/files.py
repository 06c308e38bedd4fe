"""Writing a file so that a crash leaves either nothing or the whole file, and reading it back checked.

    writer = Writer(fault=None)                     # counts its fsyncs
    record = writer.write_bytes(directory, "manifest.json", data)  # temp name, fsync, rename, fsync dir
    record = writer.save_tensors(directory, "rank-00000.pt", obj)  # torch.save, checksummed on the way
    obj = read_tensors(directory, record)           # the checksum checked, torch.load(weights_only=True)

POSIX gives one atomic step: `rename` of a file over a name in the same directory. So a file is
written under a temporary name (`.name.tmp`), flushed and fsynced (its bytes are on the disk),
renamed to its name, and the directory fsynced (the rename is on the disk): a reader sees no
file or the whole file, never a torn one. The checksum (CRC-32 by default: it catches every
burst of up to 32 flipped bits at several GB/s; SHA-256 where a forged file is a concern, at
about a third of the speed: bench/checkpoint.py measures both) is computed on the bytes as
they are written, in one pass, and kept in the manifest (`pipelib.checkpoint.manifest`): a
bit flipped later on the disk is caught when the file is read.

Every step of a write calls `fault(event)` first ("before NAME", "during NAME" with half the
bytes written, "after NAME" once renamed): a test injects a crash there (an exception, or
`os._exit` in a forked process, which runs no cleanup at all) and shows that the last good
checkpoint still loads. Loading reads a file once, in chunks (CRC-32's on several threads,
combined: `pipelib.checkpoint.crc`), for its checksum, then maps it
(`torch.load(mmap=True)`: the tensors point at the pages just read), and never runs code from
a file: `weights_only=True` accepts tensors, numbers, strings and containers only.

Introduced in chapter 18.
"""
from __future__ import annotations

import hashlib
import io
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch

from pipelib.checkpoint.crc import file_crc32
from pipelib.checkpoint.errors import CorruptCheckpointError, MissingShardError


class _Crc32:
    """hashlib's interface over zlib.crc32 (about 3x faster than SHA-256, not collision-proof)."""

    def __init__(self):
        self.value = 0

    def update(self, data) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"

    @staticmethod
    def of_file(path: str) -> tuple[str, int]:
        """(hexdigest, bytes) of a whole file, its chunks on several threads (`checkpoint.crc`)."""
        value, nbytes = file_crc32(path)
        return f"{value:08x}", nbytes


CHECKSUMS = MappingProxyType({"sha256": hashlib.sha256, "crc32": _Crc32})
_CHUNK = 16 << 20  # bytes read at a time while checksumming


@dataclass(frozen=True)
class FileRecord:
    """One committed file of a checkpoint: its name in the step directory, size and checksum."""

    name: str
    nbytes: int
    checksum: str
    algorithm: str = "crc32"
    rank: int = 0

    def to_dict(self) -> dict:
        return {"name": self.name, "nbytes": self.nbytes, "checksum": self.checksum,
                "algorithm": self.algorithm, "rank": self.rank}

    @classmethod
    def from_dict(cls, d: dict) -> FileRecord:
        return cls(**d)


class _HashingFile:
    """A file object that checksums what passes through `write` and can crash half-way."""

    def __init__(self, f, digest, on_half: Callable[[], None] | None, expected: int | None):
        self.f, self.digest, self.on_half, self.expected, self.nbytes = f, digest, on_half, expected, 0

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        size = len(data)
        self.digest.update(data)
        if self.on_half is not None and self.expected is not None and self.nbytes + len(data) >= self.expected // 2:
            cut = max(0, self.expected // 2 - self.nbytes)  # exactly half the file is written, then the crash
            self.f.write(data[:cut])
            self.f.flush()
            hook, self.on_half = self.on_half, None
            hook()
            data = data[cut:]
            self.nbytes += cut
        self.f.write(data)
        self.nbytes += len(data)
        return size

    def flush(self) -> None:
        self.f.flush()


class Writer:
    """Crash-safe writes into a directory, fsyncs counted (`fsyncs`), `fault(event)` at each step."""

    def __init__(self, *, fault: Callable[[str], None] | None = None, algorithm: str = "crc32",
                 sync: bool = True):
        if algorithm not in CHECKSUMS:
            raise ValueError(f"Writer: algorithm={algorithm!r}; use one of {list(CHECKSUMS)}")
        self.fault, self.algorithm, self.sync = fault, algorithm, sync
        self.fsyncs = 0
        self.bytes_written = 0

    def _event(self, what: str) -> None:
        if self.fault is not None:
            self.fault(what)

    def fsync(self, fd: int) -> None:
        if self.sync:
            os.fsync(fd)
            self.fsyncs += 1

    def fsync_dir(self, directory: str) -> None:
        """The directory's entries (a rename, a new file) on the disk too."""
        fd = os.open(directory, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)

    def _write(self, directory: str, name: str, produce: Callable, expected: int | None, rank: int) -> FileRecord:
        self._event(f"before {name}")
        tmp, final = os.path.join(directory, f".{name}.tmp"), os.path.join(directory, name)
        digest = CHECKSUMS[self.algorithm]()
        with open(tmp, "wb") as f:
            out = _HashingFile(f, digest, (lambda: self._event(f"during {name}")) if self.fault else None, expected)
            produce(out)
            f.flush()
            self.fsync(f.fileno())
        os.replace(tmp, final)  # the one atomic step
        self.fsync_dir(directory)
        self.bytes_written += out.nbytes
        self._event(f"after {name}")
        return FileRecord(name, out.nbytes, digest.hexdigest(), self.algorithm, rank)

    def write_bytes(self, directory: str, name: str, data: bytes, rank: int = 0) -> FileRecord:
        return self._write(directory, name, lambda f: f.write(data), len(data), rank)

    def save_tensors(self, directory: str, name: str, obj, rank: int = 0) -> FileRecord:
        """`torch.save(obj)` into `directory/name`, crash-safe and checksummed in the same pass.
        With a fault hook, the object is serialized first so that "during" falls at half its bytes."""
        if self.fault is None:
            return self._write(directory, name, lambda f: torch.save(obj, f), None, rank)
        buf = io.BytesIO()
        torch.save(obj, buf)
        return self.write_bytes(directory, name, buf.getbuffer(), rank)


def file_digest(algorithm, path: str) -> tuple[str, int]:
    """(hexdigest, bytes) of the file at `path` under a `CHECKSUMS` entry: its own whole-file
    reader where it has one (CRC-32's, on several threads), else one pass in chunks."""
    if hasattr(algorithm, "of_file"):
        return algorithm.of_file(path)
    digest, nbytes = algorithm(), 0
    chunk = bytearray(_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            digest.update(view[:n])
            nbytes += n
    return digest.hexdigest(), nbytes


def read_tensors(directory: str, record: FileRecord, *, verify: bool = True):
    """The object in `directory/record.name`, its size and checksum checked against the manifest's
    record first, loaded with `torch.load(weights_only=True)` (no code from the file runs)."""
    path = os.path.join(directory, record.name)
    if not os.path.exists(path):
        raise MissingShardError(f"checkpoint {directory}: the manifest lists {record.name} (rank {record.rank}'s "
                                f"shard, {record.nbytes} bytes), but it is missing; copy it back or load an "
                                f"earlier step")
    if verify:
        found, nbytes = file_digest(CHECKSUMS[record.algorithm], path)
        if nbytes != record.nbytes or found != record.checksum:
            raise CorruptCheckpointError(
                f"checkpoint {directory}: {record.name} (rank {record.rank}) has {nbytes} bytes with "
                f"{record.algorithm} {found}, the manifest says {record.nbytes} bytes with "
                f"{record.checksum}: the file is corrupted; load an earlier step")
    # mapped, not copied: the pages just checksummed are in the page cache, tensors point at them
    return torch.load(path, mmap=True, weights_only=True, map_location="cpu")  # a GPU run saved CUDA tensors
