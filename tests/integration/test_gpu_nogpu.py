"""The GPU plane on a node without a usable GPU: `hwfs mount --pin`, the note
it prints, and the GPU fields of `hwfs status` (docs/gpu.md).

A machine without CUDA, or with the runtime but no driver or device, is the
ordinary case here and in CI.  Each test runs real daemons on real mounts; the
arena's lock is checked in the daemon's /proc/PID/status (VmLck), not only in
what status says.  Tests that need "no GPU" on a machine that has one point
HWFS_CUDART at a missing file, which the daemon then names as the reason.
"""

import os
import re

import pytest

from conftest import assert_tree_equal, make_tensors, random_file, save_model

CAP = 64 << 20
NOTE = re.compile(r"^hwfs: note: no GPU \((.+)\): arena locked with mlock instead of pinned "
                  r"for CUDA$", re.M)


def vm_locked(pid):
    """Bytes locked in RAM by process @pid (VmLck)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmLck in /proc/{pid}/status")


def mount_no_gpu(mount_factory, monkeypatch, extra=("--pin",), prefix=(), force=False):
    """A 64 MiB mount; with @force (or when this machine has a GPU) its daemon
    gets HWFS_CUDART=/nonexistent, so it has none."""
    if force:
        monkeypatch.setenv("HWFS_CUDART", "/nonexistent")
    m = mount_factory(capacity="64M", extra=extra, prefix=prefix)
    if m.status()["gpu"] is not None:
        assert not force, "HWFS_CUDART=/nonexistent still found a GPU"
        m.umount()
        return mount_no_gpu(mount_factory, monkeypatch, extra, prefix, force=True)
    return m


def check_pinned_mlock(m, st):
    """--pin without a GPU: the note on stderr, the lock in status and in the daemon."""
    assert st["gpu"] is None
    note = st["gpu_note"]
    assert note.startswith("no CUDA "), note
    notes = [line for line in m.mount_output.splitlines() if line.startswith("hwfs: note:")]
    assert len(notes) == 1, m.mount_output
    got = NOTE.match(notes[0])
    assert got, notes[0]
    assert got.group(1) == note
    with open(os.path.join(m.store, "hwfs.log")) as f:
        assert notes[0][len("hwfs: note: "):] in f.read()
    store = st["store"]
    assert store["preallocated"] is True
    assert store["capacity_bytes"] == CAP
    assert store["pinned"] == "mlock"
    assert store["pinned_bytes"] == CAP
    assert vm_locked(m.pid) >= CAP


def test_pin_without_gpu(mount_factory, monkeypatch, src):
    m = mount_no_gpu(mount_factory, monkeypatch)
    st = m.status()
    if os.geteuid() != 0 and st["store"]["pinned"] == "none":
        # Not root: RLIMIT_MEMLOCK may refuse 64 MiB; the mount said so and went on.
        assert "mlock of" in m.mount_output and "refused" in m.mount_output, m.mount_output
        assert st["store"]["pinned_bytes"] == 0
    else:
        check_pinned_mlock(m, st)

    out = m.run("status").stdout
    assert f"gpu:     none ({st['gpu_note']})\n" in out, out
    assert "64.00 MiB locked (mlock)" in out or "not pinned" in out, out

    # the pinned (never punched) arena holds and serves data as usual
    save_model(src / "model.safetensors", make_tensors(1, n=6))
    random_file(src / "blob.bin", 3_000_001, seed=5)
    m.run("publish", src, "v1")
    assert_tree_equal(src, m.vpath("v1"))
    m.run("rm", "v1")
    m.run("publish", src, "v2")
    assert_tree_equal(src, m.vpath("v2"))
    assert m.status()["store"]["pinned_bytes"] == st["store"]["pinned_bytes"]

    # unpinned at unmount, pinned again on the next mount
    m.remount()
    st = m.status()
    assert st["store"]["pinned"] == "mlock" or os.geteuid() != 0
    assert_tree_equal(src, m.vpath("v2"))


def test_no_pin_is_not_pinned(mount_factory, monkeypatch):
    m = mount_no_gpu(mount_factory, monkeypatch, extra=())
    st = m.status()
    assert "hwfs: note:" not in m.mount_output
    assert st["gpu"] is None and st["gpu_note"]
    assert st["store"]["pinned"] == "none"
    assert st["store"]["pinned_bytes"] == 0
    assert st["store"]["preallocated"] is False
    assert vm_locked(m.pid) < CAP
    out = m.run("status").stdout
    assert "gpu:     none (" in out and ", not pinned\n" in out, out


def test_hwfs_cudart_names_the_library(mount_factory, monkeypatch):
    m = mount_no_gpu(mount_factory, monkeypatch, force=True)
    st = m.status()
    assert "HWFS_CUDART=/nonexistent" in st["gpu_note"], st["gpu_note"]
    if os.geteuid() == 0:
        check_pinned_mlock(m, st)
    assert "HWFS_CUDART=/nonexistent" in m.mount_output


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping CAP_IPC_LOCK needs root to have it")
def test_refused_mlock_is_said_not_fatal(mount_factory, monkeypatch, src):
    # RLIMIT_MEMLOCK 0 and no CAP_IPC_LOCK: mlock is refused; the mount goes on.
    m = mount_no_gpu(mount_factory, monkeypatch, prefix=(
        "prlimit", "--memlock=0:0", "setpriv", "--bounding-set=-ipc_lock",
        "--inh-caps=-ipc_lock"))
    st = m.status()
    notes = [line for line in m.mount_output.splitlines() if line.startswith("hwfs: note:")]
    assert len(notes) == 1, m.mount_output
    assert f"no GPU ({st['gpu_note']}): arena not locked either: mlock of {CAP} bytes refused" \
        in notes[0], notes[0]
    assert "RLIMIT_MEMLOCK" in notes[0]
    assert st["store"]["pinned"] == "none"
    assert st["store"]["pinned_bytes"] == 0
    assert st["store"]["preallocated"] is True
    assert vm_locked(m.pid) == 0
    save_model(src / "model.safetensors", make_tensors(2, n=3))
    m.run("publish", src, "v1")
    assert_tree_equal(src, m.vpath("v1"))
