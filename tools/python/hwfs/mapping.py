"""hwfs.mapping — a sealed version mapped read-only into this process.

Mapping is dict-like by tensor name and hands out numpy arrays over the
daemon's arena (no copy), their bytes (buffer), their addresses, and
DLPackTensor objects for any DLPack consumer (numpy, torch, cupy).

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
holding the raw bits (hwfs.dtypes).  A dtype numpy cannot express at all
comes as its raw bytes: a 1-D uint8 array.

DLPack (Mapping.dlpack): the tensor itself, device and dtype included, for
any DLPack consumer; the array it becomes holds a reference on the C mapping
(the DLPack deleter drops it), so it too keeps the pages and the lease.
Consumers that ask for DLPack 1.0 (numpy >= 2.1, recent torch) get the
read-only flag; numpy then makes a read-only array, torch ignores the flag
(its tensors have no read-only state) — writing through such a tensor faults.
"""

import ctypes
import errno
import weakref
from collections import namedtuple

import numpy as np

from . import _dlpack, _lib
from .dtypes import numpy_dtype

TensorInfo = namedtuple("TensorInfo", "name file dtype shape nbytes hash copied")
TensorInfo.__doc__ = ("One tensor of a mapped version: safetensors dtype string, shape tuple, "
                      "bytes, XXH3-128 hash (32 hex digits), copied (True when libhwfs could "
                      "not map its bytes in place).")


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
        name = _lib.cstr(version, "version name")
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
