"""hwfs.mount — a handle on one mount's daemon: hwfs.open() and Mount.

A Mount lists versions (VersionInfo), names `current`, sends raw control
requests, shadow-loads versions into GPU memory, and is where mappings
(hwfs.mapping) and watches (hwfs.watch) are made.  Every call goes through
libhwfs (hwfs._lib); nothing stays connected between calls.
"""

import ctypes
import errno
import json
from collections import namedtuple

from . import _lib
from .mapping import Mapping
from .watch import Watch

VersionInfo = namedtuple("VersionInfo", "name state bytes current")
VersionInfo.__doc__ = "One version as the daemon lists it (current: True when `current` names it)."


def open(mount=None):  # noqa: A001  (hwfs.open, like the C hwfs_open)
    """Open the hwfs mount at @mount (None: $HWFS_MOUNT, else /hotweights).

    Raises OSError: ENOTSUP when @mount is not an hwfs mount, ENOENT..."""
    return Mount(mount)


class Mount:
    """A handle on one mount's daemon.  Nothing stays connected: each call
    connects anew (libhwfs), so a Mount may be shared by threads.  Maps and
    watches made from it stay valid after close()."""

    def __init__(self, mount=None):
        h = ctypes.c_void_p()
        arg = None if mount is None else _lib.cstr(mount, "mount path")
        _lib.check(_lib.hwfs_open(arg, ctypes.byref(h)), f"hwfs.open({mount!r})")
        self._h = h
        self.mountpoint = _lib.hwfs_mountpoint(h).decode()

    def _handle(self):
        if not self._h:
            raise ValueError("hwfs.Mount is closed")
        return self._h

    _hwfs_close = staticmethod(_lib.hwfs_close)  # kept for interpreter shutdown

    def close(self):
        """Free the handle (idempotent)."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._hwfs_close(h)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<hwfs.Mount {self.mountpoint!r}{'' if self._h else ' closed'}>"

    def call(self, request, progress=None):
        """The raw control request @request (a dict or a JSON line); returns the
        daemon's final answer as a dict (it may be {"ok": false, "error": ...}).
        @progress(done, total) is called for each progress line."""
        if not isinstance(request, (str, bytes)):
            request = json.dumps(request)
        request = _lib.cstr(request, "request")
        cb = _lib.PROGRESS_FN(0)
        if progress is not None:
            cb = _lib.PROGRESS_FN(lambda _arg, done, total: progress(done, total))
        reply = ctypes.c_void_p()
        _lib.check(_lib.hwfs_call(self._handle(), request, cb, None, ctypes.byref(reply)),
                   "hwfs_call")
        return json.loads(_lib.take_string(reply))

    def versions(self):
        """Every version of the node, in creation order: a list of VersionInfo."""
        arr = ctypes.POINTER(_lib.Version)()
        n = ctypes.c_size_t()
        _lib.check(_lib.hwfs_versions(self._handle(), ctypes.byref(arr), ctypes.byref(n)),
                   "hwfs_versions")
        try:
            return [VersionInfo(arr[i].name.decode(), arr[i].state.decode(), int(arr[i].bytes),
                                bool(arr[i].is_current)) for i in range(n.value)]
        finally:
            _lib.hwfs_versions_free(arr, n.value)

    def current(self):
        """The version `current` names, or None when nothing was committed yet."""
        out = ctypes.c_void_p()
        rc = _lib.hwfs_current(self._handle(), ctypes.byref(out))
        if rc == -errno.ENOENT:  # nothing committed
            return None
        _lib.check(rc, "hwfs_current")
        return _lib.take_string(out)

    def map(self, version, gpu=None, tp=None):
        """Map sealed version @version read-only and zero-copy: a Mapping.

        With @tp=(N, r), a hwfs.partition.TPMapping instead: rank r's slice of
        every tensor for tensor-parallel size N, the same as the mount's
        versions/V/tp/N/r/model.safetensors (ValueError naming the tensor when
        N does not divide it).

        With @gpu (a device index), map the copy hwfs_load() made on that
        device instead, with CUDA IPC: its tensors are device memory, reached
        through Mapping.dlpack() only.

        Raises FileNotFoundError (no such version, or not loaded on @gpu),
        OSError EBUSY (not sealed), EIO (damaged), ENODEV (no CUDA runtime or
        device in this process), PermissionError (not root, the mount's owner
        or the --ctl-group)."""
        if tp is not None:
            from hwfs.partition import TPMapping, read_overrides
            over = read_overrides(self.mountpoint, str(version))
            m = Mapping(self, version, gpu)
            try:
                return TPMapping(m, tp, over)
            except BaseException:
                m.close()
                raise
        return Mapping(self, version, gpu)

    def load(self, version, gpu, progress=None):
        """Shadow-load sealed version @version into the memory of CUDA device
        @gpu on this node (the daemon holds it until unload()).  Returns when
        it is resident (at once when it is already); @progress(done, total)
        is called for the daemon's progress lines.  Raises OSError ENODEV (no
        CUDA runtime or device on the node, or no device @gpu), ENOMEM (it
        does not fit in the share of free device memory hwfs may use),
        FileNotFoundError, EBUSY, EIO, PermissionError."""
        cb = _lib.PROGRESS_FN(0)
        if progress is not None:
            cb = _lib.PROGRESS_FN(lambda _arg, done, total: progress(done, total))
        _lib.check(_lib.hwfs_load(self._handle(), _lib.cstr(version, "version name"), int(gpu), cb, None),
                   f"load {version} on GPU {gpu}")

    def unload(self, version, gpu=None):
        """Drop the device copy of @version on device @gpu (None: on every
        device).  The memory is freed once no process maps it any more.
        Raises FileNotFoundError (not loaded), PermissionError."""
        g = -1 if gpu is None else int(gpu)
        _lib.check(_lib.hwfs_unload(self._handle(), _lib.cstr(version, "version name"), g),
                   f"unload {version}" + ("" if gpu is None else f" from GPU {gpu}"))

    def watch(self, engine=None, gpu=None):
        """Watch events (a Watch; iterate it).  With @engine, also register
        this process as that engine on the node (see docs/engines.md).  With
        @gpu too, the engine's readiness is the node's own load of a prepared
        version on that device (hwfs_watch_open_gpu, docs/gpu.md)."""
        return Watch(self, engine, gpu)
