"""hwfs.dtypes — the safetensors dtype names and what they are in numpy and torch.

One table per library, each read both ways where the package needs it:

  * numpy_dtype("BF16"): the numpy dtype a Mapping's arrays take (hwfs.numpy_dtype);
  * torch_dtype("BF16") -> torch.bfloat16: what hwfs.torch makes of a mapped tensor;
  * st_dtype(torch.bfloat16) -> "BF16": what hwfs.trainers writes into a header.

BF16 and FP8 in numpy are ml_dtypes' types when ml_dtypes is importable, else
the unsigned integer of the same width (the raw bits).  The torch table holds
the dtypes this torch has (FP8 and the wide unsigned integers are recent), and
is built on first use: importing this module does not import torch.
"""

import numpy as np

__all__ = ["numpy_dtype", "torch_dtype", "st_dtype"]

# ------------------------------------------------------------------ numpy

_NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"),
}
# safetensors dtype -> (ml_dtypes' name, numpy fallback holding the raw bits)
_LAZY_DTYPES = {"BF16": ("bfloat16", np.uint16), "F8_E4M3": ("float8_e4m3fn", np.uint8),
                "F8_E5M2": ("float8_e5m2", np.uint8)}


def _ml_dtype(name, fallback):
    try:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError):
        return np.dtype(fallback)


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


# ------------------------------------------------------------------ torch

# safetensors dtype -> the name of torch's dtype (the table; only those this torch has count)
_TORCH_NAMES = (
    ("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"),
    ("I64", "int64"), ("I32", "int32"), ("I16", "int16"), ("I8", "int8"),
    ("U8", "uint8"), ("BOOL", "bool"),
    ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
    ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
)
_TORCH = None  # ({st: torch dtype}, {torch dtype: st}) once built


def _torch_tables():
    global _TORCH
    if _TORCH is None:
        import torch
        pairs = [(st, getattr(torch, name)) for st, name in _TORCH_NAMES if hasattr(torch, name)]
        _TORCH = (dict(pairs), {dt: st for st, dt in pairs})
    return _TORCH


def torch_dtype(st_dtype):
    """The torch dtype of safetensors dtype @st_dtype (TypeError when torch has none)."""
    try:
        return _torch_tables()[0][st_dtype]
    except KeyError:
        raise TypeError(f"safetensors dtype {st_dtype} has no torch dtype") from None


def st_dtype(dt):
    """The safetensors dtype string of torch dtype @dt (TypeError when none)."""
    try:
        return _torch_tables()[1][dt]
    except KeyError:
        raise TypeError(f"torch dtype {dt} has no safetensors dtype") from None
