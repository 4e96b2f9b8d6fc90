"""Parallel readers of sealed data (issue 29, item 4; docs/benchmarks.md,
"Parallel readers"): four processes read one sealed file, or one tensor,
at once, sequentially (each its own quarter), with small random preads, and
through mmap at random pages, with the page cache of the file dropped first
(posix_fadvise DONTNEED), and every read must return exactly the bytes
written.  Small reads of sealed data make the daemon store the 1 MiB window
around them into the kernel's page cache (read_around_kb,
fs/ns/fuse_readaround.c), so later reads there are served from pages the
daemon pushed rather than from replies: test_read_around_fills_the_window
checks that such pages appear (else the other tests would not exercise
them), and every test ends with a full read compared with the reference,
which reads the pushed pages too.
"""

import ctypes
import mmap
import multiprocessing
import os
import shutil

import numpy as np
import pytest

from conftest import poll, save_model

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
SIZE = 24 * MiB + 4321  # not a whole number of pages, nor of windows
READERS = 4
READS = 1500            # per random reader

_REF = b""  # the reference bytes, inherited by the forked readers


def _drop(path):
    """Drop @path's clean pages from the page cache (what drop_caches does to it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _check(got, off, want_len, what):
    want = _REF[off:off + want_len]
    if got == want:
        return None
    if len(got) != len(want):
        return f"{what} [{off}, +{want_len}) returned {len(got)} bytes, not {len(want)}"
    i = next(i for i in range(len(got)) if got[i] != want[i])
    return f"{what} [{off}, +{want_len}) differs at byte {off + i}"


def _reader(kind, path, idx):
    """One reader process: the first difference it saw, or None."""
    size = len(_REF)
    rng = np.random.default_rng([29, 4, idx])
    fd = os.open(path, os.O_RDONLY)
    try:
        if kind == "seq":  # its own quarter, 1 MiB at a time
            lo, hi = size * idx // READERS, size * (idx + 1) // READERS
            for off in range(lo, hi, MiB):
                n = min(MiB, hi - off)
                err = _check(os.pread(fd, n, off), off, n, "pread")
                if err:
                    return err
        elif kind == "random":  # small preads; the kernel reads nothing around them
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for _ in range(READS):
                off = int(rng.integers(0, size))
                n = int(rng.choice([1, 4096, 4096, 4096, int(rng.integers(1, 32 << 10))]))
                err = _check(os.pread(fd, n, off), off, min(n, size - off), "pread")
                if err:
                    return err
        else:  # mmap, random pages (MADV_RANDOM: a fault reads one page)
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            try:
                mm.madvise(mmap.MADV_RANDOM)
                for _ in range(READS):
                    off = int(rng.integers(0, (size + PAGE - 1) // PAGE)) * PAGE + int(rng.integers(0, 64))
                    n = min(4096, size - off)
                    err = _check(mm[off:off + n], off, n, "mmap")
                    if err:
                        return err
            finally:
                mm.close()
    finally:
        os.close(fd)
    return None


def _parallel(kind, path, ref):
    """@READERS processes of @kind on @path at once; assert none saw a wrong byte."""
    global _REF
    _REF = ref
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(READERS) as pool:
        errors = pool.starmap(_reader, [(kind, path, i) for i in range(READERS)])
    assert errors == [None] * READERS, errors


def _full_read(path, ref):
    with open(path, "rb") as f:
        got = f.read()
    assert len(got) == len(ref)
    assert got == ref, f"a full read differs from byte {next(i for i in range(len(ref)) if got[i] != ref[i])}"


@pytest.fixture
def sealed(mount, src):
    """A sealed file of random bytes: (mount, its path, its bytes)."""
    ref = np.random.default_rng(2029).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (src / "w.bin").write_bytes(ref)
    os.mkdir(mount.vpath("v1"))
    shutil.copyfile(src / "w.bin", mount.vpath("v1", "w.bin"))
    mount.run("seal", "v1")
    path = mount.vpath("v1", "w.bin")
    _drop(path)
    return mount, path, ref


@pytest.mark.parametrize("kind", ["seq", "random", "mmap"])
def test_parallel_readers_get_exact_bytes(sealed, kind):
    m, path, ref = sealed
    _parallel(kind, path, ref)
    _full_read(path, ref)  # pushed windows included
    _drop(path)
    _parallel(kind, path, ref)  # again after the pages went: pushed once more
    _full_read(path, ref)


def _resident(path, size):
    """Per page of @path, whether it is in the page cache (mincore); None when
    this process may not ask (mincore then says every page is)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return [b != 0 for b in vec.raw]
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_read_around_fills_the_window(sealed):
    """One small read of a cold sealed file: its 1 MiB window (read_around_kb's
    default) comes into the page cache, with the right bytes."""
    m, path, ref = sealed
    before = _resident(path, SIZE)
    if all(before):
        pytest.skip("mincore reports every page resident (not permitted to ask)")
    win = 5 * MiB  # the window [5 MiB, 6 MiB)
    assert not any(before[win // PAGE:(win + MiB) // PAGE]), "the window is cached before any read"
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the kernel itself reads one page
        assert os.pread(fd, 100, win + 300 * 1024 + 7) == ref[win + 300 * 1024 + 7:win + 300 * 1024 + 107]
    finally:
        os.close(fd)
    pages = range(win // PAGE, (win + MiB) // PAGE)
    assert poll(lambda: all(_resident(path, SIZE)[p] for p in pages), timeout=10), \
        "the rest of the window did not come into the page cache"
    with open(path, "rb") as f:  # served from the pushed pages
        f.seek(win)
        assert f.read(MiB) == ref[win:win + MiB]
    _full_read(path, ref)


def test_parallel_tensor_readers_get_exact_bytes(mount, src):
    """Tensor files: read-around windows count from the tensor's first byte."""
    rng = np.random.default_rng(294)
    t = {"a.weight": rng.standard_normal((3 * 1024 + 5, 256), dtype=np.float32),  # 3 MiB + 5 KiB
         "b.weight": rng.standard_normal((7, 3), dtype=np.float32)}
    save_model(src / "model.safetensors", t)
    mount.run("publish", src, "v1")
    for name, arr in t.items():
        path = mount.vpath("v1", "tensors", name)
        ref = arr.tobytes()
        _drop(path)
        for kind in ("random", "mmap"):
            _parallel(kind, path, ref)
        _full_read(path, ref)
