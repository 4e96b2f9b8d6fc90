"""One error channel on the control socket: every `{"ok": false}` reply of the
daemon carries `"errno"`, a positive errno number (docs/libhwfs.md, "Errors").

The test walks every control operation with bad input over the socket, as a
client sees it, and checks each refusal's errno against the table in
docs/libhwfs.md: clients act on that number and never on the sentence.
"""

import errno as E
import json
import os
import subprocess
import sys

import pytest

from conftest import TIMEOUT, make_tensors, save_model
from engine_proto import Conn, call, ctl_path

ANY = None  # an errno that depends on the machine (no GPU here, a GPU there)


def raw(mnt, data):
    """Send @data as is (not a JSON request) on one connection: the answer."""
    with Conn(mnt, None) as c:
        c.send(data)
        return c.line(TIMEOUT)


def cases(src):
    """(label, request, errno) for a mount with v1 (committed), v2 and an open o1."""
    return [
        ("malformed request", b"not json\n", E.EBADMSG),
        ("request too long", b'{"op": "' + b"x" * (70 << 10), E.EMSGSIZE),
        ("no op", {}, E.EINVAL),
        ("unknown op", {"op": "frobnicate"}, E.EOPNOTSUPP),
        ("reserved name", {"op": "rm", "version": ".hwfs-x"}, E.EINVAL),
        ("seal: no version", {"op": "seal"}, E.EINVAL),
        ("seal: unknown", {"op": "seal", "version": "nope"}, E.ENOENT),
        ("seal: sealed", {"op": "seal", "version": "v2"}, E.EROFS),
        ("commit: no version", {"op": "commit"}, E.EINVAL),
        ("commit: unknown", {"op": "commit", "version": "nope"}, E.ENOENT),
        ("commit: open", {"op": "commit", "version": "o1"}, E.EBUSY),
        ("publish: nothing", {"op": "publish"}, E.EINVAL),
        ("publish: bad name", {"op": "publish", "src": src, "version": "a/b"}, E.EINVAL),
        ("publish: no source", {"op": "publish", "src": "/nonexistent/x", "version": "n"},
         E.ENOENT),
        ("publish: source a file", {"op": "publish", "src": "/etc/hostname", "version": "n"},
         E.ENOTDIR),
        ("publish: name taken", {"op": "publish", "src": src, "version": "v1"}, E.EEXIST),
        ("verify: no version", {"op": "verify"}, E.EINVAL),
        ("verify: unknown", {"op": "verify", "version": "nope"}, E.ENOENT),
        ("rm: no version", {"op": "rm"}, E.EINVAL),
        ("rm: unknown", {"op": "rm", "version": "nope"}, E.ENOENT),
        ("rm: current", {"op": "rm", "version": "v1"}, E.EBUSY),
        ("gc: no keep", {"op": "gc"}, E.EINVAL),
        ("gc: negative keep", {"op": "gc", "keep": -1}, E.EINVAL),
        ("diff: one version", {"op": "diff", "a": "v1"}, E.EINVAL),
        ("diff: unknown", {"op": "diff", "a": "v1", "b": "nope"}, E.ENOENT),
        ("diff --elements: one version", {"op": "diff", "a": "v1", "elements": True}, E.EINVAL),
        ("diff --elements: unknown", {"op": "diff", "a": "nope", "b": "v1", "elements": True},
         E.ENOENT),
        ("diff --elements: open", {"op": "diff", "a": "v1", "b": "o1", "elements": True},
         E.EBUSY),
        ("manifest: no version", {"op": "manifest"}, E.EINVAL),
        ("manifest: unknown", {"op": "manifest", "version": "nope"}, E.ENOENT),
        ("manifest: open", {"op": "manifest", "version": "o1"}, E.EBUSY),
        ("cluster: not joined", {"op": "cluster"}, E.ENOTCONN),
        ("map: no version", {"op": "map"}, E.EINVAL),
        ("map: unknown", {"op": "map", "version": "nope"}, E.ENOENT),
        ("map: open", {"op": "map", "version": "o1"}, E.EBUSY),
        ("engine: no name", {"op": "engine"}, E.EINVAL),
        ("engine: bad name", {"op": "engine", "name": "a b"}, E.EINVAL),
        ("engine: bad gpu", {"op": "engine", "name": "e", "gpu": "x"}, E.EINVAL),
        ("load: no version", {"op": "load", "gpu": 0}, E.EINVAL),
        ("load: bad gpu", {"op": "load", "version": "v1", "gpu": -5}, E.EINVAL),
        ("load: no device or version", {"op": "load", "version": "nope", "gpu": 0}, ANY),
        ("unload: no version", {"op": "unload"}, E.EINVAL),
        ("unload: bad gpu", {"op": "unload", "version": "v1", "gpu": "x"}, E.EINVAL),
        ("unload: not loaded", {"op": "unload", "version": "v1"}, E.ENOENT),
        ("gpumap: no version", {"op": "gpumap", "gpu": 0}, E.EINVAL),
        ("gpumap: bad gpu", {"op": "gpumap", "version": "v1"}, E.EINVAL),
        ("gpumap: not loaded", {"op": "gpumap", "version": "v1", "gpu": 0}, ANY),
    ]


@pytest.fixture
def three(mount, src):
    """v1 (committed) and v2 published, o1 open; @src a readable source tree."""
    save_model(src / "a" / "model.safetensors", make_tensors(1, n=3))
    save_model(src / "b" / "model.safetensors", make_tensors(2, n=3))
    mount.run("publish", src / "a", "v1")
    mount.run("publish", src / "b", "v2")
    mount.run("commit", "v1")
    os.mkdir(mount.vpath("o1"))
    return mount, str(src / "a")


def test_every_error_reply_carries_errno(three):
    """Each operation with bad input: the refusal carries an integer errno in
    1..4095, the one docs/libhwfs.md gives for that refusal.  All are checked
    before the test fails, so its message is the whole list of misses."""
    m, src = three
    missing = []
    for label, req, want in cases(src):
        res = raw(m.mnt, req) if isinstance(req, bytes) else call(m.mnt, req)
        assert res is not None and res.get("ok") is False, (label, res)
        en = res.get("errno")
        if not (type(en) is int and 1 <= en <= 4095) or (want is not ANY and en != want):
            missing.append(f"{label}: errno {en!r}, want {want} ({res.get('error')!r})")
    assert not missing, f"{len(missing)} refusal(s) without the right errno:\n" + \
        "\n".join(missing)


# A client running as user 65534 sends one request and prints the answer.
AS_NOBODY = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
buf = b""
while not buf.endswith(b"\n"):
    d = s.recv(65536)
    if not d:
        break
    buf += d
print(buf.decode().strip())
"""


def as_nobody(mnt, req):
    cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                         sys.executable, "-c", AS_NOBODY, ctl_path(mnt), json.dumps(req)],
                        capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_refusals_of_an_unprivileged_caller_carry_eacces(three):
    """A caller who may not run a verb, or may not read a version's files, gets EACCES."""
    m, _ = three
    assert not os.stat(m.vpath("v2", "model.safetensors")).st_mode & 0o004  # safetensors: 0600
    res = as_nobody(m.mnt, {"op": "rm", "version": "v1"})
    assert res["ok"] is False and res.get("errno") == E.EACCES, res
    st = os.stat(m.mnt)
    if not st.st_mode & 0o004:
        pytest.skip("the mount root is not readable by others here")
    res = as_nobody(m.mnt, {"op": "manifest", "version": "v2"})
    assert res["ok"] is False and "needs read access to every file" in res["error"], res
    assert res.get("errno") == E.EACCES, res

