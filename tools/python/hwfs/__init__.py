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

This file only gathers the package's names; each module has one job:

  mount.py      hwfs.open(), Mount, VersionInfo: a handle on one mount's daemon
  mapping.py    Mapping, TensorInfo, DLPackTensor: a version mapped zero-copy
                (and the lifetime rule of its arrays)
  watch.py      Watch, Event, StreamClosed: the event stream, engine reports
  dtypes.py     safetensors dtypes in numpy and torch (numpy_dtype, ...)
  partition.py  tensor-parallel slices (Mount.map(V, tp=(N, r)))
  _lib.py       the ctypes declarations of libhwfs, and finding the library
  _dlpack.py    DLPack capsules over a mapping
  torch.py, trainers.py, vllm*.py, trl.py, verl.py, _vllm_cli.py
                PyTorch, trainers and the engines that use hwfs (imported
                on their own: `import hwfs.torch`)
"""

from . import _dlpack, _lib  # noqa: F401  (hwfs._lib, hwfs._dlpack)
from ._lib import HWFS_API_VERSION  # noqa: F401  (re-exported)
from ._lib import cstr as _cstr  # noqa: F401  (hwfs._cstr: the name it had here)
from .dtypes import numpy_dtype
from .mapping import DLPackTensor, Mapping, TensorInfo
from .mount import Mount, VersionInfo, open  # noqa: A004  (hwfs.open, like the C hwfs_open)
from .watch import WAIT_SLICE_MS, Event, StreamClosed, Watch  # noqa: F401

# hwfs.open is left out of __all__: `from hwfs import *` must not shadow the builtin open.
__all__ = ["Mount", "Mapping", "Watch", "Event", "VersionInfo", "TensorInfo", "DLPackTensor",
           "numpy_dtype", "StreamClosed"]
