"""The FUSE write path of new bytes (docs/benchmarks.md, "plain rows"): a
writer's bytes reach the arena with pwrite() on the arena file, not through
the daemon's mapping, and gaps are zero-filled the same way (arena_write,
arena_zero).  Readers of the file being written read it through the mapping
meanwhile, so both must show the same bytes at every moment: every read of a
concurrent reader returns exactly the reference bytes at its offset (or
fewer, never other ones), and the sealed file and the file after a remount
equal the reference.
"""

import os
import threading

import numpy as np

MiB = 1 << 20


def _reader(path, ref, stop, errors, seed):
    """Read @path with O_DIRECT (no page cache: every read reaches the daemon)
    at random offsets and sizes until @stop; record any byte that differs."""
    rng = np.random.default_rng(seed)
    reads = 0
    while not stop.is_set() or reads < 20:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except FileNotFoundError:
            continue
        try:
            for _ in range(8):
                off = int(rng.integers(0, len(ref)))
                n = int(rng.integers(1, 3 * MiB))
                got = os.pread(fd, n, off)
                want = ref[off:off + len(got)]
                if got != want:
                    i = next(i for i in range(len(got)) if got[i] != want[i])
                    errors.append(f"read [{off}, +{n}) differs at byte {off + i}")
                    return
                reads += 1
        finally:
            os.close(fd)


def test_concurrent_readers_see_exact_bytes_of_new_writes(mount):
    m = mount
    size = 40 * MiB + 12345
    ref = bytearray(np.random.default_rng(2020).integers(0, 256, size, dtype=np.uint8).tobytes())
    gap = (30 * MiB + 777, 31 * MiB + 5)  # written last: a zero-filled gap until then
    os.mkdir(m.vpath("v1"))
    path = m.vpath("v1", "new.bin")
    stop, errors = threading.Event(), []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    readers = []
    try:
        # the first bytes in, so the readers have a file to open
        os.pwrite(fd, ref[:4097], 0)
        expect = bytearray(ref)
        expect[gap[0]:gap[1]] = bytes(gap[1] - gap[0])  # what the readers may see meanwhile
        readers = [threading.Thread(target=_reader, args=(path, bytes(expect), stop, errors, s))
                   for s in (1, 2)]
        for t in readers:
            t.start()
        # odd sizes crossing pages, a write past the end (the gap), then the gap itself
        rng = np.random.default_rng(7)
        off = 4097
        while off < size:
            n = min(int(rng.integers(1, 2 * MiB)), size - off)
            if off < gap[0] < off + n:
                n = gap[0] - off
            if off == gap[0]:
                off = gap[1]
                continue
            os.pwrite(fd, ref[off:off + n], off)
            off += n
        stop.set()
        for t in readers:
            t.join(120)
        assert not errors, errors
        os.pwrite(fd, ref[gap[0]:gap[1]], gap[0])
    finally:
        stop.set()
        os.close(fd)
        for t in readers:
            t.join(120)
    assert not errors, errors
    with open(path, "rb") as f:
        assert f.read() == bytes(ref), "the file differs from the reference after close"
    m.run("seal", "v1")
    with open(path, "rb") as f:
        assert f.read() == bytes(ref), "the file differs from the reference after seal"
    m.remount()
    with open(path, "rb") as f:
        assert f.read() == bytes(ref), "the file differs from the reference after a remount"


def test_ftruncate_then_write_new_bytes(mount):
    """A writer that sizes its file first (ftruncate to the final size, as some
    checkpoint writers do) and fills it afterwards: the zero-fill of the new
    size (over bytes written before a shrink, too) and the overwrite land on
    the same bytes."""
    m = mount
    size = 24 * MiB + 99
    ref = np.random.default_rng(2021).integers(0, 256, size, dtype=np.uint8).tobytes()
    os.mkdir(m.vpath("v1"))
    path = m.vpath("v1", "sized.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        # bytes that staging keeps after a shrink: the extension must not show them
        os.pwrite(fd, b"\xff" * (2 * MiB), 0)
        os.ftruncate(fd, 1000)
        os.ftruncate(fd, size)
        with open(path, "rb") as f:
            assert f.read(3 * MiB) == b"\xff" * 1000 + bytes(3 * MiB - 1000), \
                "a file extended by ftruncate reads as zeros after its old end"
        half = size // 2 + 4095
        os.pwrite(fd, ref[half:], half)  # the back half first, then the front
        os.pwrite(fd, ref[:half], 0)
    finally:
        os.close(fd)
    m.run("seal", "v1")
    with open(path, "rb") as f:
        assert f.read() == ref
    m.remount()
    with open(path, "rb") as f:
        assert f.read() == ref
