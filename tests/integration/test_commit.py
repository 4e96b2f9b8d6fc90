"""`hwfs commit`, the current symlink, and readers that outlive commit and rm."""

import os
import queue
import subprocess
import threading
import time

import pytest

from conftest import (CHANGED_IDX, assert_error_line, make_tensors, poll, readlink_or_none, save_model,
                      scaled, sh)


@pytest.fixture
def v1v2(mount, tmp_path):
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    save_model(s1 / "model.safetensors", make_tensors(300))
    save_model(s2 / "model.safetensors", make_tensors(300, changed=CHANGED_IDX))
    mount.run("publish", s1, "v1")
    mount.run("publish", s2, "v2")
    return mount, s1, s2


def test_commit_flips_current(v1v2):
    m, s1, s2 = v1v2
    m.run("commit", "v1")
    assert os.readlink(m.path("current")) == "versions/v1"
    assert m.status()["current"] == "v1"
    assert open(m.path("current", "model.safetensors"), "rb").read() == (s1 / "model.safetensors").read_bytes()
    m.run("commit", "v2")
    assert os.readlink(m.path("current")) == "versions/v2"
    assert m.status()["current"] == "v2"
    assert open(m.path("current", "model.safetensors"), "rb").read() == (s2 / "model.safetensors").read_bytes()
    assert {"current", "versions"} <= set(os.listdir(m.mnt))


def test_commit_emits_inotify_moved_to(v1v2):
    m, *_ = v1v2
    p = subprocess.Popen(["inotifywait", "-m", m.mnt], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    lines = queue.Queue()

    def reader():
        for line in p.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=reader, daemon=True).start()
    seen = []
    try:
        deadline = time.monotonic() + scaled(10)
        while not any("Watches established" in s for s in seen):
            assert time.monotonic() < deadline, f"inotifywait did not start: {seen}"
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        m.run("commit", "v2")
        deadline = time.monotonic() + scaled(10)
        while not any("MOVED_TO" in s and "current" in s for s in seen):
            assert time.monotonic() < deadline, f"no MOVED_TO current event; inotifywait printed {seen}"
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
    finally:
        p.kill()
        p.wait(timeout=10)
    assert os.readlink(m.path("current")) == "versions/v2"


def test_manual_symlink_rename_commits(v1v2):
    m, s1, s2 = v1v2
    m.run("commit", "v1")
    sh(["ln", "-s", "versions/v2", m.path(".tmp")])
    sh(["mv", "-T", m.path(".tmp"), m.path("current")])
    assert os.readlink(m.path("current")) == "versions/v2"
    assert not os.path.lexists(m.path(".tmp"))
    assert m.status()["current"] == "v2"
    assert open(m.path("current", "model.safetensors"), "rb").read() == (s2 / "model.safetensors").read_bytes()


def test_commit_open_version_refused(v1v2):
    m, *_ = v1v2
    m.run("commit", "v1")
    os.mkdir(m.vpath("v3"))
    assert_error_line(m.run("commit", "v3", check=False), "open")
    assert os.readlink(m.path("current")) == "versions/v1"
    assert m.status()["current"] == "v1"


def test_commit_unknown_version_refused(v1v2):
    m, *_ = v1v2
    m.run("commit", "v1")
    assert_error_line(m.run("commit", "nope", check=False), "no such version")
    assert os.readlink(m.path("current")) == "versions/v1"
    assert m.status()["current"] == "v1"


def test_commit_before_any_refused_leaves_no_current(mount):
    assert_error_line(mount.run("commit", "nope", check=False), "no such version")
    assert readlink_or_none(mount.path("current")) is None


def test_open_reader_survives_commit(v1v2):
    m, s1, s2 = v1v2
    m.run("commit", "v1")
    want = (s1 / "model.safetensors").read_bytes()
    fd = os.open(m.path("current", "model.safetensors"), os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == want[:4096]
        m.run("commit", "v2")
        assert os.readlink(m.path("current")) == "versions/v2"
        assert os.pread(fd, len(want) + 1, 0) == want
    finally:
        os.close(fd)


def test_rm_while_open(v1v2):
    m, s1, s2 = v1v2
    want = (s1 / "model.safetensors").read_bytes()
    fd = os.open(m.vpath("v1", "model.safetensors"), os.O_RDONLY)
    closed = False
    try:
        assert os.pread(fd, 8, 0) == want[:8]
        m.run("commit", "v2")
        before = m.used_bytes()
        m.run("rm", "v1")
        assert "v1" not in os.listdir(m.path("versions"))
        assert m.version("v1") is None
        assert not os.path.exists(m.vpath("v1"))
        # The open descriptor still reads v1's bytes, all of them — from the
        # daemon, not from the page cache, which is dropped first.
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        assert os.pread(fd, len(want) + 1, 0) == want
        os.close(fd)
        closed = True
        assert poll(lambda: m.used_bytes() < before, timeout=5.0), (
            f"store.used_bytes did not drop after the last reader of v1 closed ({before})")
    finally:
        if not closed:
            os.close(fd)
    assert os.readlink(m.path("current")) == "versions/v2"


def test_rm_current_refused(v1v2):
    m, *_ = v1v2
    m.run("commit", "v1")
    assert_error_line(m.run("rm", "v1", check=False))
    assert m.version("v1")["state"] == "sealed"
    assert os.readlink(m.path("current")) == "versions/v1"
    assert "v1" in os.listdir(m.path("versions"))
