"""A small client of the engine control protocol (docs/engines.md), in plain Python.

The tests speak the protocol directly (AF_UNIX, JSON lines, SCM_RIGHTS with
socket.recv_fds, mmap of the passed arena), so they test the daemon and nothing
else.  The socket path is the mount root's xattr `user.hwfs.control`.
"""

import json
import mmap
import os
import select
import socket
import subprocess
import time

import numpy as np


def ctl_path(mnt):
    return os.getxattr(mnt, "user.hwfs.control").decode()


class Conn:
    """One control connection: send @req, then read lines (and passed descriptors)."""

    def __init__(self, mnt, req):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(ctl_path(mnt))
        self.buf = b""
        self.fds = []
        self.eof = False
        if req is not None:
            self.send(req)

    def send(self, obj):
        data = obj if isinstance(obj, bytes) else (json.dumps(obj) + "\n").encode()
        self.s.sendall(data)

    def line(self, timeout=10.0):
        """The next JSON line (a dict), or None at EOF; fails after @timeout seconds."""
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line within {timeout}s (have {self.buf[:200]!r})")
            r, _, _ = select.select([self.s], [], [], left)
            if not r:
                continue
            try:
                data, fds, _, _ = socket.recv_fds(self.s, 1 << 20, 4)
            except ConnectionResetError:
                data, fds = b"", []
            self.fds += fds
            if not data:
                self.eof = True
                return None
            self.buf += data
        ln, self.buf = self.buf.split(b"\n", 1)
        return json.loads(ln)

    def event(self, timeout=10.0, skip=()):
        """The next line whose "event" is not in @skip."""
        while True:
            ev = self.line(timeout)
            if ev is None or ev.get("event") not in skip:
                return ev

    def wait_eof(self, timeout=10.0):
        """Read (and drop) lines until EOF; True when EOF came within @timeout."""
        end = time.monotonic() + timeout
        try:
            while self.line(max(end - time.monotonic(), 0.001)) is not None:
                pass
        except TimeoutError:
            return False
        return True

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def call(mnt, req, timeout=30.0):
    """A one-shot request: its answer."""
    with Conn(mnt, req) as c:
        return c.line(timeout)


class Mapping:
    """`map` of a version: the reply, the arena mapped read-only, the lease held until close()."""

    def __init__(self, mnt, version):
        self.conn = Conn(mnt, {"op": "map", "version": version})
        self.reply = self.conn.line()
        self.mm = None
        if not self.reply or not self.reply.get("ok"):
            return
        assert len(self.conn.fds) == 1, f"map passed {len(self.conn.fds)} descriptors"
        fd = self.conn.fds[0]
        assert os.fstat(fd).st_size == self.reply["arena_size"]
        self.mm = mmap.mmap(fd, self.reply["arena_size"], mmap.MAP_SHARED, mmap.PROT_READ)

    @property
    def ok(self):
        return bool(self.reply and self.reply.get("ok"))

    def file(self, path):
        return next(f for f in self.reply["files"] if f["path"] == path)

    def read(self, path, off, length):
        """Bytes [off, off+length) of file @path, gathered from the arena through its extents."""
        out = bytearray()
        for foff, flen, aoff in self.file(path)["extents"]:
            lo, hi = max(off, foff), min(off + length, foff + flen)
            if lo < hi:
                out += self.mm[aoff + lo - foff:aoff + hi - foff]
        assert len(out) == length, f"extents of {path} do not cover [{off}, {off + length})"
        return bytes(out)

    def tensor(self, path, name):
        t = next(t for t in self.file(path)["tensors"] if t["name"] == name)
        return t, self.read(path, t["off"], t["len"])

    def close(self):
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tensor_bytes_of(arr):
    return np.ascontiguousarray(arr).tobytes()


# ---------------------------------------------------------------- engines and commits


def engine(m, name):
    """A registered engine connection on mount @m (its first reply checked)."""
    c = Conn(m.mnt, {"op": "engine", "name": name})
    first = c.line()
    assert first and first.get("ok"), f"engine {name} registration: {first}"
    return c


def commit_async(m, version, *extra):
    """`hwfs commit VERSION` in the background: a Popen (the barrier blocks it)."""
    from conftest import HWFS

    return subprocess.Popen([HWFS, "commit", version, *extra, "-m", m.mnt], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p, timeout=None):
    """Wait for commit_async()'s process: (exit status, stdout + stderr)."""
    from conftest import TIMEOUT

    out, err = p.communicate(timeout=timeout or TIMEOUT)
    return p.returncode, out + err


def engines_of(m):
    """The engines of mount @m's `hwfs status --json`, by name."""
    return {e["name"]: e for e in m.status()["engines"]}
