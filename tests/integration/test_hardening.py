"""Hardening: reads over many shards, permissions of tensors/, sealing after a
failed write, hostile tensor names, the reserved `.hwfs-` prefix, safetensors
recognised by content, open/close races with `hwfs rm`."""

import errno
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import (HWFS, assert_error_line, assert_same_file, expect_errno, poll,
                      random_file, save_model, sh)

READ_TIMEOUT = 30  # seconds for one reader subprocess (a lost FUSE reply hangs it)

# A reader in its own process: a lost reply leaves it waiting on the mount, and
# the test must not wait with it (the watchdog kills the daemon, which frees it).
_PREAD = ("import os, sys\n"
          "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
          "off, n = int(sys.argv[2]), int(sys.argv[3])\n"
          "out = bytearray()\n"
          "while len(out) < n:\n"
          "    b = os.pread(fd, n - len(out), off + len(out))\n"
          "    if not b: break\n"
          "    out += b\n"
          "sys.stdout.buffer.write(out)\n")


def pread_in_child(path, off, n, timeout=READ_TIMEOUT):
    """Bytes [off, off+n) of @path read by a child process with a deadline."""
    try:
        cp = subprocess.run([sys.executable, "-c", _PREAD, str(path), str(off), str(n)],
                            capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"read of {path} [{off}, +{n}) did not return within {timeout}s")
    assert cp.returncode == 0, cp.stderr.decode(errors="replace")
    return cp.stdout


# ------------------------------------------------------------ 4: many shards


def many_small_tensors(n, size=512):
    """@n tensors of @size bytes: every other one all zeros (deduplicated into one
    shard, so the file's extents are not contiguous in the arena), the others
    distinct."""
    rng = np.random.default_rng(4)
    out = {}
    for i in range(n):
        if i % 2:
            out[f"t.{i:05d}"] = np.zeros(size, dtype=np.uint8)
        else:
            out[f"t.{i:05d}"] = rng.integers(0, 256, size=size, dtype=np.uint8)
    return out


@pytest.mark.limit(90)
@pytest.mark.parametrize("n", [1100, 3000])
def test_read_spanning_many_shards_returns(mount, src, n):
    t = many_small_tensors(n)
    save_model(src / "model.safetensors", t)
    os.mkdir(mount.vpath("v1"))
    sh(["cp", src / "model.safetensors", mount.vpath("v1")])
    mount.run("seal", "v1")
    dst = mount.vpath("v1", "model.safetensors")
    data = (src / "model.safetensors").read_bytes()
    # cmp reads sequentially through the page cache (kernel readahead: up to 1 MiB requests)
    sh(["cmp", src / "model.safetensors", dst], timeout=READ_TIMEOUT)
    for off, length in ((0, len(data)), (12345, len(data)), (len(data) // 3 + 7, 700_001),
                        (len(data) - 1000, 5000)):
        assert pread_in_child(dst, off, length) == data[off:off + length], (off, length)
    tdir = mount.vpath("v1", "tensors")
    for name in (f"t.{0:05d}", f"t.{1:05d}", f"t.{n - 1:05d}"):
        assert pread_in_child(os.path.join(tdir, name), 0, 1 << 20) == t[name].tobytes(), name


# ------------------------------------------------------- 3: tensors/ permissions

NOBODY = 65534


def read_as_nobody(path):
    """`cat @path > /dev/null` as uid/gid 65534 with no supplementary groups."""
    return sh(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
               "sh", "-c", 'exec cat -- "$1" > /dev/null', "cat", path],
              check=False, timeout=READ_TIMEOUT)


def small_model():
    rng = np.random.default_rng(3)
    return {"a.weight": rng.standard_normal((16, 16), dtype=np.float32),
            "b.bias": rng.standard_normal(16, dtype=np.float32)}


def test_tensor_entries_take_owner_and_mode_of_their_file(mount, src):
    t = small_model()
    save_model(src / "private.safetensors", t)
    save_model(src / "shared.safetensors", {"c.weight": np.ones((4, 4), dtype=np.float32)})
    os.mkdir(mount.vpath("v1"))
    sh(["cp", src / "private.safetensors", src / "shared.safetensors", mount.vpath("v1")])
    os.chmod(mount.vpath("v1", "private.safetensors"), 0o600)
    os.chown(mount.vpath("v1", "private.safetensors"), 1234, 2345)
    os.chmod(mount.vpath("v1", "shared.safetensors"), 0o664)
    mount.run("seal", "v1")
    tdir = mount.vpath("v1", "tensors")
    for name in t:
        st = os.stat(os.path.join(tdir, name))
        assert (st.st_uid, st.st_gid) == (1234, 2345), name
        assert st.st_mode & 0o7777 == 0o400, oct(st.st_mode)
    st = os.stat(os.path.join(tdir, "c.weight"))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o444)
    # the kernel enforces the modes (default_permissions): nobody reads neither
    # the file nor its tensors, but does read the shared file's tensor
    for p in (mount.vpath("v1", "private.safetensors"), os.path.join(tdir, "a.weight")):
        cp = read_as_nobody(p)
        assert cp.returncode != 0 and "Permission denied" in cp.stderr, (p, cp.stderr)
    cp = read_as_nobody(os.path.join(tdir, "c.weight"))
    assert cp.returncode == 0, cp.stderr
    # and after a remount (the tree is rebuilt from the index)
    mount.remount()
    st = os.stat(os.path.join(tdir, "a.weight"))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 2345, 0o400)
    cp = read_as_nobody(os.path.join(tdir, "a.weight"))
    assert cp.returncode != 0 and "Permission denied" in cp.stderr, cp.stderr


def test_published_private_file_keeps_its_tensors_private(mount, src):
    save_model(src / "m" / "model.safetensors", small_model())
    os.chmod(src / "m" / "model.safetensors", 0o640)
    os.chown(src / "m" / "model.safetensors", 1234, 2345)
    mount.run("publish", src / "m", "v1")
    st = os.stat(mount.vpath("v1", "tensors", "a.weight"))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 2345, 0o440)
    cp = read_as_nobody(mount.vpath("v1", "tensors", "a.weight"))
    assert cp.returncode != 0 and "Permission denied" in cp.stderr, cp.stderr


# ------------------------------------------------- 9: sealing after a failed write

CAP = 32 << 20
BIG = 48 << 20  # random bytes: no dedup brings it under CAP


@pytest.fixture
def full_store(mount_factory, src):
    m = mount_factory(capacity=str(CAP))
    random_file(src / "big.bin", BIG, seed=901)
    random_file(src / "small.bin", 1 << 20, seed=902)
    return m


def failed_cp(m, src, version):
    os.mkdir(m.vpath(version))
    cp = sh(["cp", src / "big.bin", m.vpath(version)], check=False)
    assert cp.returncode != 0 and "No space left on device" in cp.stderr, cp.stderr


def test_seal_refused_after_failed_write(full_store, src):
    m = full_store
    failed_cp(m, src, "v1")
    cp = m.run("seal", "v1", check=False)
    assert_error_line(cp, "v1", "big.bin", "No space left on device", "--force")
    assert m.version("v1")["state"] == "open"
    assert_error_line(m.run("commit", "v1", check=False), "v1")
    # the rename-to-seal convention is refused the same way
    with pytest.raises(OSError) as ei:
        os.rename(m.vpath("v1"), m.vpath("v1.final"))
    expect_errno(ei, errno.EIO)
    assert m.version("v1")["state"] == "open" and m.version("v1.final") is None
    # removing the file clears the mark: a good file then seals
    os.unlink(m.vpath("v1", "big.bin"))
    sh(["cp", src / "small.bin", m.vpath("v1")])
    m.run("seal", "v1")
    assert sorted(os.listdir(m.vpath("v1"))) == ["small.bin"]
    assert_same_file(src / "small.bin", m.vpath("v1", "small.bin"))
    m.run("commit", "v1")


def test_rewrite_clears_failed_write_mark(full_store, src):
    m = full_store
    failed_cp(m, src, "v1")
    # cp onto the file opens it with O_TRUNC: a full rewrite
    sh(["cp", src / "small.bin", m.vpath("v1", "big.bin")])
    m.run("seal", "v1")
    assert_same_file(src / "small.bin", m.vpath("v1", "big.bin"))


def test_seal_force_seals_after_failed_write(full_store, src):
    m = full_store
    failed_cp(m, src, "v1")
    size = os.path.getsize(m.vpath("v1", "big.bin"))
    assert size < BIG
    m.run("seal", "--force", "v1")
    assert m.version("v1")["state"] == "sealed"
    assert os.path.getsize(m.vpath("v1", "big.bin")) == size
    m.run("commit", "v1")


def test_publish_fails_when_its_copy_fails(full_store, src):
    m = full_store
    os.mkdir(src / "tree")
    os.rename(src / "big.bin", src / "tree" / "big.bin")
    cp = m.run("publish", src / "tree", "v1", check=False)
    assert_error_line(cp, "big.bin", "No space left on device")
    assert m.version("v1") is None
    assert os.listdir(m.path("versions")) == []


# ------------------------------------------------ 11a: unrepresentable tensor names


def test_unrepresentable_tensor_names_are_left_out(mount, src):
    rng = np.random.default_rng(11)
    t = {"a" * 4096: rng.standard_normal(8, dtype=np.float32),
         "b" * 300: rng.standard_normal(8, dtype=np.float32),
         "c" * 255: rng.standard_normal(8, dtype=np.float32),   # longest that fits
         "d" * 84 + "/": rng.standard_normal(8, dtype=np.float32),  # 87 bytes escaped
         "e" * 253 + "/": rng.standard_normal(8, dtype=np.float32),  # 256 escaped: too long
         "w1": rng.standard_normal((4, 4), dtype=np.float32),
         "x/y": rng.standard_normal(3, dtype=np.float32)}
    save_model(src / "model.safetensors", t)
    os.mkdir(mount.vpath("v1"))
    sh(["cp", src / "model.safetensors", mount.vpath("v1")])
    mount.run("seal", "v1")
    tdir = mount.vpath("v1", "tensors")
    shown = {"c" * 255: "c" * 255, "d" * 84 + "%2F": "d" * 84 + "/", "w1": "w1", "x%2Fy": "x/y"}
    assert sorted(os.listdir(tdir)) == sorted(shown)
    for fname, name in shown.items():
        with open(os.path.join(tdir, fname), "rb") as f:
            assert f.read() == t[name].tobytes(), fname
    assert_same_file(src / "model.safetensors", mount.vpath("v1", "model.safetensors"))
    v = mount.version("v1")
    assert v["state"] == "sealed"
    man = json.loads(mount.run("manifest", "v1").stdout)
    names = {x["name"] for f in man["files"] for x in f.get("tensors", [])}
    assert names == set(t), "the manifest keeps every tensor"
    mount.remount()
    assert sorted(os.listdir(tdir)) == sorted(shown)


# A tensor name and a partition pattern that try a colour, a C1 CSI (U+009B,
# 0xC2 0x9B in UTF-8) and a line of their own; and how hwfs_escape() shows them.
EVIL = "\x1b[31mred\u009b2J\nINJECTED fake line"
EVIL_ESCAPED = "\\x1b[31mred\\xc2\\x9b2J\\x0aINJECTED fake line"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z hwfs\[\w+\]: ")


def raw_controls(text):
    """The C0 (but newlines), DEL and C1 control characters in @text."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]


def test_names_from_files_are_escaped_in_tp_readme_log_and_manifest(mount, src):
    """A tensor name (and a hwfs-partition.json pattern) is whatever a file
    says.  tp/README and hwfs.log show it with its control characters as \\xNN
    (hwfs_escape): no terminal escape, no C1 CSI, no line of its own; `hwfs
    manifest` prints them as JSON \\u00NN escapes (C1 and DEL used to go out
    raw) and stays one line of the same JSON."""
    rng = np.random.default_rng(5)
    bad = f"a.q_proj.{EVIL}.weight"  # split on dim 0, whose 3 rows divide by no N > 1
    t = {bad: rng.standard_normal((3, 4), dtype=np.float32),
         "b.\x1b]0;owned\x07": rng.standard_normal(4, dtype=np.float32),
         "c.\u009b2J\x7f": rng.standard_normal(4, dtype=np.float32)}
    save_model(src / "v1" / "model.safetensors", t)
    os.makedirs(src / "v2")
    sh(["cp", src / "v1" / "model.safetensors", src / "v2"])
    with open(src / "v2" / "hwfs-partition.json", "w") as f:
        json.dump({f"*{EVIL}": 5}, f)
    mount.run("publish", src / "v1", "v1")
    mount.run("publish", src / "v2", "v2")

    with open(mount.vpath("v1", "tp", "README"), encoding="utf-8") as f:
        readme = f.read()
    assert not raw_controls(readme), readme
    assert f"2: EINVAL: tensor a.q_proj.{EVIL_ESCAPED}.weight: dim 0 of size 3 does not " \
           "divide by 2\n" in readme, readme
    assert not any(ln.startswith("INJECTED") for ln in readme.splitlines()), readme
    with open(mount.vpath("v2", "tp", "README"), encoding="utf-8") as f:
        readme = f.read()
    assert not raw_controls(readme), readme
    assert f'8: EINVAL: hwfs-partition.json: pattern "*{EVIL_ESCAPED}": the rule must be' \
        in readme, readme
    assert not any(ln.startswith("INJECTED") for ln in readme.splitlines()), readme

    with open(os.path.join(mount.store, "hwfs.log"), encoding="utf-8") as f:
        log = f.read()
    assert not raw_controls(log), [ln for ln in log.splitlines() if raw_controls(ln)]
    assert all(LOG_LINE.match(ln) for ln in log.splitlines()), \
        [ln for ln in log.splitlines() if not LOG_LINE.match(ln)]
    assert f"version v1: tp/2: tensor a.q_proj.{EVIL_ESCAPED}.weight: dim 0" in log, log
    assert f'version v2: tp/8: hwfs-partition.json: pattern "*{EVIL_ESCAPED}"' in log, log

    out = mount.run("manifest", "v1").stdout
    assert not raw_controls(out) and out.count("\n") == 1, out
    assert "\\u001B[31mred\\u009B2J\\nINJECTED" in out and "\\u007F" in out, out
    man = json.loads(out)
    assert {x["name"] for f in man["files"] for x in f.get("tensors", [])} == set(t)


# ------------------------------------------------------- 11b: reserved .hwfs- prefix


def test_reserved_prefix_refused_under_versions(mount, src):
    vers = mount.path("versions")
    with pytest.raises(OSError) as ei:
        os.mkdir(os.path.join(vers, ".hwfs-x"))
    expect_errno(ei, errno.EPERM)
    with pytest.raises(OSError) as ei:
        os.close(os.open(os.path.join(vers, ".hwfs-f"), os.O_CREAT | os.O_WRONLY, 0o644))
    expect_errno(ei, errno.EPERM)
    with pytest.raises(OSError) as ei:
        os.symlink("v1", os.path.join(vers, ".hwfs-l"))
    expect_errno(ei, errno.EPERM)
    os.mkdir(mount.vpath("v1"))
    with pytest.raises(OSError) as ei:
        os.rename(mount.vpath("v1"), os.path.join(vers, ".hwfs-publish-1-1"))
    expect_errno(ei, errno.EPERM)
    assert mount.version("v1")["state"] == "open"
    assert [v["name"] for v in mount.status()["versions"]] == ["v1"]
    assert os.listdir(vers) == ["v1"]
    # the name is still allowed inside a version, and publish (which stages
    # under the prefix inside the daemon) still works
    os.mkdir(mount.vpath("v1", ".hwfs-dir"))
    save_model(src / "m" / "model.safetensors", small_model())
    mount.run("publish", src / "m", "v2")
    assert sorted(os.listdir(vers)) == ["v1", "v2"]
    assert mount.version("v2")["state"] == "sealed"


# --------------------------------------------------- 11d: safetensors by content


def test_hf_cache_blobs_get_a_tensor_view(mount, src):
    t = small_model()
    repo = src / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / ("ab" * 20)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    save_model(src / "model.tmp", t)
    model = (src / "model.tmp").read_bytes()
    (src / "model.tmp").unlink()
    config = b'{"hidden_size": 16}\n'
    garbage = struct.pack("<Q", 40) + b"{" + os.urandom(100)  # plausible length, no JSON
    for data, link in ((model, "model.safetensors"), (config, "config.json"),
                       (garbage, "extra.bin")):
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        os.symlink(f"../../blobs/{h}", snap / link)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    os.mkdir(mount.vpath("v1"))
    sh(["cp", "-a", src / "hub", mount.vpath("v1")])
    mount.run("seal", "v1")
    v = mount.version("v1")
    assert v["errors"] == [], v["errors"]  # a blob that is not safetensors is no error
    assert v["tensors"] == len(t)
    tdir = mount.vpath("v1", "tensors")
    assert sorted(os.listdir(tdir)) == sorted(t)
    for name, arr in t.items():
        with open(os.path.join(tdir, name), "rb") as f:
            assert f.read() == arr.tobytes(), name
    snapdir = mount.vpath("v1", "hub", "models--org--tiny", "snapshots", "ab" * 20)
    with open(os.path.join(snapdir, "model.safetensors"), "rb") as f:
        assert f.read() == model
    # a *.safetensors that does not parse still reports why
    os.mkdir(mount.vpath("v2"))
    with open(mount.vpath("v2", "bad.safetensors"), "wb") as f:
        f.write(garbage)
    mount.run("seal", "v2")
    errs = mount.version("v2")["errors"]
    assert [e["file"] for e in errs] == ["bad.safetensors"], errs
    mount.remount()
    assert sorted(os.listdir(tdir)) == sorted(t)


# ------------------------------------------- 12b: open/close racing with `hwfs rm`

THREADS = 8
ROUNDS = 20
WARM_READS = 10  # reads each reader completes before the version is removed


def _reader(paths, expected, started, stop, errors):
    """Open, read and close @paths round-robin until opening fails with ENOENT
    (the version was removed) or @stop is set; record anything else in @errors."""
    i = 0
    try:
        while not stop.is_set():
            p = paths[i % len(paths)]
            flags = os.O_RDONLY | (os.O_DIRECT if i % 2 else 0)  # O_DIRECT: every read reaches the daemon
            i += 1
            try:
                fd = os.open(p, flags)
            except FileNotFoundError:
                return
            try:
                data = bytearray()
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    data += b
            finally:
                os.close(fd)
            if bytes(data) != expected[p]:
                errors.append(f"{p}: read {len(data)} bytes, not the {len(expected[p])} written")
                return
            if i >= WARM_READS:
                started.set()
    except OSError as e:
        errors.append(f"{e!r}")
    finally:
        started.set()


@pytest.mark.limit(120)
def test_open_close_racing_with_rm(mount, src):
    t = small_model()
    save_model(src / "model.safetensors", t)
    random_file(src / "data.bin", 1 << 20, seed=12)
    baseline = mount.used_bytes()
    for r in range(ROUNDS):
        v = f"v{r}"
        mount.run("publish", src, v)
        expected = {mount.vpath(v, "data.bin"): (src / "data.bin").read_bytes(),
                    mount.vpath(v, "model.safetensors"): (src / "model.safetensors").read_bytes()}
        for name, arr in t.items():
            expected[mount.vpath(v, "tensors", name)] = arr.tobytes()
        paths = sorted(expected)
        stop, errors, threads, started = threading.Event(), [], [], []
        for k in range(THREADS):
            ev = threading.Event()
            th = threading.Thread(target=_reader, args=(paths[k % len(paths):] + paths[:k % len(paths)],
                                                        expected, ev, stop, errors), daemon=True)
            th.start()
            threads.append(th)
            started.append(ev)
        for ev in started:
            assert ev.wait(30), "a reader never completed a read"
        mount.run("rm", v)
        for th in threads:
            th.join(30)
        stop.set()
        assert not any(th.is_alive() for th in threads), "a reader is stuck"
        assert errors == [], errors
        assert mount.version(v) is None
    # every shard is given back once the last reader closed
    assert poll(lambda: mount.used_bytes() == baseline, timeout=10), (mount.used_bytes(), baseline)
    assert mount.status()["pid"] == mount.pid


# ------------------------------------- 11e: staging versions are not the client's


# Verbs that take a version name from the client, as `hwfs` argument lists.
_NAMED_VERBS = (("rm", "{v}"), ("seal", "{v}"), ("commit", "{v}"), ("verify", "{v}"),
                ("manifest", "{v}"), ("diff", "{v}", "v0"), ("diff", "v0", "{v}"))


@pytest.mark.limit(120)
def test_verbs_refuse_a_publish_staging_version(mount_factory, src):
    """`hwfs rm` (and every verb given a version name) of the hidden staging
    version of a publish in progress is refused as a reserved name, and the
    publish completes intact (it used to be removed under the publish, which
    then wrote into freed nodes)."""
    # small reads make the publish slow enough to be caught in progress
    m = mount_factory(extra=["-o", "publish_io=4096"])
    save_model(src / "v0" / "model.safetensors", small_model())
    m.run("publish", src / "v0", "v0")
    tree = src / "tree"
    save_model(tree / "model.safetensors", small_model())
    for i in range(4):
        random_file(tree / "sub" / f"part{i}.bin", 24 << 20, seed=1100 + i)
    # the daemon's first publish took counter 1; this one stages under counter 2
    staging = f".hwfs-publish-{m.pid}-2"
    spath = m.path("versions", staging)
    p = subprocess.Popen([HWFS, "publish", str(tree), "v1", "-m", m.mnt],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = poll(lambda: os.path.isdir(spath) or p.poll() is not None, timeout=60,
                    interval=0.002)
        assert seen and os.path.isdir(spath), "the publish ended before its staging was seen"
        for verb in _NAMED_VERBS:
            cp = m.run(*[a.format(v=staging) for a in verb], check=False)
            assert_error_line(cp, "reserved")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert m.version("v1")["state"] == "sealed"
    assert sorted(os.listdir(m.path("versions"))) == ["v0", "v1"]
    for f in ("model.safetensors", "sub/part0.bin", "sub/part3.bin"):
        assert_same_file(tree / f, m.vpath("v1", f))
    assert m.run("verify", "v1").returncode == 0
    # names with the prefix are refused whether or not such a version exists
    assert_error_line(m.run("rm", ".hwfs-anything", check=False), "reserved")
    assert m.status()["pid"] == m.pid


def test_a_stuck_daemons_socket_does_not_hold_up_a_new_mount(mount_factory):
    """A live daemon that no longer accepts (its listen queue full: seen when one was stuck in
    a rename through its own mount) must neither lose its socket to the start-up sweep of
    /run/hwfs nor make the next daemon's start-up hang on a blocking connect."""
    import socket
    if os.geteuid() != 0:
        pytest.skip("the shared control directory /run/hwfs is root's")
    os.makedirs("/run/hwfs", mode=0o755, exist_ok=True)
    path = f"/run/hwfs/stuck-{os.getpid()}.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    clients = []
    try:
        stuck.bind(path)
        stuck.listen(0)
        while True:  # fill its queue: the next blocking connect would wait for ever
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            clients.append(c)
            try:
                c.connect(path)
            except BlockingIOError:
                break
            if len(clients) > 64:
                pytest.fail("the listen queue never filled")
        m = mount_factory()  # the fixture's own timeout fails the test if start-up hangs
        assert m.status()["pid"] > 0
        assert os.path.exists(path), "the sweep removed a live daemon's socket"
    finally:
        for c in clients:
            c.close()
        stuck.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
