"""hwfs.watch — a live event stream from a mount's daemon, and engine reports.

Mount.watch() makes a Watch: iterating it yields Event objects ("arrived",
"current", "prepare", "removed") until the daemon closes the stream
(StreamClosed).  With an engine name the Watch is also this process's
registration as that engine, and report() tells the node what the engine did
with a version (docs/engines.md).  close() may be called from any thread.
"""

import contextlib
import ctypes
import errno
import os
import socket
import threading

from . import _lib

# How long one wait inside Watch.next() lasts before it looks again at whether
# close() was asked for (so close() from another thread never waits longer).
WAIT_SLICE_MS = 200


class StreamClosed(EOFError):
    """The daemon closed the event stream (unmounted, stopped, or dropped this client)."""


class Event:
    """One event: .type is "arrived", "current", "prepare" or "removed"."""

    __slots__ = ("type", "version", "_watch")

    def __init__(self, type, version, watch):  # noqa: A002
        self.type, self.version, self._watch = type, version, watch

    def report(self, what, reason=None, pause_us=0):
        """Report @what ("loading", "loaded", "refused", "swapped") about this
        event's version (engine watches only)."""
        self._watch.report(what, self.version, reason, pause_us)

    def __repr__(self):
        return f"Event({self.type!r}, {self.version!r})"


_REPORT_SWAP = []


def _report_swap():
    """libhwfs's hwfs_engine_report_swap, or None when the library predates it."""
    if not _REPORT_SWAP:
        try:
            f = _lib.lib.hwfs_engine_report_swap
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64,
                          ctypes.c_uint64]
        except AttributeError:
            f = None
        _REPORT_SWAP.append(f)
    return _REPORT_SWAP[0]


class Watch:
    """A live event stream from the daemon; with an engine name, the
    registration of this process as that engine (it lasts until close()).

    Iterating yields Event objects and ends when the daemon closes the
    stream.  One thread reads; report() may be called from other threads,
    and so may close().  Every call into libhwfs holds a use of the C watch
    (a count under a condition): close() marks the watch closing (new calls
    raise ValueError), shuts its socket down so that a call waiting inside
    the library (a next() waiting for events, a report() waiting for room)
    returns at once, waits until no call is inside, and only then frees it."""

    def __init__(self, mount, engine=None, gpu=None):
        p = ctypes.c_void_p()
        cur = ctypes.c_void_p()
        what = f"engine {engine}" if engine else "watch"
        name = _lib.cstr(engine, "engine name") if engine else None
        if gpu is None:
            rc = _lib.hwfs_watch_open(mount._handle(), name, ctypes.byref(cur), ctypes.byref(p))
        else:
            what += f" on GPU {gpu}"
            rc = _lib.hwfs_watch_open_gpu(mount._handle(), name, int(gpu), ctypes.byref(cur),
                                          ctypes.byref(p))
        _lib.check(rc, what)
        self._w = p
        self.engine = engine
        self.current = _lib.take_string(cur)  # what `current` named when the watch began
        self._cv = threading.Condition()   # guards _w, _users, _closing
        self._users = 0                    # calls inside libhwfs on _w right now
        self._closing = False
        self._read_lock = threading.Lock()  # one next() at a time (one reader)

    @contextlib.contextmanager
    def _use(self):
        """A use of the C watch for one library call: `with self._use() as w:`
        (ValueError once closing); close() waits until no use is left."""
        with self._cv:
            if self._closing or not self._w:
                raise ValueError("hwfs.Watch is closed")
            self._users += 1
            w = self._w
        try:
            yield w
        finally:
            with self._cv:
                self._users -= 1
                if self._users == 0:
                    self._cv.notify_all()

    def fileno(self):
        """The socket (readable: an event may be waiting)."""
        with self._use() as w:
            return _lib.hwfs_watch_fd(w)

    def next(self, timeout=None):
        """The next Event, waiting up to @timeout seconds (None: forever);
        None on timeout, or when a signal interrupted the wait (its Python
        handler runs as this returns: a loop checks its stop flag, as on a
        timeout).  Raises StreamClosed when the daemon closed the
        stream, ValueError once the watch is closed, OSError EPROTO for a
        malformed event (libhwfs dropped it: call again)."""
        ev = _lib.Event()
        left = None if timeout is None else max(0, int(timeout * 1000))
        while True:
            slice_ms = WAIT_SLICE_MS if left is None else min(WAIT_SLICE_MS, left)
            with self._read_lock, self._use() as w:
                rc = _lib.hwfs_watch_next(w, slice_ms, ctypes.byref(ev))
            if rc == 0:
                name = _lib.EVENT_NAMES.get(ev.type, str(ev.type))
                return Event(name, ev.version.decode(), self)
            if self._closing:  # close() shut the socket down under this wait
                raise ValueError("hwfs.Watch is closed")
            if rc == -errno.EPIPE:
                raise StreamClosed("the daemon closed the event stream")
            if rc == -errno.EINTR:
                return None
            if rc != -errno.ETIMEDOUT:
                _lib.check(rc, "hwfs_watch_next")  # the sentence is this thread's
            if left is not None:
                left -= slice_ms
                if left <= 0:
                    return None

    def __iter__(self):
        while True:
            try:
                yield self.next()
            except (StreamClosed, ValueError):
                return

    def report(self, what, version, reason=None, pause_us=0, drain_us=None, swap_us=None):
        """Tell the node about @version: @what is "loading", "loaded",
        "refused" (with @reason) or "swapped" (with @pause_us, and optionally
        its split: @drain_us waiting for the requests in flight, @swap_us the
        swap itself; `hwfs status` shows them).  ValueError once the watch is
        closed (or while close() runs)."""
        if what not in _lib.REPORTS:
            raise ValueError(f"report must be one of {sorted(_lib.REPORTS)}, not {what!r}")
        split = what == "swapped" and (drain_us is not None or swap_us is not None)
        fn = _report_swap() if split else None
        with self._use() as w:
            if fn is not None:
                rc = fn(w, _lib.cstr(version, "version name"), int(pause_us),
                        int(drain_us if drain_us is not None else 0),
                        int(swap_us if swap_us is not None else 0))
            else:
                rc = _lib.hwfs_engine_report(w, _lib.REPORTS[what],
                                             _lib.cstr(version, "version name"),
                                             _lib.cstr(reason, "reason") if reason else None,
                                             int(pause_us))
        if rc < 0 and self._closing:
            raise ValueError("hwfs.Watch is closed")
        _lib.check(rc, f"report {what} {version}")

    def close(self):
        """Stop watching and unregister the engine (idempotent; any thread).
        Returns once the C watch is freed: a call of another thread inside
        libhwfs is woken (it raises ValueError) and waited for first."""
        with self._cv:
            if self._closing:  # closed, or another thread closes it: wait for that
                self._cv.wait_for(lambda: self._w is None)
                return
            self._closing = True
            w = self._w
            if not w:
                return
            fd = _lib.hwfs_watch_fd(w)  # ours to read: nothing frees w but us
        try:  # wake a call blocked on the socket (the descriptor stays until the free)
            with socket.socket(fileno=os.dup(fd)) as s:
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the daemon is gone already: nothing waits on it
        with self._cv:
            self._cv.wait_for(lambda: self._users == 0)
            self._w = None
            self._cv.notify_all()
        _lib.hwfs_watch_close(w)

    _hwfs_watch_close = staticmethod(_lib.hwfs_watch_close)  # kept for interpreter shutdown

    def __del__(self):
        # no call can be inside the library: each holds a reference to self
        w = getattr(self, "_w", None)
        if w:
            self._w = None
            self._hwfs_watch_close(w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
