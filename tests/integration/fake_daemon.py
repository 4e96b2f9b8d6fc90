"""A fake hwfs daemon: a directory whose root xattr user.hwfs.control names a
unix socket that a test answers itself, to see what libhwfs (and the tools
and the Python package on it) do with answers no real daemon gives: a map
answer that lies about the arena, events with names that are paths, a daemon
that never reads an engine's reports.  ``fake_daemon(answer)`` (a fixture:
import it) starts one and closes it at teardown.
"""

import json
import os
import shutil
import socket
import tempfile
import threading

import pytest


class FakeDaemon:
    """A directory whose xattr user.hwfs.control names a unix socket served
    here by @answer(conn, request) for each connection, in a thread: what a
    hostile or broken daemon can say to libhwfs.  close() ends it."""

    def __init__(self, answer):
        self.top = tempfile.mkdtemp(prefix="hwfs-fake-")  # short: a socket path has 108 bytes
        self.dir = os.path.join(self.top, "mnt")
        os.mkdir(self.dir)
        self.sock_path = os.path.join(self.top, "ctl.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.sock_path)
        self.srv.listen(8)
        self.answer = answer
        self.conns = []
        self.done = threading.Event()
        try:
            os.setxattr(self.dir, "user.hwfs.control", self.sock_path.encode())
        except OSError as e:
            self.close()
            pytest.skip(f"no user xattrs in {self.top}: {e}")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.done.is_set():
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        buf = b""
        try:
            while not buf.endswith(b"\n"):
                data = c.recv(4096)
                if not data:
                    return
                buf += data
            self.answer(c, json.loads(buf))
            self.done.wait(60)  # the connection stays open (a lease, a watch)
        except OSError:
            pass

    def close(self):
        self.done.set()
        self.srv.close()
        for c in self.conns:
            c.close()
        shutil.rmtree(self.top, ignore_errors=True)


@pytest.fixture
def fake_daemon():
    """fake_daemon(answer): a started FakeDaemon, closed at teardown."""
    made = []

    def make(answer):
        made.append(FakeDaemon(answer))
        return made[-1]

    yield make
    for f in made:
        f.close()
