"""Dedup between versions, `hwfs diff`, `hwfs ls`, `hwfs verify`, `hwfs gc`, `hwfs rm`."""

import errno
import json
import os

import pytest

from conftest import (CHANGED_IDX, assert_error_line, changed_names, make_tensors, poll, random_file,
                      save_model, tensor_bytes)
from test_security_local import _ctl_connect


@pytest.fixture
def two_versions(mount, tmp_path):
    """v1 and v2 published; v2 has 2 of its 20 tensors changed."""
    t1 = make_tensors(100)
    t2 = make_tensors(100, changed=CHANGED_IDX)
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    save_model(s1 / "model.safetensors", t1)
    save_model(s2 / "model.safetensors", t2)
    (s1 / "config.json").write_text('{"v": 1}\n')
    (s2 / "config.json").write_text('{"v": 1}\n')
    u0 = mount.used_bytes()
    mount.run("publish", s1, "v1")
    u1 = mount.used_bytes()
    mount.run("publish", s2, "v2")
    u2 = mount.used_bytes()
    names = changed_names(t2)
    return mount, t1, t2, names, (u0, u1, u2)


def test_dedup_growth(two_versions):
    m, t1, t2, names, (u0, u1, u2) = two_versions
    changed = tensor_bytes(t2, names)
    assert u1 - u0 >= tensor_bytes(t1), "v1's tensors must all be stored"
    growth = u2 - u1
    assert growth >= changed, f"v2 grew the store by {growth} < changed bytes {changed}"
    assert growth <= 1.02 * changed + 64 * 1024, (
        f"v2 grew the store by {growth} bytes for {changed} changed tensor bytes "
        f"(limit {1.02 * changed + 65536:.0f})")


def test_identical_republish_costs_nothing(two_versions, tmp_path):
    m, t1, t2, names, _ = two_versions
    s3 = tmp_path / "s3"
    save_model(s3 / "model.safetensors", t1)
    (s3 / "config.json").write_text('{"v": 1}\n')
    before = m.used_bytes()
    m.run("publish", s3, "v3")
    assert m.used_bytes() - before <= 64 * 1024


def test_diff_json(two_versions):
    m, t1, t2, names, _ = two_versions
    d = json.loads(m.run("diff", "v1", "v2", "--json").stdout)
    assert d["a"] == "v1" and d["b"] == "v2"
    assert d["tensors_changed"] == 2
    assert d["tensors_same"] == len(t1) - 2
    assert d["tensors_added"] == 0 and d["tensors_removed"] == 0
    assert d["bytes_changed"] == tensor_bytes(t2, names)
    assert len(d["changed"]) == 2
    for n in names:
        assert any(c == n or c.endswith(n) for c in d["changed"]), (n, d["changed"])
    assert d["added"] == [] and d["removed"] == []
    assert isinstance(d["new_shard_bytes"], int)
    assert tensor_bytes(t2, names) <= d["new_shard_bytes"] <= tensor_bytes(t2, names) + 64 * 1024


def test_diff_added_removed(mount, tmp_path):
    t1 = make_tensors(200, n=6)
    t2 = dict(list(t1.items())[:4])
    t2["new.tensor"] = make_tensors(201, n=1, prefix="new")["new.0.weight"]
    for name, t in (("a", t1), ("b", t2)):
        save_model(tmp_path / name / "model.safetensors", t)
        mount.run("publish", tmp_path / name, name)
    d = json.loads(mount.run("diff", "a", "b", "--json").stdout)
    assert d["tensors_same"] == 4
    assert d["tensors_added"] == 1 and d["tensors_removed"] == 2
    assert d["tensors_changed"] == 0
    assert d["bytes_changed"] == t2["new.tensor"].nbytes
    assert any(x.endswith("new.tensor") for x in d["added"])
    assert len(d["removed"]) == 2


def test_diff_text(two_versions):
    m, t1, t2, names, _ = two_versions
    out = m.run("diff", "v1", "v2").stdout
    assert out.strip(), "hwfs diff printed nothing"
    assert_error_line(m.run("diff", "v1", "nope", check=False))


def test_ls(two_versions):
    m, *_ = two_versions
    os.mkdir(m.vpath("v3"))
    out = m.run("ls").stdout
    for n in ("v1", "v2", "v3"):
        assert n in out
    lst = json.loads(m.run("ls", "--json").stdout)
    assert isinstance(lst, list)
    states = {v["name"]: v["state"] for v in lst}
    assert states == {"v1": "sealed", "v2": "sealed", "v3": "open"}
    st = {v["name"]: v for v in m.status()["versions"]}
    for v in lst:
        assert v["seq"] == st[v["name"]]["seq"]
        assert v["bytes"] == st[v["name"]]["bytes"]
    assert sorted(os.listdir(m.path("versions"))) == ["v1", "v2", "v3"]


def test_verify_good_version(two_versions):
    m, *_ = two_versions
    assert m.run("verify", "v1").returncode == 0
    assert m.run("verify", "v2", "--json").returncode == 0
    assert m.version("v1")["state"] == "sealed"
    assert_error_line(m.run("verify", "nope", check=False))


def test_gc_keep(mount, tmp_path):
    # The open version is made first (lowest seq) so that "the N newest" means
    # v4 whether or not gc counts open versions when it ranks them.
    os.mkdir(mount.vpath("open1"))
    for i in range(1, 5):
        random_file(tmp_path / f"s{i}" / "blob.bin", 300_000, seed=i)
        mount.run("publish", tmp_path / f"s{i}", f"v{i}")
    mount.run("commit", "v1")
    before = mount.used_bytes()
    mount.run("gc", "--keep", "1")
    names = {v["name"]: v["state"] for v in mount.status()["versions"]}
    # v4 is the newest, v1 is current, open versions are not gc's business.
    assert names == {"v1": "sealed", "v4": "sealed", "open1": "open"}
    assert sorted(os.listdir(mount.path("versions"))) == ["open1", "v1", "v4"]
    assert os.readlink(mount.path("current")) == "versions/v1"
    assert poll(lambda: mount.used_bytes() < before), "gc freed nothing"
    assert open(mount.vpath("v4", "blob.bin"), "rb").read() == (tmp_path / "s4" / "blob.bin").read_bytes()


def test_rm(mount, tmp_path):
    random_file(tmp_path / "s1" / "a.bin", 500_000, seed=1)
    random_file(tmp_path / "s2" / "b.bin", 500_000, seed=2)
    mount.run("publish", tmp_path / "s1", "v1")
    before = mount.used_bytes()
    mount.run("publish", tmp_path / "s2", "v2")
    mount.run("rm", "v2")
    assert mount.version("v2") is None
    assert os.listdir(mount.path("versions")) == ["v1"]
    assert poll(lambda: mount.used_bytes() == before), (mount.used_bytes(), before)
    assert_error_line(mount.run("rm", "v2", check=False))


def test_rm_rf_of_a_sealed_version_says_use_hwfs_rm(two_versions):
    """`rm -rf versions/V` of a sealed version removes nothing: every entry answers EROFS,
    which is all rm(1) can print ("Read-only file system"); the daemon's log says once per
    version what to do instead, whatever the number of refusals (decision: the log, since
    rm shows only the errno)."""
    import subprocess
    m = two_versions[0]
    for _ in range(2):
        cp = subprocess.run(["rm", "-rf", m.vpath("v1")], capture_output=True, text=True)
        assert cp.returncode != 0 and "Read-only file system" in cp.stderr, cp.stderr
    cp = subprocess.run(["rm", "-rf", m.vpath("v2", "tensors")], capture_output=True, text=True)
    assert cp.returncode != 0
    assert m.version("v1")["state"] == "sealed" and m.run("verify", "v1").returncode == 0
    with open(os.path.join(m.store, "hwfs.log")) as f:
        log = f.read()
    for v in ("v1", "v2"):
        hints = [ln for ln in log.splitlines() if f"versions/{v} is sealed" in ln]
        assert len(hints) == 1, log
        assert hints[0].endswith(f"remove the version with `hwfs rm {v}`"), hints[0]


# Version names no version can have (control characters), as a shell passes them.
BAD_NAMES = ["a\nb", "v\x1b[2Jx", "tab\there", "del\x7f", "c1\u009bx"]


def test_control_characters_in_a_version_name_are_refused_at_once(two_versions, tmp_path):
    """`hwfs publish SRC $'a\\nb'` used to read the whole source, then fail
    over two lines.  Every verb that takes a version name refuses a name with
    a control character at once, in one line: invalid version name."""
    m = two_versions[0]
    src = tmp_path / "src"
    save_model(str(src / "model.safetensors"), make_tensors(seed=3, n=2))
    verbs = [("publish", str(src), "{}"), ("publish", "/nonexistent", "{}"), ("seal", "{}"),
             ("commit", "{}"), ("rm", "{}"), ("verify", "{}"), ("manifest", "{}"),
             ("diff", "v1", "{}"), ("diff", "{}", "v1"), ("diff", "v1", "{}", "--elements"),
             ("load", "{}", "--gpu", "0"), ("unload", "{}")]
    for bad in BAD_NAMES:
        for verb in verbs:
            cp = m.run(*[a.format(bad) for a in verb], check=False)
            assert_error_line(cp, "invalid version name")
            assert cp.stderr.count("\n") == 1 and not cp.stdout, (verb, bad, cp.stderr)
    for bad in BAD_NAMES:  # nor can one be made through the mount (C1 included)
        with pytest.raises(OSError) as e:
            os.mkdir(m.vpath(bad))
        assert e.value.errno == errno.EINVAL, (bad, e.value)
    assert sorted(v["name"] for v in m.status()["versions"]) == ["v1", "v2"]


def test_daemon_refuses_publish_of_a_bad_name_before_reading(two_versions, tmp_path):
    """A client other than `hwfs` (a raw request) is refused by the daemon
    itself before it reads the source: no progress line, one sentence, EINVAL."""
    m = two_versions[0]
    src = tmp_path / "src"
    save_model(str(src / "model.safetensors"), make_tensors(seed=3, n=2))
    for bad in BAD_NAMES:
        with _ctl_connect(m.mnt) as s:
            s.sendall(json.dumps({"op": "publish", "src": str(src), "version": bad}).encode()
                      + b"\n")
            lines = s.makefile("rb").read().splitlines()
        assert len(lines) == 1, lines  # the answer, after no progress line
        res = json.loads(lines[0])
        assert res["ok"] is False and res.get("errno") == errno.EINVAL, res
        assert res["error"].startswith("invalid version name") and "\n" not in res["error"], res


def test_status_shows_space_held_by_open_files(two_versions):
    """Space that open files hold shows in `hwfs status` beside the leases: a
    file of a removed version still open for reading keeps its bytes, and so
    does a file being written; both go when they are closed."""
    m = two_versions[0]
    none = {"removed_files": 0, "removed_bytes": 0, "writing_files": 0, "writing_bytes": 0}
    assert m.status()["held"] == none
    size = os.path.getsize(m.vpath("v1", "model.safetensors"))
    with open(m.vpath("v1", "model.safetensors"), "rb") as r:
        m.run("rm", "v1")
        os.mkdir(m.vpath("open1"))
        with open(m.vpath("open1", "w.bin"), "wb") as w:
            w.write(b"x" * 12345)
            w.flush()
            held = m.status()["held"]
            assert held == {"removed_files": 1, "removed_bytes": size, "writing_files": 1,
                            "writing_bytes": 12345}, held
            text = m.run("status").stdout
            line = [ln for ln in text.splitlines() if ln.startswith("held:")]
            assert len(line) == 1, text
            assert "1 removed file still open" in line[0], line
            assert "1 file being written" in line[0], line
        assert m.status()["held"]["writing_files"] == 0
        assert m.status()["held"]["removed_files"] == 1
    assert poll(lambda: m.status()["held"] == none), m.status()["held"]
    assert not [ln for ln in m.run("status").stdout.splitlines() if ln.startswith("held:")]
