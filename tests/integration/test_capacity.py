"""A full store answers ENOSPC and keeps what it already sealed intact."""

import errno
import os
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


def test_preallocate_larger_than_memory_is_refused(tmp_path):
    """A capacity the store's filesystem cannot hold: mount fails with a clear error, mounts nothing."""
    store = tempfile.mkdtemp(dir="/dev/shm", prefix="hwfs-test-")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        vfs = os.statvfs(store)
        too_big = vfs.f_blocks * vfs.f_frsize + (1 << 30)
        cp = sh([HWFS, "mount", mnt, "--store", store, "--capacity", f"{too_big >> 20}M", "--preallocate"],
                check=False)
        assert cp.returncode != 0, "mount with an arena larger than /dev/shm succeeded"
        assert "preallocate" in cp.stderr + cp.stdout and "not enough memory" in cp.stderr + cp.stdout, cp
        assert not is_mounted(str(mnt))
        assert os.stat(os.path.join(store, "arena")).st_blocks == 0
    finally:
        if is_mounted(str(mnt)):
            sh(["fusermount3", "-u", mnt], check=False)
        shutil.rmtree(store, ignore_errors=True)
