"""A full store answers ENOSPC and keeps what it already sealed intact."""

import errno
import os
import re
import shutil
import tempfile

import pytest

from conftest import (HWFS, assert_tree_equal, expect_errno, is_mounted, make_tensors, pid_alive,
                      random_file, save_model, sh)

BIG = 100 << 20


@pytest.fixture
def small_store(mount_factory, src, tmp_path):
    m = mount_factory(capacity="64M")
    assert m.status()["store"]["capacity_bytes"] == 64 << 20
    keep = tmp_path / "keep"
    save_model(keep / "model.safetensors", make_tensors(700, n=6))
    random_file(keep / "blob.bin", 1 << 20, seed=700)
    m.run("publish", keep, "v1")
    m.run("commit", "v1")
    return m, keep


def _still_fine(m, keep):
    assert pid_alive(m.pid) and m.status()["pid"] == m.pid, "the daemon died"
    assert m.version("v1")["state"] == "sealed"
    assert_tree_equal(keep, m.vpath("v1"))
    assert m.run("verify", "v1").returncode == 0
    st = m.status()["store"]
    assert st["used_bytes"] <= st["capacity_bytes"]


def test_cp_into_full_store_fails_enospc(small_store, src):
    m, keep = small_store
    random_file(src / "big.bin", BIG, seed=701)  # random: no dedup can save it
    os.mkdir(m.vpath("big"))
    cp = sh(["cp", src / "big.bin", m.vpath("big")], check=False)
    assert cp.returncode != 0, "cp of 100 MiB into a 64 MiB store succeeded"
    assert "No space left on device" in cp.stderr, cp.stderr
    _still_fine(m, keep)
    m.remount()
    _still_fine(m, keep)


def test_python_write_into_full_store_raises_enospc(small_store):
    m, keep = small_store
    os.mkdir(m.vpath("big"))
    chunk = os.urandom(1 << 20)
    with pytest.raises(OSError) as ei:
        with open(m.vpath("big", "big.bin"), "wb") as f:
            for i in range(BIG >> 20):
                f.write(chunk[i:] + chunk[:i])  # distinct chunks, no dedup
            os.fsync(f.fileno())
    expect_errno(ei, errno.ENOSPC)
    _still_fine(m, keep)


def test_publish_into_full_store_fails(small_store, src):
    m, keep = small_store
    random_file(src / "big.bin", BIG, seed=702)
    cp = m.run("publish", src, "big", check=False)
    assert cp.returncode != 0 and "hwfs: error:" in cp.stderr
    v = m.version("big")
    assert v is None or v["state"] != "sealed", "a version that did not fit was sealed"
    _still_fine(m, keep)
    # The space of the failed attempt is given back: a small version still fits.
    small = src.parent / "small"
    random_file(small / "s.bin", 4 << 20, seed=703)
    m.run("publish", small, "v2")
    assert_tree_equal(small, m.vpath("v2"))


def _arena_bytes_held(m):
    return os.stat(os.path.join(m.store, "arena")).st_blocks * 512


def test_preallocate_holds_the_whole_arena(mount_factory, src):
    """--preallocate: the arena owns its capacity from mount to unmount, data round-trips, and
    removing a version gives nothing back to the system (nor loses the other version)."""
    m = mount_factory(capacity="64M", extra=["--preallocate"])
    st = m.status()["store"]
    assert st["preallocated"] is True and st["capacity_bytes"] == 64 << 20
    assert _arena_bytes_held(m) >= 64 << 20, "the arena's pages were not allocated at mount"
    save_model(src / "a" / "model.safetensors", make_tensors(710, n=6))
    random_file(src / "b" / "blob.bin", 8 << 20, seed=711)
    m.run("publish", src / "a", "va")
    sh(["cp", "-r", src / "b", m.vpath("vb")])
    m.run("seal", "vb")
    assert_tree_equal(src / "b", m.vpath("vb"))
    used = m.used_bytes()
    m.run("rm", "va")
    assert m.used_bytes() < used, "removing va freed no shard"
    assert _arena_bytes_held(m) >= 64 << 20, "pages were punched out of a preallocated arena"
    assert_tree_equal(src / "b", m.vpath("vb"))
    assert m.run("verify", "vb").returncode == 0
    # The same store mounted again without the flag goes back to allocating on demand.
    m.extra = []
    m.remount()  # asserts the daemon ended after the umount
    assert m.status()["store"]["preallocated"] is False
    assert_tree_equal(src / "b", m.vpath("vb"))


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs(size_bytes): a tmpfs of that size mounted under tmp_path (unmounted after)."""
    made = []

    def make(size):
        d = tmp_path / f"tmpfs{len(made)}"
        d.mkdir()
        cp = sh(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", d], check=False)
        if cp.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {cp.stderr.strip()}")
        made.append(d)
        return d
    yield make
    for d in made:
        sh(["umount", "-l", d], check=False)


def _mount_fails(mnt, store, *args):
    try:
        cp = sh([HWFS, "mount", mnt, "--store", store, *args], check=False)
        assert cp.returncode != 0, "mount succeeded"
        assert not is_mounted(str(mnt))
        return cp.stderr + cp.stdout
    finally:
        if is_mounted(str(mnt)):
            sh([HWFS, "umount", mnt], check=False)


def test_preallocate_larger_than_memory_is_refused(tmp_path, tmpfs):
    """--preallocate of an arena its tmpfs cannot hold (within the filesystem's size, but
    the filesystem is half full): mount fails with a clear error, mounts nothing."""
    fs = tmpfs(64 << 20)
    random_file(fs / "filler", 40 << 20, seed=3)
    store = fs / "store"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = _mount_fails(mnt, store, "--capacity", "48M", "--preallocate")
    assert "preallocate" in out and "not enough memory" in out, out
    assert os.stat(store / "arena").st_blocks == 0


def test_capacity_larger_than_the_filesystem_is_refused(tmp_path):
    """--capacity past the size of the store's filesystem (statvfs) is refused before
    anything is made, with both sizes (was: accepted, ENOSPC much later)."""
    store = tempfile.mkdtemp(dir="/dev/shm", prefix="hwfs-test-")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        vfs = os.statvfs(store)
        too_big = vfs.f_blocks * vfs.f_frsize + (1 << 30)
        for extra in ([], ["--preallocate"]):
            out = _mount_fails(mnt, store, "--capacity", f"{too_big >> 20}M", *extra)
            assert re.search(r"--capacity [\d.]+ GiB is larger than the filesystem holding the "
                             r"store \([\d.]+ [GT]iB\)", out), out
            assert not os.path.exists(os.path.join(store, "arena"))
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def test_capacity_past_free_memory_warns(tmp_path, tmpfs):
    """A tmpfs store (memory) whose --capacity is more than the free RAM and swap: the
    mount goes on (the arena is sparse) and `hwfs mount` says so with the numbers, as the
    daemon's log does; a disk store of the same capacity says nothing."""
    total = _meminfo("MemTotal") + _meminfo("SwapTotal")
    fs = tmpfs(4 * total)  # tmpfs may be larger than memory
    cap = 2 * total
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    store = fs / "store"
    cp = sh([HWFS, "mount", mnt, "--store", store, "--capacity", f"{cap >> 20}M"], check=False)
    try:
        assert cp.returncode == 0, cp.stderr
        notes = [ln for ln in cp.stderr.splitlines() if ln.startswith("hwfs: note: --capacity")]
        assert len(notes) == 1, cp.stderr
        assert re.search(r"the store is in memory \(tmpfs\) and only [\d.]+ [KMGT]?i?B of RAM "
                         r"and swap is free", notes[0]), notes[0]
        assert "OOM killer" in notes[0]
        log = (store / "hwfs.log").read_text()
        assert notes[0][len("hwfs: note: "):] in log
    finally:
        sh([HWFS, "umount", mnt], check=False)
    disk = tmp_path / "disk-store"
    if os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize > cap:
        cp = sh([HWFS, "mount", mnt, "--store", disk, "--capacity", f"{cap >> 20}M"], check=False)
        try:
            assert cp.returncode == 0 and "note" not in cp.stderr, cp.stderr
        finally:
            sh([HWFS, "umount", mnt], check=False)
