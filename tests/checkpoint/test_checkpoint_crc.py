"""A file's CRC-32 on several threads equals zlib's of the whole file (`pipelib.checkpoint.crc`),
whatever the split, and a flipped byte anywhere still changes it."""
import os
import random
import zlib

import pytest

from pipelib.checkpoint.crc import crc32_combine, file_crc32, zeros_matrix


@pytest.mark.parametrize("len1, len2", [(0, 0), (1, 0), (0, 1), (3, 5), (1000, 777), (1 << 16, 12345)])
def test_combine_is_the_crc_of_the_concatenation(len1, len2):
    rnd = random.Random(len1 * 7 + len2)
    a, b = rnd.randbytes(len1), rnd.randbytes(len2)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b), zeros_matrix(len(b))) == zlib.crc32(a + b)


@pytest.mark.parametrize("size, chunk", [(0, 64), (10, 64), (64, 64), (65, 64), (1000, 64), (4096 + 3, 1024),
                                         ((1 << 20) + 1, 1 << 16)])
def test_file_crc_on_threads_is_zlibs_of_the_whole_file(tmp_path, size, chunk):
    data = random.Random(size).randbytes(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    for workers in (1, 3):
        assert file_crc32(str(path), chunk=chunk, workers=workers) == (zlib.crc32(data), size)
    flipped = bytearray(data)
    if size:
        flipped[size // 2] ^= 0x10  # one bit, in whichever chunk holds the middle
        path.write_bytes(bytes(flipped))
        assert file_crc32(str(path), chunk=chunk, workers=3)[0] != zlib.crc32(data)
    os.remove(path)
