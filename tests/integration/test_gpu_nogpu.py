"""The GPU plane on a node without a usable GPU: `hwfs mount --pin`, the note
it prints, and the GPU fields of `hwfs status` (docs/gpu.md).

A machine without CUDA, or with the runtime but no driver or device, is the
ordinary case here and in CI.  Each test runs real daemons on real mounts; the
arena's lock is checked in the daemon's /proc/PID/status (VmLck), not only in
what status says.  Tests that need "no GPU" on a machine that has one point
HWFS_CUDART at a missing file, which the daemon then names as the reason.
"""

import os
import re

import pytest

from conftest import (assert_tree_equal, make_tensors, proc_status_bytes, random_file, save_model,
                      sh)

CAP = 64 << 20
NOTE = re.compile(r"^hwfs: note: no GPU \((.+)\): arena locked with mlock instead of pinned "
                  r"for CUDA$", re.M)


def mount_no_gpu(mount_factory, monkeypatch, extra=("--pin",), prefix=(), force=False):
    """A 64 MiB mount; with @force (or when this machine has a GPU) its daemon
    gets HWFS_CUDART=/nonexistent, so it has none."""
    if force:
        monkeypatch.setenv("HWFS_CUDART", "/nonexistent")
    m = mount_factory(capacity="64M", extra=extra, prefix=prefix)
    if m.status()["gpu"] is not None:
        assert not force, "HWFS_CUDART=/nonexistent still found a GPU"
        m.umount()
        return mount_no_gpu(mount_factory, monkeypatch, extra, prefix, force=True)
    return m


def check_pinned_mlock(m, st):
    """--pin without a GPU: the note on stderr, the lock in status and in the daemon."""
    assert st["gpu"] is None
    note = st["gpu_note"]
    assert note.startswith("no CUDA "), note
    notes = [line for line in m.mount_output.splitlines() if line.startswith("hwfs: note:")]
    assert len(notes) == 1, m.mount_output
    got = NOTE.match(notes[0])
    assert got, notes[0]
    assert got.group(1) == note
    with open(os.path.join(m.store, "hwfs.log")) as f:
        assert notes[0][len("hwfs: note: "):] in f.read()
    store = st["store"]
    assert store["preallocated"] is True
    assert store["capacity_bytes"] == CAP
    assert store["pinned"] == "mlock"
    assert store["pinned_bytes"] == CAP
    assert proc_status_bytes(m.pid, "VmLck") >= CAP


def test_pin_without_gpu(mount_factory, monkeypatch, src):
    m = mount_no_gpu(mount_factory, monkeypatch)
    st = m.status()
    if os.geteuid() != 0 and st["store"]["pinned"] == "none":
        # Not root: RLIMIT_MEMLOCK may refuse 64 MiB; the mount said so and went on.
        assert "mlock of" in m.mount_output and "refused" in m.mount_output, m.mount_output
        assert st["store"]["pinned_bytes"] == 0
    else:
        check_pinned_mlock(m, st)

    out = m.run("status").stdout
    assert f"gpu:     none ({st['gpu_note']})\n" in out, out
    assert "64.00 MiB locked (mlock)" in out or "not pinned" in out, out

    # the pinned (never punched) arena holds and serves data as usual
    save_model(src / "model.safetensors", make_tensors(1, n=6))
    random_file(src / "blob.bin", 3_000_001, seed=5)
    m.run("publish", src, "v1")
    assert_tree_equal(src, m.vpath("v1"))
    m.run("rm", "v1")
    m.run("publish", src, "v2")
    assert_tree_equal(src, m.vpath("v2"))
    assert m.status()["store"]["pinned_bytes"] == st["store"]["pinned_bytes"]

    # unpinned at unmount, pinned again on the next mount
    m.remount()
    st = m.status()
    assert st["store"]["pinned"] == "mlock" or os.geteuid() != 0
    assert_tree_equal(src, m.vpath("v2"))


def test_no_pin_is_not_pinned(mount_factory, monkeypatch):
    m = mount_no_gpu(mount_factory, monkeypatch, extra=())
    st = m.status()
    assert "hwfs: note:" not in m.mount_output
    assert st["gpu"] is None and st["gpu_note"]
    assert st["store"]["pinned"] == "none"
    assert st["store"]["pinned_bytes"] == 0
    assert st["store"]["preallocated"] is False
    assert proc_status_bytes(m.pid, "VmLck") < CAP
    out = m.run("status").stdout
    assert "gpu:     none (" in out and ", not pinned\n" in out, out
    # one GPU line per mount in the log, with the reason and what it means (was two:
    # "gpu: none (WHY)" and "gpu: WHY (hwfs load is refused)")
    with open(os.path.join(m.store, "hwfs.log")) as f:
        lines = [ln for ln in f.read().splitlines() if "gpu: " in ln]
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"gpu: none ({st['gpu_note']}); hwfs load is refused"), lines


def test_hwfs_cudart_names_the_library(mount_factory, monkeypatch):
    m = mount_no_gpu(mount_factory, monkeypatch, force=True)
    st = m.status()
    assert "HWFS_CUDART=/nonexistent" in st["gpu_note"], st["gpu_note"]
    if os.geteuid() == 0:
        check_pinned_mlock(m, st)
    assert "HWFS_CUDART=/nonexistent" in m.mount_output


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping CAP_IPC_LOCK needs root to have it")
def test_refused_mlock_is_said_not_fatal(mount_factory, monkeypatch, src):
    # RLIMIT_MEMLOCK 0 and no CAP_IPC_LOCK: mlock is refused; the mount goes on.
    m = mount_no_gpu(mount_factory, monkeypatch, prefix=(
        "prlimit", "--memlock=0:0", "setpriv", "--bounding-set=-ipc_lock",
        "--inh-caps=-ipc_lock"))
    st = m.status()
    notes = [line for line in m.mount_output.splitlines() if line.startswith("hwfs: note:")]
    assert len(notes) == 1, m.mount_output
    assert f"no GPU ({st['gpu_note']}): arena not locked either: mlock of {CAP} bytes refused" \
        in notes[0], notes[0]
    assert "RLIMIT_MEMLOCK" in notes[0]
    assert st["store"]["pinned"] == "none"
    assert st["store"]["pinned_bytes"] == 0
    assert st["store"]["preallocated"] is True
    assert proc_status_bytes(m.pid, "VmLck") == 0
    save_model(src / "model.safetensors", make_tensors(2, n=3))
    m.run("publish", src, "v1")
    assert_tree_equal(src, m.vpath("v1"))


# --------------------------------------------------------------------------
# The runtime's choice and status's device queries, against fake runtimes.
#
# Two stand-ins for libcudart found through LD_LIBRARY_PATH: libcudart.so.13
# reports a driver too old for it (cudaErrorInsufficientDriver, driver 12.4),
# as CUDA 13 does on a 550-570 driver, and libcudart.so.12 two devices.  Every
# call that needs (or makes) a CUDA context is logged to $FAKE_CUDA_LOG.
FAKE_CUDART_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void logf_(const char *what, long a)
{
	FILE *f = fopen(getenv("FAKE_CUDA_LOG"), "a");
	if (f) { fprintf(f, "%s %ld\n", what, a); fclose(f); }
}
int cudaGetDeviceCount(int *n) { *n = TOO_NEW ? 0 : 2; return TOO_NEW ? 35 : 0; }
int cudaDriverGetVersion(int *v) { *v = 12040; return 0; }
int cudaRuntimeGetVersion(int *v) { *v = TOO_NEW ? 13000 : 12040; return 0; }
int cudaSetDevice(int d) { logf_("set", d); return 0; }
int cudaMemGetInfo(size_t *f, size_t *t) { logf_("meminfo", 0); *f = 1 << 30; *t = 2u << 30;
	return 0; }
int cudaHostRegister(void *p, size_t n, unsigned fl) { logf_("register", 0); return 0; }
int cudaHostUnregister(void *p) { return 0; }
int cudaDeviceGetPCIBusId(char *id, int len, int d) { snprintf(id, len, "0000:%02X:00.0",
	0x3b + d); return 0; }
int cudaDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 75 ? 9 : 0; return 0; }
const char *cudaGetErrorString(int e) { return "fake"; }
const char *cudaGetErrorName(int e) { return "cudaErrorFake"; }
#define STUB(name) int name(void) { logf_(#name, 0); return 1; }
STUB(cudaMalloc) STUB(cudaFree) STUB(cudaMallocHost) STUB(cudaFreeHost) STUB(cudaMemcpy)
STUB(cudaMemcpyAsync) STUB(cudaStreamCreateWithFlags) STUB(cudaStreamSynchronize)
STUB(cudaStreamDestroy) STUB(cudaEventCreate) STUB(cudaEventRecord) STUB(cudaEventSynchronize)
STUB(cudaEventElapsedTime) STUB(cudaEventDestroy) STUB(cudaIpcGetMemHandle)
STUB(cudaIpcOpenMemHandle) STUB(cudaIpcCloseMemHandle) STUB(cudaDeviceSynchronize)
STUB(cudaDeviceGetByPCIBusId)
"""


@pytest.fixture
def fake_runtimes(tmp_path, monkeypatch):
    """libcudart.so.13 (driver too old) and libcudart.so.12 (two devices) first
    on the loader's path; returns a function reading the call log."""
    libs = tmp_path / "fakelibs"
    libs.mkdir()
    (tmp_path / "cudart.c").write_text(FAKE_CUDART_C)
    for soname, too_new in (("libcudart.so.13", 1), ("libcudart.so.12", 0)):
        sh(["cc", "-shared", "-fPIC", f"-DTOO_NEW={too_new}", "-o", libs / soname,
            tmp_path / "cudart.c"])
    log = tmp_path / "cuda.log"
    monkeypatch.delenv("HWFS_CUDART", raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{libs}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    monkeypatch.setenv("FAKE_CUDA_LOG", str(log))
    return lambda: log.read_text().split("\n")[:-1] if log.exists() else []


def test_older_runtime_tried_and_status_makes_no_context(mount_factory, fake_runtimes):
    """A runtime too new for the driver is passed over for the next one; status
    names each device but asks no device's memory (cudaSetDevice would make a
    context there) until this daemon has a context on it (--pin: device 0)."""
    m = mount_factory(capacity="64M")
    st = m.status()
    g = st["gpu"]
    assert g is not None, st["gpu_note"]
    assert g["library"] == "libcudart.so.12" and g["runtime"] == "12.4", g
    assert g["devices"] == [
        {"index": 0, "pci": "0000:3b:00.0", "cc": "9.0",
         "memory": "not queried (no context on this device)"},
        {"index": 1, "pci": "0000:3c:00.0", "cc": "9.0",
         "memory": "not queried (no context on this device)"}], g
    assert fake_runtimes() == [], fake_runtimes()
    out = m.run("status").stdout
    assert "gpu:     2 devices (0: 0000:3b:00.0 cc 9.0, memory not queried; 1:" in out, out
    m.umount()

    m = mount_factory(capacity="64M", extra=("--pin",))
    st = m.status()
    assert st["store"]["pinned"] == "cuda", st["store"]
    devs = st["gpu"]["devices"]
    assert (devs[0]["free_bytes"], devs[0]["total_bytes"]) == (1 << 30, 2 << 30), devs
    assert "memory" not in devs[0] and "free_bytes" not in devs[1], devs
    calls = fake_runtimes()  # register, then set 0 + meminfo for each status asked
    assert calls[0] == "register 0" and set(calls[1:]) == {"set 0", "meminfo 0"}, calls
