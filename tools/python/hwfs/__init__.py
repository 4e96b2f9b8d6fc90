"""hwfs — the Python binding of libhwfs (include/hwfs.h).

    import hwfs
    with hwfs.open("/hotweights") as m:          # None: $HWFS_MOUNT, else /hotweights
        print(m.current(), m.versions())
        with m.map("v2") as v:                    # zero-copy, read-only, holds a lease
            w = v["model.embed_tokens.weight"]    # numpy array over the daemon's arena
        for ev in m.watch():                      # arrived / current / removed events
            print(ev.type, ev.version)

    # DLPack: numpy / torch / cupy take a tensor without a copy (docs/gpu.md, "DLPack")
    with m.map("v2") as v:
        t = torch.from_dlpack(v.dlpack("model.embed_tokens.weight"))
    m.load("v2", gpu=0)                           # shadow-load into device 0 (docs/gpu.md)
    with m.map("v2", gpu=0) as dv:                # CUDA IPC: device tensors, through DLPack only
        t = torch.from_dlpack(dv.dlpack("model.embed_tokens.weight"))

Every call goes through libhwfs (ctypes); the package never speaks the control
protocol itself.  Errors are OSError subclasses carrying the errno libhwfs
returned and its one-line sentence (FileNotFoundError for a missing version,
PermissionError, ...).

Lifetime of a mapping (the decision): an array handed out by a Mapping keeps
the mapping alive (the array's base refers to the object that owns the
hwfs_map), so an array can never outlive the pages it reads.  Mapping.close()
(or leaving its `with` block) drops the Mapping's own hold and refuses new
lookups; the pages and the lease end (hwfs_unmap) when the last array made
from it is garbage — at once when there is none.  `Mapping.unmapped` says
whether that happened.  To release a version's bytes for sure, drop every
array (and every torch tensor made by hwfs.torch) taken from it.

BF16 (and FP8) tensors come as ml_dtypes.bfloat16 (float8_*) arrays when
ml_dtypes is importable, else as uint16 (uint8) arrays of the same shape
holding the raw bits.  A dtype numpy cannot express at all comes as its raw
bytes: a 1-D uint8 array.

DLPack (Mapping.dlpack): the tensor itself, device and dtype included, for
any DLPack consumer; the array it becomes holds a reference on the C mapping
(the DLPack deleter drops it), so it too keeps the pages and the lease.
Consumers that ask for DLPack 1.0 (numpy >= 2.1, recent torch) get the
read-only flag; numpy then makes a read-only array, torch ignores the flag
(its tensors have no read-only state) — writing through such a tensor faults.
"""

import contextlib
import ctypes
import errno
import json
import os
import socket
import threading
import weakref
from collections import namedtuple

import numpy as np

from . import _dlpack, _lib
from ._lib import HWFS_API_VERSION  # noqa: F401  (re-exported)

# hwfs.open is left out of __all__: `from hwfs import *` must not shadow the builtin open.
__all__ = ["Mount", "Mapping", "Watch", "Event", "VersionInfo", "TensorInfo", "DLPackTensor",
           "numpy_dtype", "StreamClosed"]

# How long one wait inside Watch.next() lasts before it looks again at whether
# close() was asked for (so close() from another thread never waits longer).
WAIT_SLICE_MS = 200

VersionInfo = namedtuple("VersionInfo", "name state bytes current")
VersionInfo.__doc__ = "One version as the daemon lists it (current: True when `current` names it)."

TensorInfo = namedtuple("TensorInfo", "name file dtype shape nbytes hash copied")
TensorInfo.__doc__ = ("One tensor of a mapped version: safetensors dtype string, shape tuple, "
                      "bytes, XXH3-128 hash (32 hex digits), copied (True when libhwfs could "
                      "not map its bytes in place).")


class StreamClosed(EOFError):
    """The daemon closed the event stream (unmounted, stopped, or dropped this client)."""


def _cstr(value, what):
    """@value as the NUL-terminated bytes libhwfs takes: bytes as they are,
    anything else as str(value) in UTF-8.  Every name, path, reason and
    request handed to libhwfs goes through here: C reads a string up to its
    first NUL, so 'v1\\x00x' would be taken for 'v1'.  Raises ValueError
    (naming @what) when @value holds a NUL."""
    b = value if isinstance(value, bytes) else str(value).encode()
    if b"\0" in b:
        raise ValueError(f"{what} {value!r} holds a NUL character")
    return b


# ------------------------------------------------------------------ dtypes

def _ml_dtype(name, fallback):
    try:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError):
        return np.dtype(fallback)


_NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"),
}
_LAZY_DTYPES = {"BF16": ("bfloat16", np.uint16), "F8_E4M3": ("float8_e4m3fn", np.uint8),
                "F8_E5M2": ("float8_e5m2", np.uint8)}


def numpy_dtype(st_dtype):
    """The numpy dtype for safetensors dtype @st_dtype, or None when numpy has none.

    BF16/F8_*: ml_dtypes' type when importable, else the unsigned integer of
    the same width (the raw bits)."""
    if st_dtype in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[st_dtype]
    if st_dtype in _LAZY_DTYPES:
        name, fallback = _LAZY_DTYPES[st_dtype]
        dt = _ml_dtype(name, fallback)
        _NUMPY_DTYPES[st_dtype] = dt
        return dt
    return None


# ------------------------------------------------------------------ the mount

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
        arg = None if mount is None else _cstr(mount, "mount path")
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
        request = _cstr(request, "request")
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
        _lib.check(_lib.hwfs_load(self._handle(), _cstr(version, "version name"), int(gpu), cb, None),
                   f"load {version} on GPU {gpu}")

    def unload(self, version, gpu=None):
        """Drop the device copy of @version on device @gpu (None: on every
        device).  The memory is freed once no process maps it any more.
        Raises FileNotFoundError (not loaded), PermissionError."""
        g = -1 if gpu is None else int(gpu)
        _lib.check(_lib.hwfs_unload(self._handle(), _cstr(version, "version name"), g),
                   f"unload {version}" + ("" if gpu is None else f" from GPU {gpu}"))

    def watch(self, engine=None, gpu=None):
        """Watch events (a Watch; iterate it).  With @engine, also register
        this process as that engine on the node (see docs/engines.md).  With
        @gpu too, the engine's readiness is the node's own load of a prepared
        version on that device (hwfs_watch_open_gpu, docs/gpu.md)."""
        return Watch(self, engine, gpu)


# ------------------------------------------------------------------ mappings

class _MapHandle:
    """Owns one hwfs_map: unmaps it when the last reference goes.

    Every buffer handed out refers to it, and so does the Mapping until it is
    closed; that is the whole lifetime rule."""

    __slots__ = ("ptr", "__weakref__")
    _unmap = staticmethod(_lib.hwfs_unmap)  # kept for interpreter shutdown

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        p, self.ptr = self.ptr, None
        if p:
            self._unmap(p)


class Mapping:
    """A sealed version mapped read-only into this process (holds a lease:
    `hwfs rm` and gc never free bytes a live mapping uses).

    Dict-like, by tensor name: m["w"] is a read-only numpy array over the
    daemon's arena (no copy).  "FILE:NAME" picks a tensor from one file when
    several files of the version hold the same name; a bare name is the first.
    m.dlpack("w") is the same tensor for any DLPack consumer.

    A device mapping (Mount.map(version, gpu=N)) has .device: the daemon's
    device N as this process numbers it (the same physical GPU, found by its
    PCI id; it differs from N when CUDA_VISIBLE_DEVICES does).  Its tensors are
    device memory, so only dlpack() (and info, address) work on it; array()
    and buffer() raise TypeError.  They are writable and shared with every
    other process mapping the version: copy before modifying.
    """

    def __init__(self, mount, version, gpu=None):
        p = ctypes.c_void_p()
        name = _cstr(version, "version name")
        if gpu is None:
            _lib.check(_lib.hwfs_map(mount._handle(), name, ctypes.byref(p)), f"map {version}")
        else:
            _lib.check(_lib.hwfs_map_gpu(mount._handle(), name, int(gpu), ctypes.byref(p)),
                       f"map {version} on GPU {gpu}")
        self._owner = _MapHandle(p)
        self._ref = weakref.ref(self._owner)
        self.device = _lib.hwfs_map_device(p)  # -1: host memory
        self.version = _lib.hwfs_map_version(p).decode()
        self.digest = _lib.hwfs_map_digest(p).decode()
        self._info = []   # TensorInfo, in file then offset order
        self._where = []  # (data address, len) per tensor
        self._index = {}  # name and FILE:NAME -> position
        for i in range(_lib.hwfs_map_count(p)):
            t = _lib.hwfs_map_tensor(p, i).contents
            name, file = t.name.decode(), t.file.decode()
            shape = tuple(int(t.shape[k]) for k in range(t.ndim))
            self._info.append(TensorInfo(name, file, t.dtype.decode(), shape, int(t.len),
                                         bytes(t.hash).hex(), bool(t.copied)))
            self._where.append((t.data or 0, int(t.len)))
            self._index.setdefault(name, i)
            self._index[f"{file}:{name}"] = i
        self._names = list(dict.fromkeys(ti.name for ti in self._info))
        self._arrays = {}

    # -- lifetime
    def close(self):
        """Drop this Mapping's hold (idempotent).  The pages and the lease
        end when no array or tensor made from it is alive any more."""
        self._arrays = {}
        self._owner = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return self._owner is None

    @property
    def unmapped(self):
        """True once hwfs_unmap ran (no holder is left)."""
        owner = self._ref()
        return owner is None or owner.ptr is None

    def __repr__(self):
        return (f"<hwfs.Mapping {self.version} ({len(self._names)} tensors)"
                f"{' closed' if self.closed else ''}>")

    # -- lookups
    def _pos(self, key):
        try:
            return self._index[key]
        except KeyError:
            raise KeyError(f"version {self.version} has no tensor {key!r}") from None

    def tensors(self):
        """TensorInfo of every tensor, in file then offset order."""
        return list(self._info)

    def info(self, key):
        """TensorInfo of tensor @key."""
        return self._info[self._pos(key)]

    def buffer(self, key):
        """The bytes of tensor @key: a read-only memoryview over the mapping
        that keeps the mapping alive as long as it (or anything made from it,
        such as torch.frombuffer's tensors) lives."""
        if self._owner is None:
            raise ValueError(f"mapping of {self.version} is closed")
        if self.device >= 0:
            raise TypeError(f"tensor {key!r} of {self.version} is in the memory of GPU "
                            f"{self.device}: take it with dlpack() (e.g. torch.from_dlpack)")
        addr, n = self._where[self._pos(key)]
        if n == 0:
            return memoryview(b"")
        buf = (ctypes.c_char * n).from_address(addr)
        buf.hwfs_owner = self._owner  # the base chain: view -> buf -> owner
        return memoryview(buf).toreadonly()

    def address(self, key):
        """The address of tensor @key's first byte in this process (a device
        pointer for a device mapping)."""
        return self._where[self._pos(key)][0]

    def dlpack(self, key):
        """Tensor @key as a DLPackTensor: pass it to numpy.from_dlpack,
        torch.from_dlpack, cupy.from_dlpack...; no byte is copied.  What they
        make holds the mapping (and its lease) until it is garbage, even
        after close()."""
        if self._owner is None:
            raise ValueError(f"mapping of {self.version} is closed")
        pos = self._pos(key)
        return DLPackTensor(self._owner, pos, self.device, self._info[pos])

    def array(self, key):
        """Tensor @key as a read-only numpy array sharing the mapping's memory."""
        pos = self._pos(key)
        if self.device >= 0:
            self.buffer(key)  # raises TypeError
        a = self._arrays.get(pos)
        if a is not None:
            return a
        ti = self._info[pos]
        dt = numpy_dtype(ti.dtype)
        mv = self.buffer(key)
        if dt is None:
            a = np.frombuffer(mv, dtype=np.uint8)
        else:
            count = int(np.prod(ti.shape, dtype=np.int64))
            if count * dt.itemsize != ti.nbytes:
                raise ValueError(f"tensor {ti.name}: {ti.nbytes} bytes do not hold "
                                 f"{ti.dtype} {list(ti.shape)}")
            a = np.frombuffer(mv, dtype=dt).reshape(ti.shape)
        a.flags.writeable = False
        self._arrays[pos] = a
        return a

    __getitem__ = array

    def __contains__(self, key):
        return key in self._index

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def keys(self):
        return list(self._names)

    def values(self):
        return [self[k] for k in self._names]

    def items(self):
        return [(k, self[k]) for k in self._names]

    def get(self, key, default=None):
        return self[key] if key in self._index else default


class DLPackTensor:
    """One tensor of a mapping for DLPack consumers (the __dlpack__ protocol
    of the Python array API).  Each __dlpack__() call makes a new DLPack
    tensor with its own reference on the mapping; the object itself holds
    the mapping only until it is dropped.

    max_version >= (1, 0) (numpy >= 2.1, recent torch) gets a DLPack 1.0
    tensor flagged read-only; an older consumer gets DLPack 0.6 (no flags).
    copy=True is refused (BufferError): hwfs only lends its pages; copy the
    consumer's array instead.  A dtype DLPack cannot express (F8_*) raises
    BufferError too, naming it."""

    __slots__ = ("_owner", "_pos", "_device", "info", "_caps")

    def __init__(self, owner, pos, device, info):
        self._owner, self._pos, self._device, self.info = owner, pos, device, info
        self._caps = []  # every capsule made, held until __del__ (see _dlpack.py)

    def __del__(self):
        caps = getattr(self, "_caps", None)
        if caps:
            _dlpack.release(caps)

    def __dlpack_device__(self):
        if self._device >= 0:
            return (_dlpack.KDL_CUDA, self._device)
        return (_dlpack.KDL_CPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError(f"tensor {self.info.name}: hwfs lends its mapped bytes without "
                              f"a copy (copy=True is not supported; copy the result)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"tensor {self.info.name} is on device "
                              f"{self.__dlpack_device__()}, not {tuple(dl_device)}")
        if self._owner.ptr is None:
            raise ValueError("the mapping is gone")
        # stream: the device copy is complete before hwfs_load returns, so
        # there is nothing for the consumer's stream to wait for.
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        try:
            cap = _dlpack.capsule(self._owner.ptr, self._pos, versioned)
        except OSError as e:
            if e.errno == errno.ENOTSUP:
                raise BufferError(e.strerror) from e
            raise
        if len(self._caps) > 8:  # called again and again: let go of those already used
            _dlpack.release(self._caps)
        self._caps.append(cap)
        return cap

    def __repr__(self):
        ti = self.info
        where = "cpu" if self._device < 0 else f"cuda:{self._device}"
        return f"<hwfs.DLPackTensor {ti.name} {ti.dtype} {list(ti.shape)} on {where}>"


# ------------------------------------------------------------------ events

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
        name = _cstr(engine, "engine name") if engine else None
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
                rc = fn(w, _cstr(version, "version name"), int(pause_us),
                        int(drain_us if drain_us is not None else 0),
                        int(swap_us if swap_us is not None else 0))
            else:
                rc = _lib.hwfs_engine_report(w, _lib.REPORTS[what],
                                             _cstr(version, "version name"),
                                             _cstr(reason, "reason") if reason else None,
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
