"""Device shadow-load without a GPU (docs/gpu.md, "Device shadow-load").

This machine (and CI) has no usable GPU: either no CUDA runtime at all or a
runtime without a driver or device.  Both are "no GPU": `hwfs load` must fail
with one clear line naming the reason, the control operations answer with an
errno, an engine registered with a GPU makes a commit abort with that reason,
and hostile requests get clear errors while the daemon stays up.  The copy
itself is tested on a GPU machine (`make test-gpu`).
"""

import json
import os
import subprocess

from conftest import make_tensors, poll, readlink_or_none, save_model
from engine_proto import Conn, call
from test_damage import damage_version
from test_security_local import as_user, shared_src  # noqa: F401 (a fixture)


def publish(m, root, version, seed):
    d = os.path.join(root, f"{version}-{seed}")
    save_model(os.path.join(d, "model.safetensors"), make_tensors(seed, n=3))
    for p in (d, os.path.join(d, "model.safetensors")):
        os.chmod(p, 0o755)
    m.run("publish", d, version)


def no_gpu_reason(m):
    """The daemon's reason for having no GPU (status gpu_note, else the log)."""
    st = m.status()
    assert st.get("gpu") is None, f"this test expects no GPU, status says {st.get('gpu')}"
    return st.get("gpu_note")


def error_lines(cp):
    return [ln for ln in cp.stderr.splitlines() if ln.strip()]


def test_load_without_gpu_is_one_clear_line(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=1)
    cp = m.run("load", "v1", "--gpu", "0", check=False)
    assert cp.returncode != 0, cp.stdout
    lines = error_lines(cp)
    assert len(lines) == 1, f"expected one line on stderr, got {cp.stderr!r}"
    assert lines[0].startswith("hwfs: error: cannot load v1 on GPU 0: no CUDA "), lines[0]
    note = no_gpu_reason(m)
    if note:
        assert note in lines[0], (note, lines[0])
    assert cp.stdout == ""
    # --json: the same error, the same way (nothing on stdout)
    cp = m.run("load", "v1", "--gpu", "0", "--json", check=False)
    assert cp.returncode != 0 and len(error_lines(cp)) == 1, cp.stderr
    assert "cannot load v1 on GPU 0: no CUDA" in cp.stderr
    # the raw request: ENODEV
    r = call(m.mnt, {"op": "load", "version": "v1", "gpu": 0})
    assert r["ok"] is False and r["errno"] == 19, r
    assert r["error"].startswith("cannot load v1 on GPU 0: no CUDA"), r


def test_load_usage_errors(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=2)
    for args in (["load", "v1"], ["load", "v1", "--gpu", "-1"], ["load", "v1", "--gpu", "x"],
                 ["load", "v1", "--gpu", "1.5"], ["load", "v1", "--gpu", "99999999999"],
                 ["load", "v1", "--gpu", ""], ["unload", "v1", "--gpu", "abc"],
                 ["load", "--gpu", "0"]):
        cp = m.run(*args, check=False)
        assert cp.returncode == 2, (args, cp.returncode, cp.stderr)
        assert "usage: hwfs" in cp.stderr, (args, cp.stderr)
    cp = m.run("load", "v1", check=False)
    assert "needs --gpu N" in cp.stderr


def test_unload_of_a_version_not_loaded(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=3)
    cp = m.run("unload", "v1", check=False)
    assert cp.returncode == 1 and len(error_lines(cp)) == 1, cp.stderr
    assert "hwfs: error: cannot unload v1: it is not loaded on any GPU" in cp.stderr
    cp = m.run("unload", "v1", "--gpu", "3", check=False)
    assert "cannot unload v1: it is not loaded on GPU 3" in cp.stderr, cp.stderr
    r = call(m.mnt, {"op": "unload", "version": "nosuch"})
    assert r["ok"] is False and r["errno"] == 2, r


def test_gpumap_without_gpu(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=4)
    with Conn(m.mnt, {"op": "gpumap", "version": "v1", "gpu": 0}) as c:
        r = c.line()
        assert r["ok"] is False and r["errno"] == 19, r
        assert r["error"].startswith("cannot map v1 on GPU 0: no CUDA"), r
        assert c.line() is None  # answered and closed: not long-lived on an error


_RAW_REQUEST = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
sys.stdout.write(s.makefile("rb").readline().decode())
"""


def test_unprivileged_user_is_refused(mount_factory, shared_src):  # noqa: F811
    """load, unload and gpumap are refused to a user who is not root, the owner or
    in --ctl-group (before any device is looked at), the raw requests too."""
    m = mount_factory(long_store=True, umask=0)
    publish(m, shared_src, "v1", seed=5)
    for verb in (["load", "v1", "--gpu", "0"], ["unload", "v1"]):
        cp = as_user(m, *verb)
        assert cp.returncode == 1, cp
        assert "hwfs: error: permission denied: " + verb[0] in cp.stderr, cp.stderr
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    for op in ("load", "unload", "gpumap"):
        req = json.dumps({"op": op, "version": "v1", "gpu": 0})
        cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             "python3", "-c", _RAW_REQUEST, ctl, req],
                            capture_output=True, text=True, timeout=60, cwd="/")
        assert cp.returncode == 0, cp.stderr
        r = json.loads(cp.stdout)
        assert r["ok"] is False and r.get("errno") == 13, (op, r)
        assert r["error"].startswith("permission denied: " + op), (op, r)


def test_engine_with_gpu_aborts_a_local_commit(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=6)
    m.run("commit", "v1")
    publish(m, tmp_path, "v2", seed=7)
    with Conn(m.mnt, {"op": "engine", "name": "g0", "gpu": 0}) as e:
        first = e.line()
        assert first and first.get("ok"), first
        assert poll(lambda: any(x["name"] == "g0" and x.get("gpu") == 0
                                for x in m.status()["engines"]))
        cp = m.run("commit", "v2", check=False)
        assert cp.returncode == 1, cp
        assert "engine g0 refused v2: no CUDA " in cp.stderr, cp.stderr
        note = no_gpu_reason(m)
        if note:
            assert note in cp.stderr, (note, cp.stderr)
        assert readlink_or_none(m.path("current")) == "versions/v1"
    # the engine gone, the commit goes through
    assert poll(lambda: not m.status()["engines"])
    m.run("commit", "v2")
    assert readlink_or_none(m.path("current")) == "versions/v2"


def test_hostile_requests(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=8)
    bad = [
        ({"op": "load", "version": "v1", "gpu": -1}, 22, "gpu"),
        ({"op": "load", "version": "v1", "gpu": 1 << 40}, 22, "gpu"),
        ({"op": "load", "version": "v1", "gpu": "0"}, 22, "gpu"),
        ({"op": "load", "version": "v1", "gpu": 0.5}, 22, "gpu"),
        ({"op": "load", "version": "v1", "gpu": True}, 22, "gpu"),
        ({"op": "load", "version": "v1"}, 22, "gpu"),
        ({"op": "load", "gpu": 0}, 22, "missing version"),
        ({"op": "load", "version": 7, "gpu": 0}, 22, "missing version"),
        ({"op": "gpumap", "version": "v1", "gpu": -5}, 22, "gpu"),
        ({"op": "gpumap", "version": "v1"}, 22, "gpu"),
        ({"op": "unload", "version": "v1", "gpu": "all"}, 22, "gpu"),
        ({"op": "unload", "version": "v1", "gpu": -2}, 22, "gpu"),
        ({"op": "unload"}, 22, "missing version"),
        ({"op": "engine", "name": "g1", "gpu": "zero"}, 22, "gpu"),
        ({"op": "engine", "name": "g1", "gpu": -3}, 22, "gpu"),
    ]
    for req, err, words in bad:
        r = call(m.mnt, req)
        assert r["ok"] is False, (req, r)
        assert r.get("errno") == err, (req, r)
        assert words in r["error"], (req, r)
    for op in ("load", "unload", "gpumap"):
        r = call(m.mnt, {"op": op, "version": ".hwfs-staging-x", "gpu": 0})
        assert r["ok"] is False and "reserved name" in r["error"], r
    # a version that does not exist, or is open: refused for what it is (the
    # version is checked before the device; test_load_refuses_a_version_not_sealed)
    r = call(m.mnt, {"op": "load", "version": "nosuch", "gpu": 0})
    assert r["ok"] is False and r.get("errno") == 2 and "no such version" in r["error"], r
    os.mkdir(m.vpath("open1"))
    r = call(m.mnt, {"op": "load", "version": "open1", "gpu": 0})
    assert r["ok"] is False and r.get("errno") == 16 and "not sealed" in r["error"], r
    # still alive and answering
    assert m.status()["pid"] == m.pid


def test_load_refuses_a_version_not_sealed(mount_factory, tmp_path):
    """docs/security.md: `load` refuses a version that is not sealed and intact,
    with a sentence and an errno, before it looks at the device (so this holds,
    and is checked, on a machine without a GPU too): open is EBUSY, damaged EIO,
    missing ENOENT; nothing is loaded."""
    m = mount_factory(capacity="256M")
    src = tmp_path / "src"
    damage_version(m, src)  # "good" sealed, "bad" sealed with a flipped byte
    m.run("verify", "bad", check=False)
    assert m.version("bad")["state"] == "damaged"
    os.mkdir(m.vpath("open1"))
    with open(m.vpath("open1", "w.bin"), "wb") as f:
        f.write(b"x" * 4096)
    for v, err, words in (("open1", 16, "version open1 is open (not sealed): seal it first"),
                          ("bad", 5, "version bad is damaged"),
                          ("nosuch", 2, "no such version")):
        r = call(m.mnt, {"op": "load", "version": v, "gpu": 0})
        assert r["ok"] is False and r.get("errno") == err, (v, r)
        assert r["error"].startswith(f"cannot load {v} on GPU 0: {words}"), (v, r)
        cp = m.run("load", v, "--gpu", "0", check=False)
        assert cp.returncode == 1 and len(error_lines(cp)) == 1, (v, cp.stderr)
        assert f"hwfs: error: cannot load {v} on GPU 0: {words}" in cp.stderr, (v, cp.stderr)
    # a sealed, intact version gets as far as the device (here: none)
    r = call(m.mnt, {"op": "load", "version": "good", "gpu": 0})
    assert r["ok"] is False and r.get("errno") == 19 and "no CUDA" in r["error"], r
    assert m.status()["gpu"] is None
