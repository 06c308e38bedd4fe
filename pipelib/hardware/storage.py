"""Storage measured: write a file, read it back from the page cache, then after eviction.

A file just written is still in the operating system's page cache (RAM), so its first read
measures memory, not the disk; the numbers say which is which, with the filesystem type.
Chapter 18's checkpoints are written at these speeds.

Introduced in chapter 01.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

from pipelib.costmodel import MiB


@dataclass(frozen=True)
class FileRead:
    """Reading back a file just written: from the page cache, then after asking for eviction."""

    nbytes: int
    filesystem: str
    write_bps: float        # write + fsync: the data reached the storage device (or its cache)
    cached_bps: float       # read of a file just written: served from the page cache (RAM)
    evicted_bps: float | None  # read after posix_fadvise(DONTNEED); None where unsupported


def _filesystem(path: str) -> str:
    best, fs = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _, mnt, kind = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fs = mnt, kind
    except OSError:
        pass
    return fs


def file_read_bandwidth(nbytes: int = 256 * MiB, directory: str | None = None,
                        chunk: int = 8 * MiB) -> FileRead:
    """Write a temporary file, fsync it, read it twice; delete it. Sizes in bytes.

    A file just written is still in the operating system's page cache, so the first read
    measures RAM, not the disk: it is labelled "page cache". Then the kernel is asked to drop
    the file's clean pages (posix_fadvise POSIX_FADV_DONTNEED, no root needed) and it is read
    again. On tmpfs, or a virtual machine whose host caches the disk, that second read may
    still come from RAM somewhere: the filesystem type is reported with the numbers.
    """
    directory = directory or tempfile.gettempdir()
    buf = bytearray(os.urandom(min(chunk, MiB))) * max(1, chunk // MiB)
    view = memoryview(buf)
    fd, path = tempfile.mkstemp(prefix="pipelib-read-", dir=directory)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < nbytes:
            written += os.write(fd, view[: min(len(buf), nbytes - written)])
        os.fsync(fd)
        write_bps = written / (time.perf_counter() - t0)

        def read_all() -> float:
            os.lseek(fd, 0, os.SEEK_SET)
            t0, got = time.perf_counter(), 0
            while True:
                n = os.readv(fd, [view])
                if n == 0:
                    break
                got += n
            if got != written:
                raise OSError(f"read {got} bytes back from {path}, wrote {written}")
            return got / (time.perf_counter() - t0)

        cached = max(read_all() for _ in range(2))
        evicted = None
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            evicted = read_all()
        return FileRead(written, _filesystem(os.path.realpath(directory)), write_bps, cached, evicted)
    finally:
        os.close(fd)
        os.unlink(path)
