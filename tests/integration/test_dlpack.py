"""DLPack and the client side of the GPU plane (docs/gpu.md, "DLPack" and
"Device maps (CUDA IPC)").

Real daemons (the `mount` fixture), the tree's libhwfs (HWFS_LIBRARY), real
safetensors files written by safetensors itself, real consumers (numpy 2.x,
torch on the CPU).  Checked here: numpy.from_dlpack and torch.from_dlpack take
a mapped tensor without a copy (same address, same bytes as safetensors'
own load), read-only where the consumer honours DLPack 1.0's flag, the dtype
table (BF16, BOOL, I64, F32; F8 refused with a clear error), the lifetime (an
array keeps the mapping and its lease after Mapping.close(), and the lease ends
once the last array is garbage), capsules nobody consumed, libhwfs's
hwfs_map_dlpack* at the C level through ctypes (fields, -ERANGE, -ENOTSUP, the
map's reference count), and what a machine without a GPU answers to
hwfs_map_gpu / hwfs_load (ENODEV with the reason).
"""

import ctypes
import errno
import gc
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import HWFS, REPO, poll, sh
from fake_daemon import fake_daemon  # noqa: F401 (a fixture)

PYDIR = REPO / "tools" / "python"
os.environ.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
if str(PYDIR) not in sys.path:
    sys.path.insert(0, str(PYDIR))

import hwfs  # noqa: E402
from hwfs import _dlpack, _lib  # noqa: E402

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL = 0, 1, 2, 4, 6

BUILD = Path(HWFS).resolve().parent
# a program linked with a sanitizer build's libhwfs needs that sanitizer's runtime
SANITIZE = {"build-asan": ["-fsanitize=address,undefined"],
            "build-tsan": ["-fsanitize=thread"]}.get(BUILD.name, [])

# Maps VERSION of MOUNT, makes a DLPack tensor (both forms) of every tensor it can,
# unmaps, then reads every tensor's bytes through the DLPack tensors while 8 threads
# run their deleters (the map's last reference goes in one of them).  Prints
# "tensors N sum S" (S: the sum of every byte), "f8 -ENOTSUP" for an F8 tensor,
# and what hwfs_map_gpu said.
DLPACK_C = r"""
#include <dlpack/dlpack.h>
#include <errno.h>
#include <hwfs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DLPACK_MAJOR_VERSION /* DLPack 0.6: the 1.0 form, as fs/lib/dlpack_v1.h defines it */
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

#define THREADS 8
static DLManagedTensor *t0[4096];
static DLManagedTensorVersioned *t1[4096];
static size_t n;

static void *drop(void *arg)
{
	for (size_t i = (size_t)arg; i < n; i += THREADS) {
		t0[i]->deleter(t0[i]);
		t1[i]->deleter(t1[i]);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct hwfs *h = NULL;
	struct hwfs_map *m = NULL, *g = NULL;
	pthread_t th[THREADS];
	unsigned long long sum = 0;
	int r;

	if (argc != 3 || hwfs_open(argv[1], &h) < 0 || hwfs_map(h, argv[2], &m) < 0) {
		fprintf(stderr, "dlpack_c: %s\n", hwfs_errmsg());
		return 1;
	}
	for (size_t i = 0; i < hwfs_map_count(m) && n < 4096; i++) {
		const struct hwfs_tensor *t = hwfs_map_tensor(m, i);
		DLTensor *d;

		r = hwfs_map_dlpack(m, i, &t0[n]);
		if (r == -ENOTSUP && !strncmp(t->dtype, "F8_", 3)) {
			printf("f8 -ENOTSUP %s\n", hwfs_errmsg());
			continue;
		}
		if (r < 0 || hwfs_map_dlpack_versioned(m, i, &t1[n]) < 0) {
			fprintf(stderr, "dlpack_c: %s: %s\n", t->name, hwfs_errmsg());
			return 1;
		}
		d = &t0[n]->dl_tensor;
		if (d->data != t->data || d->ndim != (int)t->ndim || d->device.device_type != kDLCPU ||
		    t1[n]->dl_tensor.data != t->data || t1[n]->version.major != 1 ||
		    t1[n]->flags != 1 || t0[n]->manager_ctx != m) {
			fprintf(stderr, "dlpack_c: %s: wrong fields\n", t->name);
			return 1;
		}
		for (int k = 0; k < d->ndim; k++)
			if ((uint64_t)d->shape[k] != t->shape[k])
				return fprintf(stderr, "dlpack_c: %s: wrong shape\n", t->name), 1;
		n++;
	}
	if (hwfs_map_dlpack(m, hwfs_map_count(m), &t0[n]) != -ERANGE)
		return fprintf(stderr, "dlpack_c: no -ERANGE\n"), 1;
	r = hwfs_map_gpu(h, argv[2], 0, &g);
	printf("map_gpu %d %s\n", r, hwfs_errmsg());
	if (r == 0)
		hwfs_unmap(g);
	hwfs_unmap(m); /* the tensors hold the map */
	for (size_t i = 0; i < n; i++) {
		DLTensor *d = &t0[i]->dl_tensor;
		uint64_t len = (d->dtype.bits / 8) * d->dtype.lanes;

		for (int k = 0; k < d->ndim; k++)
			len *= (uint64_t)d->shape[k];
		for (uint64_t b = 0; b < len; b++)
			sum += ((const unsigned char *)d->data)[b];
	}
	for (size_t i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, drop, (void *)i);
	for (size_t i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	printf("tensors %zu sum %llu\n", n, sum);
	hwfs_close(h);
	return 0;
}
"""


def model_tensors():
    """The version's tensors: one of each dtype the tests look at."""
    g = torch.Generator().manual_seed(11)
    t = {
        "w.f32": torch.randn(64, 33, generator=g),
        "w.i64": torch.arange(-500, 500, dtype=torch.int64).reshape(10, 100),
        "w.bf16": torch.randn(17, 8, generator=g).to(torch.bfloat16),
        "w.bool": torch.rand(3, 5, 7, generator=g) > 0.5,
        "w.u8": torch.arange(256, dtype=torch.uint8),
        "w.scalar": torch.tensor(3.5, dtype=torch.float64),
        "w.empty": torch.zeros(0, 4),
    }
    if hasattr(torch, "float8_e4m3fn"):
        t["w.f8"] = torch.linspace(-2, 2, 16).to(torch.float8_e4m3fn)
    return t


@pytest.fixture
def version(mount, tmp_path):
    """v1 written through the mount and sealed; returns (mount, safetensors' own load)."""
    os.makedirs(mount.vpath("v1"))
    path = mount.vpath("v1", "model.safetensors")
    save_file(model_tensors(), path)
    mount.run("seal", "v1")
    return mount, load_file(path)


def leases(mount):
    return mount.status()["leases"]


def no_lease(mount):
    """Wait (collecting garbage) until the daemon lists no lease."""
    def check():
        gc.collect()
        return leases(mount) == []
    return poll(check)


def as_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


# --------------------------------------------------------------------------
# numpy and torch take the tensors without a copy


def test_numpy_from_dlpack_zero_copy_read_only(version):
    mount, ref = version
    with hwfs.open(mount.mnt) as h, h.map("v1") as v:
        for key in ("w.f32", "w.i64", "w.bool", "w.u8", "w.scalar", "w.empty"):
            a = np.from_dlpack(v.dlpack(key))
            want = ref[key]
            assert a.shape == tuple(want.shape), key
            assert a.dtype == {"w.f32": np.float32, "w.i64": np.int64, "w.bool": np.bool_,
                               "w.u8": np.uint8, "w.scalar": np.float64,
                               "w.empty": np.float32}[key]
            if a.size:
                assert a.ctypes.data == v.address(key), f"{key} was copied"
            assert a.tobytes() == as_bytes(want), key
            assert not a.flags.writeable, f"{key}: numpy made a writable array over the arena"
            with pytest.raises(ValueError, match="read-only"):
                a.reshape(-1)[:1] = 0


def test_torch_from_dlpack_zero_copy_with_bf16(version):
    mount, ref = version
    with hwfs.open(mount.mnt) as h, h.map("v1") as v:
        for key in ("w.f32", "w.i64", "w.bf16", "w.bool", "w.u8", "w.scalar"):
            t = torch.from_dlpack(v.dlpack(key))
            assert t.dtype == ref[key].dtype, key
            assert t.device.type == "cpu"
            assert t.shape == ref[key].shape
            assert t.data_ptr() == v.address(key), f"{key} was copied"
            assert torch.equal(t, ref[key]), key
        assert torch.from_dlpack(v.dlpack("w.bf16")).dtype == torch.bfloat16


def test_numpy_refuses_bf16_clearly_and_nothing_leaks(version):
    """numpy has no bfloat16: its refusal is a clear exception (not a crash, not
    SystemError), and the tensor it refused does not keep the lease."""
    mount, _ = version
    with hwfs.open(mount.mnt) as h:
        v = h.map("v1")
        with pytest.raises((RuntimeError, BufferError, TypeError), match="(?i)dtype"):
            np.from_dlpack(v.dlpack("w.bf16"))
        v.close()
        del v
    assert no_lease(mount), leases(mount)


def test_f8_and_copy_and_device_are_refused(version):
    mount, _ = version
    with hwfs.open(mount.mnt) as h, h.map("v1") as v:
        if "w.f8" in v:
            for consumer in (np.from_dlpack, torch.from_dlpack):
                with pytest.raises(BufferError, match="F8_E4M3"):
                    consumer(v.dlpack("w.f8"))
        d = v.dlpack("w.f32")
        assert d.__dlpack_device__() == (1, 0)
        with pytest.raises(BufferError, match="copy"):
            d.__dlpack__(copy=True)
        with pytest.raises(BufferError, match="device"):
            d.__dlpack__(dl_device=(2, 0))
        with pytest.raises(KeyError):
            v.dlpack("no.such.tensor")
    with pytest.raises(ValueError, match="closed"):
        v.dlpack("w.f32")
    assert leases(mount) != [], "a DLPackTensor holds the mapping until it is dropped"
    del d
    assert no_lease(mount), leases(mount)


def test_versioned_capsule_is_read_only_and_legacy_consumers_get_0_6(version):
    mount, ref = version
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    with hwfs.open(mount.mnt) as h, h.map("v1") as v:
        d = v.dlpack("w.f32")
        cap = d.__dlpack__(max_version=(1, 0))
        assert api.PyCapsule_GetName(cap) == b"dltensor_versioned"
        mt = _dlpack.DLManagedTensorVersioned.from_address(
            api.PyCapsule_GetPointer(cap, b"dltensor_versioned"))
        assert (mt.version.major, mt.version.minor) == (1, 0)
        assert mt.flags & _dlpack.FLAG_READ_ONLY
        assert mt.dl_tensor.data == v.address("w.f32")
        cap = d.__dlpack__(max_version=(0, 8))
        assert api.PyCapsule_GetName(cap) == b"dltensor"
        cap = d.__dlpack__()
        assert api.PyCapsule_GetName(cap) == b"dltensor"
        del cap, d

        class Legacy:
            """A producer wrapper that speaks the pre-1.0 protocol (no max_version)."""
            def __init__(self, inner):
                self.inner = inner

            def __dlpack__(self, stream=None):
                return self.inner.__dlpack__(stream=stream)

            def __dlpack_device__(self):
                return self.inner.__dlpack_device__()

        a = np.from_dlpack(Legacy(v.dlpack("w.i64")))
        t = torch.from_dlpack(Legacy(v.dlpack("w.bf16")))
        assert a.ctypes.data == v.address("w.i64") and a.tobytes() == as_bytes(ref["w.i64"])
        assert t.data_ptr() == v.address("w.bf16") and torch.equal(t, ref["w.bf16"])
        del a, t
    assert no_lease(mount), leases(mount)


# --------------------------------------------------------------------------
# lifetime: the arrays hold the mapping


def test_arrays_outlive_the_mapping_and_hold_the_lease(version):
    mount, ref = version
    pid = os.getpid()
    with hwfs.open(mount.mnt) as h:
        v = h.map("v1")
        a = np.from_dlpack(v.dlpack("w.f32"))
        t = torch.from_dlpack(v.dlpack("w.bf16"))
        addr = v.address("w.f32")
        v.close()
        del v
    gc.collect()
    assert leases(mount) == [{"version": "v1", "pid": pid}]
    mount.run("rm", "v1")  # the lease keeps its bytes
    gc.collect()
    assert a.ctypes.data == addr
    assert a.tobytes() == as_bytes(ref["w.f32"])
    assert torch.equal(t, ref["w.bf16"])
    del a
    gc.collect()
    assert leases(mount) == [{"version": "v1", "pid": pid}], "the torch tensor holds it too"
    assert torch.equal(t, ref["w.bf16"])
    del t
    assert no_lease(mount), leases(mount)


def test_unconsumed_capsule_releases_its_reference(version):
    mount, _ = version
    with hwfs.open(mount.mnt) as h:
        v = h.map("v1")
        cap = v.dlpack("w.f32").__dlpack__(max_version=(1, 0))  # nobody consumes it
        v.close()
        del v
        gc.collect()
        assert leases(mount) != []
        del cap
    assert no_lease(mount), leases(mount)
    with hwfs.open(mount.mnt) as h:
        v = h.map("v1")
        d = v.dlpack("w.i64")
        for _ in range(20):  # made and dropped by the producer object itself
            d.__dlpack__()
        v.close()
        del v, d
    assert no_lease(mount), leases(mount)


def test_many_tensors(mount):
    n = 300
    ts = {f"layer.{i}.w": torch.full((i % 7 + 1, 16), float(i)) for i in range(n)}
    os.makedirs(mount.vpath("many"))
    save_file(ts, mount.vpath("many", "model.safetensors"))
    mount.run("seal", "many")
    with hwfs.open(mount.mnt) as h:
        v = h.map("many")
        arrays = {k: np.from_dlpack(v.dlpack(k)) for k in ts}
        tensors = {k: torch.from_dlpack(v.dlpack(k)) for k in ts}
        v.close()
        del v
    for k, want in ts.items():
        assert np.array_equal(arrays[k], want.numpy()), k
        assert torch.equal(tensors[k], want), k
        assert arrays[k].ctypes.data == tensors[k].data_ptr()
    gc.collect()
    assert leases(mount) != []
    del arrays, tensors
    assert no_lease(mount), leases(mount)


# --------------------------------------------------------------------------
# the C functions, through ctypes


def c_map(h, version):
    p = ctypes.c_void_p()
    _lib.check(_lib.hwfs_map(h._handle(), version.encode(), ctypes.byref(p)), "hwfs_map")
    return p


def test_c_hwfs_map_dlpack(version):
    mount, ref = version
    pid = os.getpid()
    with hwfs.open(mount.mnt) as h:
        m = c_map(h, "v1")
        n = _lib.hwfs_map_count(m)
        assert _lib.hwfs_map_device(m) == -1
        want = {"w.f32": (KDL_FLOAT, 32), "w.i64": (KDL_INT, 64), "w.bf16": (KDL_BFLOAT, 16),
                "w.bool": (KDL_BOOL, 8), "w.u8": (KDL_UINT, 8), "w.scalar": (KDL_FLOAT, 64),
                "w.empty": (KDL_FLOAT, 32)}
        made = []
        for i in range(n):
            t = _lib.hwfs_map_tensor(m, i).contents
            name = t.name.decode()
            out = ctypes.POINTER(_dlpack.DLManagedTensor)()
            rc = _dlpack.hwfs_map_dlpack(m, i, ctypes.byref(out))
            if name == "w.f8":
                assert rc == -errno.ENOTSUP
                assert b"F8_E4M3" in _lib.hwfs_errmsg()
                assert not out
                continue
            assert rc == 0, _lib.hwfs_errmsg()
            dl = out.contents.dl_tensor
            assert (dl.device.device_type, dl.device.device_id) == (1, 0)
            assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (*want[name], 1), name
            assert dl.ndim == t.ndim == len(ref[name].shape)
            assert [dl.shape[k] for k in range(dl.ndim)] == list(ref[name].shape)
            assert not dl.strides and dl.byte_offset == 0
            assert dl.data == t.data
            made.append(out)
        # versioned: 1.0, read-only
        vout = ctypes.POINTER(_dlpack.DLManagedTensorVersioned)()
        assert _dlpack.hwfs_map_dlpack_versioned(m, 0, ctypes.byref(vout)) == 0
        vt = vout.contents
        assert (vt.version.major, vt.version.minor, vt.flags) == (1, 0, _dlpack.FLAG_READ_ONLY)
        assert vt.dl_tensor.data == _lib.hwfs_map_tensor(m, 0).contents.data
        # no tensor n
        bad = ctypes.POINTER(_dlpack.DLManagedTensor)()
        assert _dlpack.hwfs_map_dlpack(m, n, ctypes.byref(bad)) == -errno.ERANGE
        assert b"no tensor" in _lib.hwfs_errmsg()
        assert _dlpack.hwfs_map_dlpack_versioned(m, n + 5, ctypes.byref(vout)) == -errno.ERANGE
        # the tensors hold the map: unmap first, the lease stays until the last deleter
        keep = made[0].contents.dl_tensor
        first = ctypes.string_at(keep.data, 16)
        _lib.hwfs_unmap(m)
        assert leases(mount) == [{"version": "v1", "pid": pid}]
        assert ctypes.string_at(keep.data, 16) == first
        for out in made:
            p = ctypes.cast(out, ctypes.c_void_p).value
            out.contents.deleter(p)  # once each: the consumer's part
        assert leases(mount) == [{"version": "v1", "pid": pid}], "the versioned one holds it"
        p = ctypes.cast(vout, ctypes.c_void_p).value
        vout.contents.deleter(p)
        assert leases(mount) == []


def test_c_program_dlpack_threads(version, tmp_path):
    """A C program against include/hwfs.h and <dlpack/dlpack.h> (the build's libhwfs,
    sanitized when HWFS_BIN is a sanitizer build): DLPack tensors outlive hwfs_unmap and
    their deleters drop the last reference from 8 threads at once."""
    mount, ref = version
    (tmp_path / "dl.c").write_text(DLPACK_C)
    sh(["cc", *SANITIZE, "-pthread", "-o", tmp_path / "dl", tmp_path / "dl.c",
        f"-I{REPO / 'include'}", f"-L{BUILD}", "-lhwfs", f"-Wl,-rpath,{BUILD}"])
    out = sh([tmp_path / "dl", mount.mnt, "v1"]).stdout
    want_sum = sum(sum(as_bytes(t)) for k, t in ref.items() if k != "w.f8")
    want_n = len(ref) - ("w.f8" in ref)
    assert f"tensors {want_n} sum {want_sum}" in out, out
    if "w.f8" in ref:
        assert "f8 -ENOTSUP tensor w.f8 is F8_E4M3" in out, out
    assert f"map_gpu {-errno.ENODEV} cannot map on GPU 0: no CUDA" in out, out
    assert no_lease(mount), leases(mount)


# --------------------------------------------------------------------------
# no GPU on this machine: the device plane says so


def test_map_gpu_without_gpu_is_enodev(version):
    mount, _ = version
    with hwfs.open(mount.mnt) as h:
        with pytest.raises(OSError) as ei:
            h.map("v1", gpu=0)
        assert ei.value.errno == errno.ENODEV, ei.value
        assert "no CUDA" in str(ei.value) and "GPU 0" in str(ei.value), ei.value
        p = ctypes.c_void_p()
        assert _lib.hwfs_map_gpu(h._handle(), b"v1", -1, ctypes.byref(p)) == -errno.EINVAL
        assert _lib.hwfs_map_gpu(h._handle(), b"../x", 0, ctypes.byref(p)) == -errno.EINVAL
        assert not p
        assert leases(mount) == []


def test_load_without_gpu_is_enodev(version):
    """Needs the daemon's load op (issue 10, fs/daemon/daemon_gpu.c)."""
    mount, _ = version
    with hwfs.open(mount.mnt) as h:
        with pytest.raises(OSError) as ei:
            h.load("v1", 0)
        assert ei.value.errno == errno.ENODEV, ei.value
        assert "no CUDA" in str(ei.value) and "v1" in str(ei.value), ei.value
        with pytest.raises(FileNotFoundError, match="v1"):
            h.unload("v1")
        with pytest.raises(FileNotFoundError, match="v1"):
            h.unload("v1", gpu=0)
        with pytest.raises(OSError) as ei:
            h.load("v1", -1)
        assert ei.value.errno == errno.EINVAL


def test_watch_gpu_arguments(version):
    mount, _ = version
    with hwfs.open(mount.mnt) as h:
        w, cur = ctypes.c_void_p(), ctypes.c_void_p()
        assert _lib.hwfs_watch_open_gpu(h._handle(), None, 0, ctypes.byref(cur),
                                        ctypes.byref(w)) == -errno.EINVAL
        assert _lib.hwfs_watch_open_gpu(h._handle(), b"e", -2, ctypes.byref(cur),
                                        ctypes.byref(w)) == -errno.EINVAL
        with h.watch("plain", gpu=-1) as w:  # -1: an engine that reports itself
            assert w.engine == "plain"
            assert [e["name"] for e in mount.status()["engines"]] == ["plain"]


# --------------------------------------------------------------------------
# device maps against a fake CUDA runtime (HWFS_CUDART) and a fake daemon

# A libcudart stand-in with two devices, PCI 0000:3b:00.0 and 0000:3c:00.0
# (cudaDeviceGetByPCIBusId knows them): an IPC handle's first 8 bytes are the
# bucket's size and its 9th the byte the bucket is filled with;
# IpcOpenMemHandle mallocs such a buffer (host memory standing for device
# memory) and IpcCloseMemHandle frees it.  Every open, close, SetDevice and
# DeviceSynchronize is logged to $FAKE_CUDA_LOG.  The calling thread has a
# context current (cuCtxGetCurrent, the driver's, here beside the runtime's)
# on device 7 when $FAKE_CTX is set, and none otherwise (cudaGetDevice then
# says 0, as the real one does).
FAKE_CUDART_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char reserved[64]; } handle_t;
static int current = -1;

static void logf_(const char *what, long a)
{
	FILE *f = fopen(getenv("FAKE_CUDA_LOG"), "a");
	if (f) { fprintf(f, "%s %ld\n", what, a); fclose(f); }
}
static int cur(void) { if (current < 0) current = getenv("FAKE_CTX") ? 7 : 0; return current; }
int cuCtxGetCurrent(void **ctx) { *ctx = getenv("FAKE_CTX") ? (void *)&current : NULL; return 0; }
int cudaGetDeviceCount(int *n) { *n = 2; return 0; }
int cudaDriverGetVersion(int *v) { *v = 13000; return 0; }
int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }
int cudaGetDevice(int *d) { *d = cur(); return 0; }
int cudaSetDevice(int d) { cur(); logf_("set", d); current = d; return 0; }
int cudaDeviceSynchronize(void) { logf_("sync", cur()); return 0; }
int cudaDeviceGetByPCIBusId(int *d, const char *id)
{
	if (!strcmp(id, "0000:3b:00.0")) { *d = 0; return 0; }
	if (!strcmp(id, "0000:3c:00.0")) { *d = 1; return 0; }
	return 101;
}
int cudaIpcOpenMemHandle(void **p, handle_t h, unsigned flags)
{
	unsigned long long n;
	memcpy(&n, h.reserved, 8);
	if (flags != 1 || !(*p = malloc(n ? n : 1))) return 1;
	memset(*p, (unsigned char)h.reserved[8], n);
	logf_("open", (long)n);
	return 0;
}
int cudaIpcCloseMemHandle(void *p) { free(p); logf_("close", 0); return 0; }
const char *cudaGetErrorString(int e) { return "fake"; }
const char *cudaGetErrorName(int e) { return "cudaErrorFake"; }
#define STUB(name) int name(void) { return 1; }
STUB(cudaDeviceGetAttribute) STUB(cudaDeviceGetPCIBusId) STUB(cudaMemGetInfo)
STUB(cudaHostRegister) STUB(cudaHostUnregister) STUB(cudaMalloc) STUB(cudaFree)
STUB(cudaMallocHost) STUB(cudaFreeHost) STUB(cudaMemcpy) STUB(cudaMemcpyAsync)
STUB(cudaStreamCreateWithFlags) STUB(cudaStreamSynchronize) STUB(cudaStreamDestroy)
STUB(cudaEventCreate) STUB(cudaEventRecord) STUB(cudaEventSynchronize)
STUB(cudaEventElapsedTime) STUB(cudaEventDestroy) STUB(cudaIpcGetMemHandle)
"""


def fake_handle(size, fill):
    return (size.to_bytes(8, "little") + bytes([fill]) + bytes(55)).hex()


def gpumap_answer(**change):
    """A gpumap answer for version "v" on GPU 0: two buckets, three tensors."""
    ans = {"ok": True, "version": "v", "digest": "ab" * 16, "gpu": 0,
           "buckets": [{"handle": fake_handle(4096, 0x11), "bytes": 4096},
                       {"handle": fake_handle(1024, 0x22), "bytes": 1024}],
           "tensors": [
               {"name": "a", "file": "m.safetensors", "dtype": "F32", "shape": [4, 8],
                "bucket": 0, "offset": 0, "len": 128, "hash": "0" * 32},
               {"name": "b", "file": "m.safetensors", "dtype": "BF16", "shape": [10],
                "bucket": 0, "offset": 256, "len": 20, "hash": "1" * 32},
               {"name": "c", "file": "sub/n.safetensors", "dtype": "I64", "shape": [2, 64],
                "bucket": 1, "offset": 0, "len": 1024, "hash": "2" * 32}]}
    tensors = change.pop("tensor0", None)
    if tensors:
        ans["tensors"][0].update(tensors)
    ans.update(change)
    return ans


@pytest.fixture
def fake_cuda(tmp_path, monkeypatch):
    """HWFS_CUDART naming the fake runtime; returns a function reading its log."""
    (tmp_path / "cudart.c").write_text(FAKE_CUDART_C)
    so = tmp_path / "libfakecudart.so"
    sh(["cc", "-shared", "-fPIC", "-o", so, tmp_path / "cudart.c"])
    log = tmp_path / "cuda.log"
    monkeypatch.setenv("HWFS_CUDART", str(so))
    monkeypatch.setenv("FAKE_CUDA_LOG", str(log))
    return lambda: log.read_text().split("\n")[:-1] if log.exists() else []


def serve(answer):
    def reply(c, req):
        assert req == {"op": "gpumap", "version": "v", "gpu": 0}, req
        c.sendall((json.dumps(answer) + "\n").encode())
    return reply


def test_device_map_with_fake_runtime(fake_daemon, fake_cuda):
    """hwfs_map_gpu's whole path: the answer read, the daemon's GPU 0 found
    here by its PCI id (device 1 in this process), every bucket opened with
    IPC on it, no device set back (the thread had no context: setting the
    device cudaGetDevice names, 0, would make one there), tensors pointing
    into the buckets, kDLCUDA DLPack tensors, and the buckets closed, after
    a device sync, only once the map's last reference (a DLPack capsule) is
    gone."""
    fd = fake_daemon(serve(gpumap_answer(pci="0000:3c:00.0")))
    with hwfs.open(fd.dir) as h:
        v = h.map("v", gpu=0)
        assert v.device == 1 and v.digest == "ab" * 16
        assert fake_cuda() == ["set 1", "open 4096", "open 1024"]
        assert [(t.name, t.file, t.dtype, t.shape) for t in v.tensors()] == [
            ("a", "m.safetensors", "F32", (4, 8)), ("b", "m.safetensors", "BF16", (10,)),
            ("c", "sub/n.safetensors", "I64", (2, 64))]
        assert v.address("b") == v.address("a") + 256
        assert ctypes.string_at(v.address("c"), 4) == b"\x22" * 4  # the bucket's bytes
        with pytest.raises(TypeError, match="GPU 1"):
            v["a"]
        d = v.dlpack("b")
        assert d.__dlpack_device__() == (2, 1)
        cap = d.__dlpack__(max_version=(1, 0))
        api = ctypes.pythonapi
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        mt = _dlpack.DLManagedTensorVersioned.from_address(
            api.PyCapsule_GetPointer(cap, b"dltensor_versioned"))
        dl = mt.dl_tensor
        assert (dl.device.device_type, dl.device.device_id) == (2, 1)
        assert (dl.dtype.code, dl.dtype.bits) == (KDL_BFLOAT, 16)
        assert dl.data == v.address("b") and dl.shape[0] == 10
        with pytest.raises(BufferError, match="device"):
            d.__dlpack__(dl_device=(1, 0))
        v.close()
        del v, d, mt, dl
        gc.collect()
        assert "close 0" not in fake_cuda(), "closed under a live DLPack tensor"
        del cap
        gc.collect()
        assert fake_cuda()[3:] == ["set 1", "sync 1", "close 0", "close 0"], fake_cuda()
        assert "set 0" not in fake_cuda()


def test_device_map_puts_back_the_callers_device(fake_daemon, fake_cuda, monkeypatch):
    """A thread with a context current (on device 7 here) gets its device back
    after the map and after the unmap; an answer without "pci" (an older
    daemon) is mapped on the daemon's number."""
    monkeypatch.setenv("FAKE_CTX", "1")
    fd = fake_daemon(serve(gpumap_answer()))
    with hwfs.open(fd.dir) as h:
        v = h.map("v", gpu=0)
        assert v.device == 0
        assert fake_cuda() == ["set 0", "open 4096", "open 1024", "set 7"]
        v.close()
        assert fake_cuda()[4:] == ["set 0", "sync 0", "close 0", "close 0", "set 7"], \
            fake_cuda()


@pytest.mark.parametrize("pci,gpu,device", [
    ("0000:3b:00.0", 1, 0),     # the daemon's 1 is this process's 0
    ("0000:99:00.0", 1, 1),     # not seen here: the daemon's number, which exists
    ("0000:99:00.0", 2, None),  # not seen here, and no device 2: said clearly
    (None, 2, None)])
def test_device_map_numbering(pci, gpu, device, fake_daemon, fake_cuda):
    answer = gpumap_answer(gpu=gpu)
    if pci:
        answer["pci"] = pci

    def reply(c, req):
        assert req == {"op": "gpumap", "version": "v", "gpu": gpu}, req
        c.sendall((json.dumps(answer) + "\n").encode())
    fd = fake_daemon(reply)
    with hwfs.open(fd.dir) as h:
        if device is None:
            with pytest.raises(OSError) as ei:
                h.map("v", gpu=gpu)
            assert ei.value.errno == errno.ENODEV, ei.value
            assert "sees 2 CUDA devices (CUDA_VISIBLE_DEVICES?)" in str(ei.value)
            assert not pci or f"(PCI {pci}) is not visible in this process" in str(ei.value)
            assert fake_cuda() == []
        else:
            v = h.map("v", gpu=gpu)
            assert v.device == device
            assert fake_cuda()[0] == f"set {device}"
            v.close()


def test_device_map_zero_length_tensor(fake_daemon, fake_cuda):
    """A tensor of no bytes is fine at offset 0 of any bucket, and at a bucket's end."""
    answer = gpumap_answer()
    answer["tensors"] += [
        {"name": "e0", "file": "m.safetensors", "dtype": "F32", "shape": [0],
         "bucket": 1, "offset": 0, "len": 0, "hash": "3" * 32},
        {"name": "e1", "file": "m.safetensors", "dtype": "F32", "shape": [2, 0],
         "bucket": 0, "offset": 4096, "len": 0, "hash": "4" * 32}]
    fd = fake_daemon(serve(answer))
    with hwfs.open(fd.dir) as h:
        v = h.map("v", gpu=0)
        assert v.address("e0") == v.address("c")
        assert [t.shape for t in v.tensors()][-2:] == [(0,), (2, 0)]
        v.close()


@pytest.mark.parametrize("case", [
    "short-handle", "upper-handle", "bucket-out-of-range", "negative-bucket",
    "bucket-not-integer", "bad-pci", "offset-past-bucket",
    "len-overflow", "other-gpu", "other-version", "bad-file-path", "bad-digest",
    "negative-shape", "no-buckets"])
def test_device_map_checks_the_daemons_answer(case, fake_daemon, fake_cuda):
    """A gpumap answer that lies is refused (EPROTO, "malformed gpumap answer")
    before any bucket is opened."""
    big = (1 << 63) - 1  # the largest a JSON integer carries here
    answer, words = {
        "short-handle": (gpumap_answer(buckets=[{"handle": "ab" * 63, "bytes": 4096}]),
                         "handle"),
        "upper-handle": (gpumap_answer(buckets=[{"handle": fake_handle(4096, 0xab).upper(),
                                                 "bytes": 4096}]), "handle"),
        "bucket-out-of-range": (gpumap_answer(tensor0={"bucket": 2}), "outside"),
        "negative-bucket": (gpumap_answer(tensor0={"bucket": -1}), "outside"),
        "bucket-not-integer": (gpumap_answer(tensor0={"bucket": 0.0}), "outside"),
        "bad-pci": (gpumap_answer(pci="0000:3b:00.0; rm -rf /"), "pci"),
        "offset-past-bucket": (gpumap_answer(tensor0={"offset": 4000}), "outside"),
        "len-overflow": (gpumap_answer(tensor0={"offset": 64, "len": big}), "outside"),
        "other-gpu": (gpumap_answer(gpu=1), "GPU"),
        "other-version": (gpumap_answer(version="w"), "version"),
        "bad-file-path": (gpumap_answer(tensor0={"file": "../../etc/passwd"}), "file"),
        "bad-digest": (gpumap_answer(digest="xyz"), "version"),
        "negative-shape": (gpumap_answer(tensor0={"shape": [4, -8]}), "shape"),
        "no-buckets": (gpumap_answer(buckets=None), "bucket"),
    }[case]
    fd = fake_daemon(serve(answer))
    with hwfs.open(fd.dir) as h:
        with pytest.raises(OSError) as ei:
            h.map("v", gpu=0)
    assert ei.value.errno == errno.EPROTO, ei.value
    assert "malformed gpumap answer" in str(ei.value) and words in str(ei.value), ei.value
    assert not [ln for ln in fake_cuda() if ln.startswith("open")], fake_cuda()
