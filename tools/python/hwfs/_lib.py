"""ctypes declarations of libhwfs (include/hwfs.h) and how the library is found.

Nothing here speaks the control protocol: every call goes through libhwfs.

The library is looked for, in this order:
  1. the environment's HWFS_LIBRARY (a full path to libhwfs.so.1);
  2. the library bundled in the package, hwfs/libhwfs.so.1 (`pip install
     tools/python` and the wheel build it from the repository's C sources);
  3. LIBDIR of hwfs/_libdir.py (written by `make install`; may be absent);
  4. the build tree this package sits in (<repo>/build/libhwfs.so.1, for a
     package used straight from tools/python of a built checkout);
  5. ctypes.util.find_library("hwfs") (the system's library path).
The first candidate that exists is loaded; if loading it fails, or none
exists, importing hwfs raises ImportError saying what was tried.  A set
HWFS_LIBRARY is the only candidate: when it cannot be loaded, that is the
error (no other copy is picked up silently).
"""

import ctypes
import ctypes.util
import os

HWFS_API_VERSION = 1
LIBNAME = "libhwfs.so.1"

# enum hwfs_event_type
EV_ARRIVED = 1
EV_CURRENT = 2
EV_PREPARE = 3
EV_REMOVED = 4
EVENT_NAMES = {EV_ARRIVED: "arrived", EV_CURRENT: "current", EV_PREPARE: "prepare",
               EV_REMOVED: "removed"}

# enum hwfs_report
REPORTS = {"loading": 1, "loaded": 2, "refused": 3, "swapped": 4}


class Version(ctypes.Structure):
    """struct hwfs_version"""
    _fields_ = [("name", ctypes.c_char_p),
                ("state", ctypes.c_char_p),
                ("bytes", ctypes.c_uint64),
                ("is_current", ctypes.c_int)]


class Tensor(ctypes.Structure):
    """struct hwfs_tensor"""
    _fields_ = [("name", ctypes.c_char_p),
                ("file", ctypes.c_char_p),
                ("dtype", ctypes.c_char_p),
                ("ndim", ctypes.c_uint32),
                ("shape", ctypes.POINTER(ctypes.c_uint64)),
                ("data", ctypes.c_void_p),
                ("len", ctypes.c_uint64),
                ("hash", ctypes.c_uint8 * 16),
                ("copied", ctypes.c_int)]


class Event(ctypes.Structure):
    """struct hwfs_event"""
    _fields_ = [("type", ctypes.c_int),
                ("version", ctypes.c_char * 256)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)


def _candidates():
    """(where, path) pairs to try, in lookup order."""
    out = []
    env = os.environ.get("HWFS_LIBRARY")
    if env:
        out.append(("HWFS_LIBRARY", env))
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(("bundled", os.path.join(here, LIBNAME)))  # built by setup.py
    try:
        from . import _libdir  # written by `make install`
        out.append(("hwfs/_libdir.py", os.path.join(_libdir.LIBDIR, LIBNAME)))
    except ImportError:
        pass
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # tools/python/hwfs -> repo
    out.append(("build tree", os.path.join(repo, "build", LIBNAME)))
    found = ctypes.util.find_library("hwfs")
    if found:
        out.append(("find_library", found))
    return out


def _load():
    """Load the first libhwfs that exists; ImportError naming every place tried."""
    tried = []
    candidates = _candidates()
    for where, path in candidates:
        # find_library returns a bare soname ("libhwfs.so.1") that dlopen resolves.
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{where}: {path} (no such file)")
        else:
            try:
                return ctypes.CDLL(path, use_errno=True), path
            except OSError as e:
                tried.append(f"{where}: {path} ({e})")
        if where == "HWFS_LIBRARY":
            break  # an explicit choice that fails is an error, never a hint to look elsewhere
    explicit = any(w == "HWFS_LIBRARY" for w, _ in candidates)
    if not explicit and not any(w == "find_library" for w, _ in candidates):
        tried.append('find_library("hwfs"): not found')  # searched only without HWFS_LIBRARY
    raise ImportError("hwfs: cannot load libhwfs (`pip install` the package from the hwfs "
                      "repository to bundle it, build it with `make`, install it with "
                      "`make install`, or set HWFS_LIBRARY to its full path); tried:\n  "
                      + "\n  ".join(tried))


lib, path = _load()


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_P = ctypes.c_void_p
hwfs_open = _fn("hwfs_open", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_P))
hwfs_close = _fn("hwfs_close", None, _P)
hwfs_mountpoint = _fn("hwfs_mountpoint", ctypes.c_char_p, _P)
hwfs_errmsg = _fn("hwfs_errmsg", ctypes.c_char_p)
hwfs_call = _fn("hwfs_call", ctypes.c_int, _P, ctypes.c_char_p, PROGRESS_FN, ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p))
hwfs_versions = _fn("hwfs_versions", ctypes.c_int, _P, ctypes.POINTER(ctypes.POINTER(Version)),
                    ctypes.POINTER(ctypes.c_size_t))
hwfs_versions_free = _fn("hwfs_versions_free", None, ctypes.POINTER(Version), ctypes.c_size_t)
hwfs_current = _fn("hwfs_current", ctypes.c_int, _P, ctypes.POINTER(ctypes.c_void_p))
hwfs_map = _fn("hwfs_map", ctypes.c_int, _P, ctypes.c_char_p, ctypes.POINTER(_P))
hwfs_unmap = _fn("hwfs_unmap", None, _P)
hwfs_map_version = _fn("hwfs_map_version", ctypes.c_char_p, _P)
hwfs_map_digest = _fn("hwfs_map_digest", ctypes.c_char_p, _P)
hwfs_map_count = _fn("hwfs_map_count", ctypes.c_size_t, _P)
hwfs_map_tensor = _fn("hwfs_map_tensor", ctypes.POINTER(Tensor), _P, ctypes.c_size_t)
hwfs_map_find = _fn("hwfs_map_find", ctypes.POINTER(Tensor), _P, ctypes.c_char_p)
hwfs_watch_open = _fn("hwfs_watch_open", ctypes.c_int, _P, ctypes.c_char_p,
                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_P))
hwfs_watch_fd = _fn("hwfs_watch_fd", ctypes.c_int, _P)
hwfs_watch_next = _fn("hwfs_watch_next", ctypes.c_int, _P, ctypes.c_int, ctypes.POINTER(Event))
hwfs_engine_report = _fn("hwfs_engine_report", ctypes.c_int, _P, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_char_p, ctypes.c_uint64)
hwfs_watch_close = _fn("hwfs_watch_close", None, _P)
# the GPU plane (docs/gpu.md); the DLPack functions are declared in _dlpack.py
hwfs_load = _fn("hwfs_load", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_int, PROGRESS_FN,
                ctypes.c_void_p)
hwfs_unload = _fn("hwfs_unload", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_int)
hwfs_map_gpu = _fn("hwfs_map_gpu", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_int,
                   ctypes.POINTER(_P))
hwfs_map_device = _fn("hwfs_map_device", ctypes.c_int, _P)
hwfs_watch_open_gpu = _fn("hwfs_watch_open_gpu", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_int,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_P))

# free() for the strings libhwfs hands out with "free with free()".
_libc = ctypes.CDLL(None)
free = _libc.free
free.restype = None
free.argtypes = [ctypes.c_void_p]


def take_string(p):
    """Decode and free() a malloc'd C string (a c_void_p); None for NULL."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode()
    finally:
        free(p)


def check(rc, what):
    """Raise OSError(-rc, libhwfs's sentence) for a negative return code."""
    if rc < 0:
        msg = (hwfs_errmsg() or b"").decode(errors="replace")
        err = -rc
        raise OSError(err, f"{what}: {msg or os.strerror(err)}")
    return rc


def cstr(value, what):
    """@value as the NUL-terminated bytes libhwfs takes: bytes as they are,
    anything else as str(value) in UTF-8.  Every name, path, reason and
    request handed to libhwfs goes through here: C reads a string up to its
    first NUL, so 'v1\\x00x' would be taken for 'v1'.  Raises ValueError
    (naming @what) when @value holds a NUL."""
    b = value if isinstance(value, bytes) else str(value).encode()
    if b"\0" in b:
        raise ValueError(f"{what} {value!r} holds a NUL character")
    return b
