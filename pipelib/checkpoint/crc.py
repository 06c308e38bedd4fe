"""The CRC-32 of a file on several threads, equal to `zlib.crc32` of the whole file.

A checkpoint's load checks every file's checksum before it trusts a byte (`files.read_tensors`).
On one thread that check is a pass over the file at zlib's speed, about as long as the load
itself (bench/checkpoint.py). CRC-32 splits: the file's chunks are checksummed on a pool of
threads (`zlib.crc32` releases the GIL on large buffers, and `os.pread` while it reads), then
combined in order into the CRC-32 of the whole, as zlib's `crc32_combine` does: the CRC of A
followed by B is the CRC of A carried over len(B) zero bytes, XOR the CRC of B. Carrying a
CRC over n zero bytes is linear over GF(2): a 32 x 32 bit matrix (one int per column here),
built once per chunk length by squaring the one-bit matrix (log n squarings), then applied to
each chunk's CRC in 32 steps. The manifest's checksum is unchanged: the one CRC-32 of the file,
computed on the way while it was written.

Introduced in chapter 18 (the checkpoint's load, against DCP's).
"""
from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

POLY = 0xEDB88320  # CRC-32's polynomial, reflected (zlib's)
CHUNK = 16 << 20   # bytes each thread checksums at a time


def _apply(matrix: list[int], vector: int) -> int:
    """The GF(2) matrix (one int per column) times a 32-bit vector."""
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _compose(a: list[int], b: list[int]) -> list[int]:
    """The matrix of `b` then `a`."""
    return [_apply(a, col) for col in b]


def zeros_matrix(nbytes: int) -> list[int]:
    """The matrix that carries a CRC-32 register over `nbytes` zero bytes."""
    bit = [POLY] + [1 << n for n in range(31)]  # one zero bit: shift right, the polynomial where bit 0 left
    step = _compose(bit, bit)
    step = _compose(step, step)
    step = _compose(step, step)  # one zero byte: eight bits
    out = [1 << n for n in range(32)]  # the identity
    while nbytes:
        if nbytes & 1:
            out = _compose(step, out)
        nbytes >>= 1
        if nbytes:
            step = _compose(step, step)
    return out


def crc32_combine(crc1: int, crc2: int, len2: int, matrix: list[int] | None = None) -> int:
    """The CRC-32 of A + B from crc1 = crc32(A), crc2 = crc32(B) and len(B) (`matrix`: its
    `zeros_matrix(len2)`, when the caller has it already)."""
    return _apply(matrix if matrix is not None else zeros_matrix(len2), crc1) ^ crc2


def file_crc32(path: str, *, chunk: int = CHUNK, workers: int | None = None) -> tuple[int, int]:
    """(zlib.crc32 of the file, its size in bytes), its chunks checksummed on `workers` threads
    (default: the machine's cores, at most 8)."""
    size = os.path.getsize(path)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        if size <= chunk:
            data = os.pread(fd, size, 0)
            return zlib.crc32(data), len(data)

        def one(offset: int) -> tuple[int, int]:
            data = os.pread(fd, chunk, offset)
            return zlib.crc32(data), len(data)

        with ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
            parts = list(pool.map(one, range(0, size, chunk)))
    matrices = {}  # one per chunk length: every chunk but the last has the same
    crc, total = parts[0]
    for part, n in parts[1:]:
        if n not in matrices:
            matrices[n] = zeros_matrix(n)
        crc = crc32_combine(crc, part, n, matrices[n])
        total += n
    return crc, total
