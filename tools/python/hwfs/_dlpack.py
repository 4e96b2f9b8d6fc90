"""DLPack capsules over libhwfs's DLPack tensors (hwfs_map_dlpack*, include/hwfs.h).

A consumer (numpy.from_dlpack, torch.from_dlpack, cupy.from_dlpack, ...)
calls ``obj.__dlpack__(max_version=...)`` and gets a PyCapsule named
"dltensor" (DLPack 0.6: DLManagedTensor) or "dltensor_versioned" (DLPack 1.0:
DLManagedTensorVersioned, flagged read-only).  The consumer renames the capsule
("used_dltensor", "used_dltensor_versioned") when it takes the tensor, and
from then on calls the tensor's deleter itself when its array dies.  A
capsule nobody consumed must run the deleter itself.

The deleter is libhwfs's: it frees the tensor and drops its reference on the
C map, so the mapping (and its lease) lasts as long as any array made from
it, whatever Python does with the Mapping object.

Who runs the deleter of an unconsumed capsule (the decision):
 - the capsule's destructor, a ctypes callback (_destroy), when the capsule
   is freed while nothing else is going on;
 - but a consumer that refuses a tensor (numpy and a bfloat16 one) sets its
   exception and THEN drops the capsule, so the destructor would run with an
   exception pending, and a Python callback cannot run then: its first call
   into C fails on the pending exception, the deleter is skipped (the lease
   leaks) and the consumer's error is lost (SystemError).  So the producer
   (DLPackTensor) keeps a reference to each capsule it made: the consumer's
   drop is never the last one, and release() runs at the producer's own
   __del__, which CPython calls with any pending exception set aside.  It
   runs the deleter of a capsule nobody consumed and nobody else holds, and
   clears that capsule's destructor first.  A capsule someone else still
   holds is left to its destructor.
"""

import ctypes
import sys

from . import _lib

DLTENSOR = b"dltensor"
DLTENSOR_VERSIONED = b"dltensor_versioned"

# DLDeviceType
KDL_CPU = 1
KDL_CUDA = 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p),
                ("device", DLDevice),
                ("ndim", ctypes.c_int),
                ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    """DLPack 0.6's managed tensor."""
    _fields_ = [("dl_tensor", DLTensor),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """DLPack 1.0's managed tensor."""
    _fields_ = [("version", DLPackVersion),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER),
                ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


FLAG_READ_ONLY = 1 << 0

_P = ctypes.c_void_p
hwfs_map_dlpack = _lib._fn("hwfs_map_dlpack", ctypes.c_int, _P, ctypes.c_size_t,
                           ctypes.POINTER(ctypes.POINTER(DLManagedTensor)))
hwfs_map_dlpack_versioned = _lib._fn("hwfs_map_dlpack_versioned", ctypes.c_int, _P,
                                     ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned)))

# The capsule API: PyCapsule_New through pythonapi (it may fail and set an
# error); the destructor's two read-only calls through a plain CDLL (above).
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CAPSULE_DESTRUCTOR]
_capi = ctypes.CDLL(None)
_IsValid = _capi.PyCapsule_IsValid
_IsValid.restype = ctypes.c_int
_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_GetPointer = _capi.PyCapsule_GetPointer
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_SetDestructor = ctypes.pythonapi.PyCapsule_SetDestructor
_PyCapsule_SetDestructor.restype = ctypes.c_int
_PyCapsule_SetDestructor.argtypes = [ctypes.py_object, ctypes.c_void_p]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _destroy(capsule):
    """The capsules' destructor: run the tensor's deleter unless a consumer took it."""
    for name, kind in ((DLTENSOR_VERSIONED, DLManagedTensorVersioned),
                       (DLTENSOR, DLManagedTensor)):
        if _IsValid(capsule, name):
            p = _GetPointer(capsule, name)
            if p:
                kind.from_address(p).deleter(p)
            return


# Module-level, so that it outlives every capsule (capsules may die at interpreter exit).
_DESTROY = CAPSULE_DESTRUCTOR(_destroy)


def release(caps):
    """Empty list @caps (capsules a producer made and still holds): for each
    one that nobody else holds and nobody consumed, run its tensor's deleter
    now (its destructor cleared first); drop the others, which their
    destructor handles.  Call with no exception pending (a __del__)."""
    while caps:
        cap = caps.pop()
        if sys.getrefcount(cap) > 2:  # `cap` and the argument: someone else holds it
            continue
        for name, kind in ((DLTENSOR_VERSIONED, DLManagedTensorVersioned),
                           (DLTENSOR, DLManagedTensor)):
            if _PyCapsule_IsValid(cap, name):
                p = _PyCapsule_GetPointer(cap, name)
                _PyCapsule_SetDestructor(cap, None)
                kind.from_address(p).deleter(p)
                break


def capsule(map_ptr, index, versioned):
    """A new capsule over tensor @index of C map @map_ptr (DLPack 1.0 read-only when
    @versioned, else 0.6).  Raises OSError (libhwfs's errno and sentence)."""
    if versioned:
        out = ctypes.POINTER(DLManagedTensorVersioned)()
        _lib.check(hwfs_map_dlpack_versioned(map_ptr, index, ctypes.byref(out)),
                   "hwfs_map_dlpack_versioned")
        name = DLTENSOR_VERSIONED
    else:
        out = ctypes.POINTER(DLManagedTensor)()
        _lib.check(hwfs_map_dlpack(map_ptr, index, ctypes.byref(out)), "hwfs_map_dlpack")
        name = DLTENSOR
    p = ctypes.cast(out, ctypes.c_void_p).value
    try:
        return _PyCapsule_New(p, name, _DESTROY)
    except BaseException:
        out.contents.deleter(p)  # no capsule owns it
        raise
