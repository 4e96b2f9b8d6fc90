"""Random-access writers into an open version: seeks, rewrites, truncation,
read-back through the writing fd, writable mmap, dd conv=notrunc, appends and
pre-sized files.  Every file is compared with a reference built in memory (or
a source file) while open, after close, after `hwfs seal` and after a remount.
"""

import os

import numpy as np

from conftest import assert_same_file, make_tensors, random_file, save_model, sh

MiB = 1 << 20


def _rng(seed):
    return np.random.default_rng([seed, 0x5EED])


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _assert_bytes(path, ref, what):
    got = _read(path)
    assert len(got) == len(ref), f"{what}: {path} is {len(got)} bytes, expected {len(ref)}"
    if got != ref:
        i = next(i for i in range(len(ref)) if got[i] != ref[i])
        raise AssertionError(f"{what}: {path} differs from the reference at byte {i}")


def _seal_remount_check(m, version, files):
    """@files: {path-in-mount: reference bytes}; check after seal and after remount."""
    m.run("seal", version)
    assert m.version(version)["state"] == "sealed"
    for p, ref in files.items():
        _assert_bytes(p, ref, "after seal")
    m.remount()
    assert m.version(version)["state"] == "sealed"
    for p, ref in files.items():
        _assert_bytes(p, ref, "after remount")


def _tensor_names(m, version):
    tdir = m.vpath(version, "tensors")
    return set(os.listdir(tdir)) if os.path.isdir(tdir) else set()


def _errors_for(m, version, name):
    return [e for e in m.version(version)["errors"]
            if e["file"] == name or e["file"].endswith("/" + name)]


def test_shuffled_blocks_overwrites_and_ftruncate(mount):
    """(a) A 20 MiB file written block by block in shuffled order with seeks,
    some blocks overwritten, then ftruncate shorter and longer."""
    size = 20 * MiB
    rng = _rng(1)
    data = rng.bytes(size)
    ref = bytearray(size)
    os.mkdir(mount.vpath("w1"))
    path = mount.vpath("w1", "shuffled.bin")
    # Blocks of uneven sizes so that they straddle the 4 MiB chunk grid.
    bounds = sorted(set([0, size] + [int(x) for x in rng.integers(1, size, 40)]))
    blocks = list(zip(bounds[:-1], bounds[1:]))
    order = rng.permutation(len(blocks))
    with open(path, "wb") as f:
        for i in order:
            a, b = blocks[i]
            f.seek(a)
            f.write(data[a:b])
            ref[a:b] = data[a:b]
        # Overwrite a few ranges (some crossing block boundaries) with new bytes.
        for k in range(8):
            a = int(rng.integers(0, size - 300_000))
            n = int(rng.integers(1, 300_000))
            patch = rng.bytes(n)
            f.seek(a)
            f.write(patch)
            ref[a:a + n] = patch
        f.flush()
        # Shorter, then longer: the regrown tail must read as zeros.
        os.ftruncate(f.fileno(), 13 * MiB + 12345)
        del ref[13 * MiB + 12345:]
        os.ftruncate(f.fileno(), 17 * MiB + 1)
        ref.extend(bytes(17 * MiB + 1 - len(ref)))
        # A final write past the end, leaving a gap.
        f.seek(18 * MiB)
        f.write(b"tail" * 1000)
        ref.extend(bytes(18 * MiB - len(ref)))
        ref.extend(b"tail" * 1000)
    ref = bytes(ref)
    assert os.path.getsize(path) == len(ref)
    _assert_bytes(path, ref, "after close")
    _seal_remount_check(mount, "w1", {path: ref})


def test_dd_notrunc_patch_after_close(mount, src):
    """(b) dd conv=notrunc patches the middle of a file already written and
    closed (the file is reopened for writing)."""
    random_file(src / "base.bin", 9 * MiB + 17, seed=2)
    random_file(src / "patch.bin", 300_000, seed=3)
    os.mkdir(mount.vpath("w1"))
    dst = mount.vpath("w1", "base.bin")
    sh(["cp", src / "base.bin", dst])
    assert_same_file(src / "base.bin", dst)
    for target in (src / "base.bin", dst):
        sh(["dd", f"if={src / 'patch.bin'}", f"of={target}", "bs=1000", "seek=5000", "conv=notrunc",
            "status=none"])
    assert os.path.getsize(dst) == 9 * MiB + 17
    sh(["cmp", src / "base.bin", dst])
    # A second patch that crosses the end of the file.
    for target in (src / "base.bin", dst):
        sh(["dd", f"if={src / 'patch.bin'}", f"of={target}", "bs=1", f"seek={9 * MiB}",
            "conv=notrunc", "status=none"])
    sh(["cmp", src / "base.bin", dst])
    mount.run("seal", "w1")
    sh(["cmp", src / "base.bin", dst])
    mount.remount()
    sh(["cmp", src / "base.bin", dst])


def test_rdwr_readback_and_writable_memmap(mount):
    """(c) O_RDWR: written, read back through the same fd before close, then
    changed through a writable numpy.memmap."""
    size = 6 * MiB + 333
    rng = _rng(4)
    data = rng.bytes(size)
    ref = bytearray(data)
    os.mkdir(mount.vpath("w1"))
    path = mount.vpath("w1", "rdwr.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        off = 0
        while off < size:
            n = min(size - off, 1_000_003)
            assert os.pwrite(fd, data[off:off + n], off) == n
            off += n
        # Read back through the same fd, before close: whole, and some ranges.
        assert os.pread(fd, size + 100, 0) == data
        for a, n in ((0, 1), (4 * MiB - 5, 10), (size - 7, 100), (123_457, 2 * MiB)):
            assert os.pread(fd, n, a) == data[a:a + n], f"pread({n}, {a}) through the writing fd"
        # Rewrite a range, read it back at once.
        patch = rng.bytes(70_000)
        os.pwrite(fd, patch, 1_000_000)
        ref[1_000_000:1_070_000] = patch
        assert os.pread(fd, 100_000, 990_000) == bytes(ref[990_000:1_090_000])

        mm = np.memmap(path, dtype=np.uint8, mode="r+")
        assert mm.shape == (size,)
        assert bytes(mm[:4096]) == bytes(ref[:4096])
        mm[10:20] = 0xAB
        mm[3 * MiB:3 * MiB + 5000] = np.arange(5000, dtype=np.uint32).astype(np.uint8)
        mm[size - 1] = 7
        mm.flush()
        del mm
        ref[10:20] = b"\xab" * 10
        ref[3 * MiB:3 * MiB + 5000] = bytes(np.arange(5000, dtype=np.uint32).astype(np.uint8))
        ref[size - 1] = 7
        assert os.pread(fd, size, 0) == bytes(ref), "fd does not see the memmap's changes"
    finally:
        os.close(fd)
    ref = bytes(ref)
    _assert_bytes(path, ref, "after close")
    _seal_remount_check(mount, "w1", {path: ref})


def test_safetensors_appended_before_seal(mount, src):
    """(d) save_file into the mount, then append bytes: trailing bytes make it
    a plain file (status error, no tensors/ entries), bytes intact."""
    t = make_tensors(41, n=5, prefix="app.layers")
    os.mkdir(mount.vpath("w1"))
    path = mount.vpath("w1", "model.safetensors")
    save_model(path, t)
    save_model(src / "model.safetensors", t)
    assert_same_file(src / "model.safetensors", path)
    extra = b"appended garbage\n" * 100
    with open(path, "ab") as f:
        f.write(extra)
    ref = _read(src / "model.safetensors") + extra
    _assert_bytes(path, ref, "after append")
    mount.run("seal", "w1")
    _assert_bytes(path, ref, "after seal")
    errs = _errors_for(mount, "w1", "model.safetensors")
    assert errs, f"model.safetensors not in status errors: {mount.version('w1')['errors']}"
    assert any("trailing" in e["error"] for e in errs), errs
    assert _tensor_names(mount, "w1") == set()
    assert mount.version("w1")["tensors"] == 0
    mount.remount()
    _assert_bytes(path, ref, "after remount")
    assert _errors_for(mount, "w1", "model.safetensors")
    assert _tensor_names(mount, "w1") == set()


def test_truncate_then_sequential_writes(mount, src):
    """(e) `truncate -s 10M` of a new file, then sequential writes of real data over it."""
    random_file(src / "real.bin", 10 * MiB, seed=5)
    os.mkdir(mount.vpath("w1"))
    dst = mount.vpath("w1", "presized.bin")
    sh(["truncate", "-s", "10M", dst])
    assert os.path.getsize(dst) == 10 * MiB
    assert _read(dst) == bytes(10 * MiB)
    with open(src / "real.bin", "rb") as fin, open(dst, "r+b") as fout:
        while True:
            b = fin.read(MiB - 1)
            if not b:
                break
            fout.write(b)
    sh(["cmp", src / "real.bin", dst])
    mount.run("seal", "w1")
    sh(["cmp", src / "real.bin", dst])
    mount.remount()
    sh(["cmp", src / "real.bin", dst])


def test_truncate_then_dd_safetensors(mount, src):
    """(e') The same with a model: `truncate -s SIZE`, then dd over it (the
    file is closed in between, so the writer is resumed and thawed)."""
    t = make_tensors(51, n=4, prefix="dd.layers")
    save_model(src / "m.safetensors", t)
    os.mkdir(mount.vpath("w1"))
    dst = mount.vpath("w1", "m.safetensors")
    sh(["truncate", "-s", str(os.path.getsize(src / "m.safetensors")), dst])
    sh(["dd", f"if={src / 'm.safetensors'}", f"of={dst}", "bs=100k", "conv=notrunc", "status=none"])
    sh(["cmp", src / "m.safetensors", dst])
    mount.run("seal", "w1")
    sh(["cmp", src / "m.safetensors", dst])
    assert _errors_for(mount, "w1", "m.safetensors") == []
    assert _tensor_names(mount, "w1") == set(t)


def test_presized_fd_model_small_writes(mount, src):
    """A model written into a file pre-sized with ftruncate() on the same fd,
    in writes smaller than its header (a downloader that preallocates).  The
    final bytes are a valid safetensors file and must be seen as one."""
    t = make_tensors(61, n=4, prefix="pre.layers")
    save_model(src / "m.safetensors", t)
    data = _read(src / "m.safetensors")
    os.mkdir(mount.vpath("w1"))
    dst = mount.vpath("w1", "m.safetensors")
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, len(data))
        off = 0
        while off < len(data):
            n = 100 if off < 8192 else MiB
            os.pwrite(fd, data[off:off + n], off)
            off += n
    finally:
        os.close(fd)
    sh(["cmp", src / "m.safetensors", dst])
    mount.run("seal", "w1")
    sh(["cmp", src / "m.safetensors", dst])
    assert _errors_for(mount, "w1", "m.safetensors") == [], mount.version("w1")["errors"]
    assert _tensor_names(mount, "w1") == set(t)


def test_model_completed_by_second_writer(mount, src):
    """A model written in two sessions (close after part of it, reopen with
    'ab' and append the rest, like a resumed download): valid in the end."""
    t = make_tensors(71, n=4, prefix="resume.layers")
    save_model(src / "m.safetensors", t)
    data = _read(src / "m.safetensors")
    os.mkdir(mount.vpath("w1"))
    dst = mount.vpath("w1", "m.safetensors")
    half = len(data) // 2
    with open(dst, "wb") as f:
        f.write(data[:half])
    with open(dst, "ab") as f:
        f.write(data[half:])
    sh(["cmp", src / "m.safetensors", dst])
    mount.run("seal", "w1")
    sh(["cmp", src / "m.safetensors", dst])
    assert _errors_for(mount, "w1", "m.safetensors") == [], mount.version("w1")["errors"]
    assert _tensor_names(mount, "w1") == set(t)
