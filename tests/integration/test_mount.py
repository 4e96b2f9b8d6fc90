"""Mounting, unmounting, remounting and `hwfs status --json`."""

import os
import shutil
import signal

from conftest import (HEX32, HWFS, assert_same_file, assert_tree_equal, is_mounted, make_tensors,
                      mount_entries, random_file, save_model, sh, tensor_bytes, wait_dead)


def test_root_lists_versions(mount):
    out = sh(["ls", mount.mnt]).stdout.split()
    assert "versions" in out
    assert os.path.isdir(mount.path("versions"))
    assert os.listdir(mount.path("versions")) == []


def test_current_absent_before_first_commit(mount, src):
    assert not os.path.lexists(mount.path("current"))
    assert mount.status()["current"] is None
    save_model(src / "model.safetensors", make_tensors(1, n=4))
    mount.run("publish", src, "v1")
    # Publishing is not committing.
    assert not os.path.lexists(mount.path("current"))
    assert "current" not in sh(["ls", mount.mnt]).stdout.split()
    assert mount.status()["current"] is None


def test_remount_restores_sealed_versions_and_current(mount, src, tmp_path):
    save_model(src / "model.safetensors", make_tensors(1))
    random_file(src / "blob.bin", 1_234_567, seed=3)
    src2 = tmp_path / "src2"
    save_model(src2 / "model.safetensors", make_tensors(2))
    mount.run("publish", src, "v1")
    mount.run("publish", src2, "v2")
    mount.run("commit", "v1")
    before = {v["name"]: v for v in mount.status()["versions"]}
    old_pid = mount.pid

    assert mount.umount().returncode == 0
    assert not is_mounted(mount.mnt)
    assert wait_dead(old_pid, 2.0), "hwfs umount returned before the daemon exited"
    mount.mount()

    after = {v["name"]: v for v in mount.status()["versions"]}
    assert set(after) == {"v1", "v2"}
    for name in ("v1", "v2"):
        assert after[name]["state"] == "sealed"
        for key in ("seq", "bytes", "files", "tensors", "digest"):
            assert after[name][key] == before[name][key], (name, key)
    assert_tree_equal(src, mount.vpath("v1"))
    assert_tree_equal(src2, mount.vpath("v2"))
    assert os.readlink(mount.path("current")) == "versions/v1"
    assert mount.status()["current"] == "v1"
    assert_same_file(src / "model.safetensors", mount.path("current", "model.safetensors"))
    assert_same_file(src / "blob.bin", mount.path("current", "blob.bin"))


def test_umount_after_fusermount(mount, src):
    random_file(src / "a.bin", 100_000)
    mount.run("publish", src, "v1")
    old_pid = mount.pid
    sh(["fusermount3", "-u", mount.mnt])
    assert not is_mounted(mount.mnt)
    cp = sh([HWFS, "umount", mount.mnt], check=False)
    assert cp.returncode == 0, f"hwfs umount after fusermount3 -u: exit {cp.returncode}: {cp.stderr}"
    assert wait_dead(old_pid, 10.0), "daemon did not exit after its mount was removed"
    mount.mounted = False
    # The store is intact.
    mount.mount()
    assert mount.version("v1")["state"] == "sealed"
    assert_tree_equal(src, mount.vpath("v1"))


def test_status_json_fields(mount_factory, src):
    m = mount_factory(capacity="256M")
    st = m.status()
    assert set(st) >= {"pid", "mount", "store", "current", "versions"}
    assert isinstance(st["pid"], int) and st["pid"] > 0
    assert os.path.realpath(st["mount"]) == m.mnt
    store = st["store"]
    assert set(store) >= {"path", "used_bytes", "capacity_bytes", "arena_bytes", "shards"}
    assert os.path.realpath(store["path"]) == os.path.realpath(m.store)
    for k in ("used_bytes", "capacity_bytes", "arena_bytes", "shards"):
        assert isinstance(store[k], int) and store[k] >= 0, k
    assert store["capacity_bytes"] == 256 << 20
    assert store["shards"] == 0
    assert st["current"] is None
    assert st["versions"] == []
    assert os.path.exists(os.path.join(m.store, "arena"))
    assert os.path.exists(os.path.join(m.store, "index.db"))

    t = make_tensors(1, n=5)
    save_model(src / "model.safetensors", t)
    (src / "config.json").write_text('{"a": 1}\n')
    random_file(src / "blob.bin", 70_000)
    m.run("publish", src, "v1")
    st = m.status()
    assert st["store"]["shards"] > 0
    assert st["store"]["used_bytes"] >= tensor_bytes(t)
    [v] = st["versions"]
    assert set(v) >= {"name", "state", "seq", "bytes", "files", "tensors", "digest", "errors"}
    assert v["name"] == "v1"
    assert v["state"] == "sealed"
    assert isinstance(v["seq"], int) and v["seq"] >= 1
    assert v["bytes"] == sum(p.stat().st_size for p in src.iterdir())
    assert v["files"] == 3
    assert v["tensors"] == 5
    assert isinstance(v["digest"], str) and HEX32.match(v["digest"])
    assert v["errors"] == []

    os.mkdir(m.vpath("v2"))
    st = m.status()
    v2 = [v for v in st["versions"] if v["name"] == "v2"][0]
    assert v2["state"] == "open"
    assert v2["digest"] is None
    assert v2["seq"] > v["seq"]


def test_mount_after_kill9_replaces_the_dead_mount(mount, src):
    """kill -9, then `hwfs mount` on the same mount point: one mount, data readable."""
    random_file(src / "blob.bin", 300_000, seed=5)
    mount.run("publish", src, "v1")
    mount.run("commit", "v1")
    for cycle in range(3):
        os.kill(mount.pid, signal.SIGKILL)
        assert wait_dead(mount.pid, 10)
        mount.mounted = False
        mount.mount()  # the dead mount is still there: hwfs mount must clear it
        entries = mount_entries(mount.mnt)
        assert len(entries) == 1, f"cycle {cycle}: {len(entries)} mounts on {mount.mnt}: {entries}"
        assert_same_file(src / "blob.bin", mount.path("current", "blob.bin"))
    # a live hwfs mount is still refused
    cp = sh([HWFS, "mount", mount.mnt, "--store", mount.store], check=False)
    assert cp.returncode != 0 and "already" in cp.stderr, cp.stderr
    assert len(mount_entries(mount.mnt)) == 1


def test_fusermount_exec_failure_is_reported(mount, tmp_path):
    """When fusermount3 cannot be run, the forked child must not go on running the CLI.

    In a user namespace the copied mounts are locked, so umount2() fails and
    hwfs falls back to fusermount3, which PATH does not have: the child's exec
    fails; hwfs must report it and exit 1 (the child used to return into the
    CLI and both processes exited 0 with the mount still there)."""
    os.kill(mount.pid, signal.SIGKILL)
    assert wait_dead(mount.pid, 10)
    mount.mounted = False
    env = {"PATH": str(tmp_path)}  # no fusermount3 here
    unshare = shutil.which("unshare")
    cp = sh([unshare, "-U", "-r", "-m", HWFS, "umount", mount.mnt], check=False, env=env)
    assert cp.returncode == 1, f"exit {cp.returncode}: {cp.stdout!r} {cp.stderr!r}"
    assert cp.stderr.count("hwfs: error:") == 1 and "fusermount3" in cp.stderr, cp.stderr
    cp = sh([unshare, "-U", "-r", "-m", HWFS, "mount", mount.mnt, "--store", mount.store],
            check=False, env=env)
    assert cp.returncode == 1, f"exit {cp.returncode}: {cp.stdout!r} {cp.stderr!r}"
    assert cp.stderr.count("hwfs: error:") == 1 and "dead mount" in cp.stderr, cp.stderr
    assert is_mounted(mount.mnt)  # the dead mount, untouched outside the namespace


def test_dead_daemons_control_socket_is_removed(mount):
    """A root daemon's control socket lives in the shared /run/hwfs; one killed with
    SIGKILL cannot remove it.  The next daemon removes every socket there that no
    daemon listens on, and leaves the live ones (its own, and any other mount's)."""
    ctl = os.getxattr(mount.mnt, "user.hwfs.control").decode()
    assert os.path.dirname(ctl) == "/run/hwfs", ctl
    mount.kill9()
    assert os.path.exists(ctl), "the killed daemon's socket is gone already: nothing to test"
    mount.mount()
    assert not os.path.exists(ctl), f"{ctl} of the killed daemon is still there"
    live = os.getxattr(mount.mnt, "user.hwfs.control").decode()
    assert os.path.exists(live) and mount.status()["pid"] > 0
