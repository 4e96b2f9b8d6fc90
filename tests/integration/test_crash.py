"""kill -9 of the daemon never loses a sealed version and never seals a partial one.

Each kill is made to land in the middle of its operation, and the test asserts
that it did: before the SIGKILL it waits for progress the daemon shows (bytes of
an open file it has taken, the `sealing` mark of a version, a publish's progress
line), and after the restart it checks that the operation had not finished.
"""

import errno
import json
import os
import socket
import subprocess

import pytest

from conftest import (HWFS, TIMEOUT, assert_same_file, assert_tree_equal, make_hf_model, make_tensors,
                      poll, random_file, save_model)


@pytest.fixture
def committed(mount, tmp_path):
    s1 = tmp_path / "s1"
    save_model(s1 / "model.safetensors", make_tensors(800))
    (s1 / "config.json").write_text('{"v": 1}\n')
    mount.run("publish", s1, "v1")
    mount.run("commit", "v1")
    return mount, s1


def _check_after_restart(m, s1, not_sealed=(), sources=None):
    """v1 and current are intact, every sealed version verifies, and the
    versions in @not_sealed are absent or open."""
    st = m.status()
    assert st["current"] == "v1"
    assert os.readlink(m.path("current")) == "versions/v1"
    assert_tree_equal(s1, m.vpath("v1"))
    assert_same_file(s1 / "model.safetensors", m.path("current", "model.safetensors"))
    for v in st["versions"]:
        if v["name"] in not_sealed:
            assert v["state"] == "open", f"{v['name']} was {v['state']} after kill -9 before it was sealed"
        if v["state"] == "sealed":
            assert m.run("verify", v["name"]).returncode == 0
            if sources and v["name"] in sources:
                assert_tree_equal(sources[v["name"]], m.vpath(v["name"]))
        assert v["state"] != "damaged", f"{v['name']} is damaged after restart"


def _reap(p):
    try:
        p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"{p.args} hung after the daemon was killed")


def test_kill9_with_half_written_open_version(committed, src):
    m, s1 = committed
    os.mkdir(m.vpath("v2"))
    f = open(m.vpath("v2", "half.bin"), "wb")
    f.write(os.urandom(8 << 20))
    f.flush()
    try:
        # mid-file: the daemon has taken the 8 MiB (writes to an open version are
        # not cached by the kernel), the file is still open, v2 is open
        assert os.stat(m.vpath("v2", "half.bin")).st_size == 8 << 20
        assert m.version("v2")["state"] == "open"
        m.kill9()
    finally:
        try:
            f.close()
        except OSError:
            pass
    m.mount()
    _check_after_restart(m, s1, not_sealed={"v2"})


@pytest.mark.limit(240)
@pytest.mark.parametrize("fed", [1, (4 << 20) + 123, 24 << 20])
def test_kill9_during_cp(committed, src, fed):
    """A writer fed through a pipe: @fed bytes of a 48 MiB file are in the daemon
    (the file's size says so) and the writer is blocked on the pipe, mid-file,
    when the daemon is killed."""
    m, s1 = committed
    data = random_file(src / "big.bin", 48 << 20, seed=801).read_bytes()
    os.mkdir(m.vpath("v2"))
    dest = m.vpath("v2", "big.bin")
    p = subprocess.Popen(["dd", f"of={dest}", "bs=64K", "status=none"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.stdin.write(data[:fed])
        p.stdin.flush()
        assert poll(lambda: os.path.exists(dest) and os.stat(dest).st_size == fed, 20), \
            f"the daemon never showed the {fed} bytes fed"
        assert p.poll() is None, "the writer ended before the kill"
        m.kill9()
    finally:
        try:
            p.stdin.write(data[fed:fed + (1 << 20)])  # the writer wakes up to a dead mount
            p.stdin.close()
        except OSError:
            pass
    _reap(p)
    assert p.returncode != 0, "dd succeeded on a killed daemon's mount"
    m.mount()
    _check_after_restart(m, s1, not_sealed={"v2"})


def _sealing(m, name):
    """True once @name is marked sealing or sealed: rmdir of a non-empty open
    version says ENOTEMPTY, of one being sealed (or sealed) EROFS; it changes nothing."""
    try:
        os.rmdir(m.vpath(name))
    except OSError as e:
        if e.errno == errno.EROFS:
            return True
        assert e.errno == errno.ENOTEMPTY, e
        return False
    raise AssertionError(f"rmdir of {name} succeeded")


@pytest.mark.limit(300)
def test_kill9_during_seal(committed, tmp_path):
    """The kill lands after the seal marked the version (seen with _sealing())
    and before it finished (the version is not sealed after the restart): 3000
    small files make the seal's record and index transaction long enough."""
    m, s1 = committed
    sources = {}
    for i in range(2):
        name = f"seal{i}"
        d = make_hf_model(tmp_path / name, seed=900 + i)
        random_file(d / "extra.bin", 24 << 20, seed=900 + i)
        for k in range(3000):
            (d / "many").mkdir(exist_ok=True)
            (d / "many" / f"f{k}").write_bytes(b"%d/%d\n" % (i, k))
        sources[name] = d
        os.mkdir(m.vpath(name))
        subprocess.run(["cp", "-r", f"{d}/.", m.vpath(name)], check=True, timeout=TIMEOUT)
        assert not _sealing(m, name)
        p = subprocess.Popen([HWFS, "seal", name, "-m", m.mnt], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        while not _sealing(m, name):
            assert p.poll() is None, f"hwfs seal {name} ended before the seal was seen"
        m.kill9()
        _reap(p)
        m.mount()
        # A version is either sealed completely (then identical and verified) or not at all.
        _check_after_restart(m, s1, sources=sources)
        v = m.version(name)
        assert v is None or v["state"] == "open", \
            f"the kill landed after the seal of {name} had finished: {v}"


def _publish_until_progress(m, src, name):
    """Start `publish` on a control connection and read its progress lines until
    one says it is under way (0 < done < total); returns the connection."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(os.getxattr(m.mnt, "user.hwfs.control").decode())
    s.sendall(json.dumps({"op": "publish", "src": str(src), "version": name}).encode() + b"\n")
    f = s.makefile("rb")
    while True:
        line = json.loads(f.readline())
        assert "progress" in line, f"publish of {name} ended before the kill: {line}"
        if 0 < line["progress"]["done"] < line["progress"]["total"]:
            return s


@pytest.mark.limit(240)
def test_kill9_during_publish(committed, tmp_path, monkeypatch):
    """The kill lands after a progress line showed bytes copied and before the
    publish finished (its version does not exist after the restart).  The daemon
    reads its sources 4 KiB at a time (HWFS_PUBLISH_IO, its least) so that a publish lasts."""
    m, s1 = committed
    monkeypatch.setenv("HWFS_PUBLISH_IO", "4096")
    m.remount()
    sources = {}
    for i in range(3):
        name = f"pub{i}"
        d = tmp_path / name
        save_model(d / "model.safetensors", make_tensors(950 + i, n=30))
        random_file(d / "extra.bin", 16 << 20, seed=950 + i)
        with open(d / "zeros.bin", "wb") as f:  # sparse: cheap to make, slow to read 4 KiB at a time
            f.truncate((1024 + 256 * i) << 20)
        sources[name] = d
        conn = _publish_until_progress(m, d, name)
        try:
            m.kill9()
        finally:
            conn.close()
        m.mount()
        _check_after_restart(m, s1, sources=sources)
        assert m.version(name) is None, f"the kill landed after the publish of {name}: " \
            f"{m.version(name)}"
        assert not [v for v in m.status()["versions"] if v["name"].startswith(".hwfs-")]
