"""Processes the engine tests run beside a mount: the C engine (build/hwfs-engine)
and `hwfs watch`.

``EngineProc`` starts ``hwfs-engine -m MNT --name NAME --listen SOCK`` (the
binary next to the hwfs under test, so HWFS_BIN=build-asan/hwfs runs the ASan
engine), asks it what it serves over its socket and stops it by pid;
``start_engine`` starts one and hands it to ``procs``.  ``WatchProc`` runs
``hwfs watch ...`` with its stdout read line by line in a thread.  Both stop
the same way (``stop_proc``: a signal, then SIGKILL after a grace period).
The ``procs`` fixture (import it into a test module) stops every process a
test started, whatever happened.
"""

import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import HWFS, ask_engine, pid_alive, poll, read_text

ENGINE = os.environ.get("HWFS_ENGINE_BIN") or str(Path(HWFS).resolve().parent / "hwfs-engine")
STOP_GRACE = 10  # seconds a SIGTERMed process gets before SIGKILL


def stop_proc(proc, sigs):
    """Send @sigs to Popen @proc unless it has exited, give it STOP_GRACE seconds,
    then SIGKILL it.  Returns its exit status (None when it was killed or never started)."""
    if proc is None or proc.poll() is not None:
        return None if proc is None else proc.returncode
    for sig in sigs:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return None


class EngineProc:
    """One hwfs-engine process registered on mount @mnt as engine @name."""

    def __init__(self, mnt, name, workdir, load_delay_ms=None):
        self.mnt = mnt
        self.name = name
        self.sock = os.path.join(workdir, f"{name}.sock")
        self.logpath = os.path.join(workdir, f"{name}.log")
        self.load_delay_ms = load_delay_ms
        self.proc = None

    def start(self):
        args = [ENGINE, "-m", self.mnt, "--name", self.name, "--listen", self.sock]
        if self.load_delay_ms is not None:
            args += ["--load-delay-ms", str(self.load_delay_ms)]
        with open(self.logpath, "ab") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)
        ok = poll(lambda: "registered on" in self.log() or self.proc.poll() is not None, timeout=15)
        if not ok or self.proc.poll() is not None:
            pytest.fail(f"hwfs-engine {self.name} did not register (exit {self.proc.poll()}):\n{self.log()}",
                        pytrace=False)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        return read_text(self.logpath)

    def ask(self, timeout=5.0):
        """One request: the engine's answer (a dict), or None when it does not answer."""
        return ask_engine(self.sock, timeout)

    def wait_serving(self, version, timeout=20.0):
        """Poll until the engine answers @version; returns that answer."""
        last = [None]

        def serving():
            last[0] = self.ask()
            return last[0] if last[0] and last[0]["version"] == version else None

        ans = poll(serving, timeout=timeout, interval=0.05)
        assert ans, (f"engine {self.name} does not serve {version} after {timeout}s; it answers "
                     f"{last[0]}\nits log:\n{self.log()}")
        return ans

    def wait_log(self, text, timeout=20.0):
        assert poll(lambda: text in self.log(), timeout=timeout), \
            f"engine {self.name} did not log {text!r} within {timeout}s:\n{self.log()}"

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def kill9(self):
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        """SIGTERM (SIGCONT first: it may be stopped), SIGKILL after STOP_GRACE; returns the exit status."""
        return stop_proc(self.proc, (signal.SIGCONT, signal.SIGTERM))


class WatchProc:
    """`hwfs watch ARGS -m MNT`, its stdout read line by line."""

    def __init__(self, mnt, *args, env=None):
        self.args = [HWFS, "watch", *[str(a) for a in args], "-m", mnt]
        self.env = env
        self.lines = []
        self.stderr = ""
        self._q = queue.Queue()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=self.env,
                                     start_new_session=True)

        def reader(p=self.proc, q=self._q):
            for line in p.stdout:
                q.put(line.rstrip("\n"))

        def err_reader(p=self.proc):
            for line in p.stderr:
                self.stderr += line

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=err_reader, daemon=True).start()
        return self

    def wait_line(self, line, timeout=20.0, prefix=False):
        """Until stdout printed exactly @line (with @prefix: a line starting with
        it); returns every line so far."""
        end = time.monotonic() + timeout
        while not any(ln == line or (prefix and ln.startswith(line)) for ln in self.lines):
            left = end - time.monotonic()
            if left <= 0:
                pytest.fail(f"`{' '.join(self.args)}` did not print {line!r} within {timeout}s; "
                            f"it printed {self.lines}\nstderr: {self.stderr}", pytrace=False)
            try:
                self.lines.append(self._q.get(timeout=min(left, 0.2)))
            except queue.Empty:
                pass
        return self.lines

    def wait_exit(self, timeout=20.0):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(self.args)}` still runs after {timeout}s; printed {self.lines}",
                        pytrace=False)

    def stop(self):
        """SIGTERM, SIGKILL after STOP_GRACE; returns the exit status."""
        return stop_proc(self.proc, (signal.SIGTERM,))


def start_engine(procs, mnt, name, workdir, **kw):
    """An EngineProc on mount @mnt as engine @name, appended to @procs (the
    fixture) before it starts, then started (registered); returns it."""
    e = EngineProc(mnt, name, str(workdir), **kw)
    procs.append(e)
    return e.start()


@pytest.fixture
def procs():
    """A list a test appends its EngineProc/WatchProc objects to; all stopped at teardown."""
    started = []
    try:
        yield started
    finally:
        for p in reversed(started):
            try:
                p.stop()
            except Exception:
                pass


def engine_state(mount, name):
    """The `engines` record of engine @name in @mount's status, or None."""
    for e in mount.status().get("engines", []):
        if e["name"] == name:
            return e
    return None


def wait_gone(pid, timeout=10.0):
    assert poll(lambda: not pid_alive(pid), timeout=timeout), f"process {pid} still alive"
