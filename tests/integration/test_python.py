"""The Python package hwfs (tools/python): the ctypes binding of libhwfs.

Real daemons (the `mount` fixture), the real libhwfs of the build tree
(HWFS_LIBRARY, set below unless the environment sets it), real safetensors
files.  docs/engines.md, section "Python", says what is checked here.
"""

import errno
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, make_tensors, poll, proc_status_bytes, save_model
from fake_daemon import fake_daemon  # noqa: F401 (a fixture)

PYDIR = REPO / "tools" / "python"
os.environ.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
if str(PYDIR) not in sys.path:
    sys.path.insert(0, str(PYDIR))

import hwfs  # noqa: E402

MiB = 1 << 20


def write_version(mount, version, tensors, fname="model.safetensors", seal=True):
    """Save @tensors into MOUNT/versions/VERSION/FNAME through the mount and seal it."""
    save_model(mount.vpath(version, fname), tensors, metadata={"format": "np"})
    if seal:
        mount.run("seal", version)


def regions_covering(addr, n):
    """The /proc/self/maps entries covering [addr, addr+n): a list of
    (start, end, perms, inode, path); AssertionError when a byte is in none."""
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip() if len(parts) > 5 else ""
            regions.append((lo, hi, parts[1], int(parts[4]), path))
    out, at, end = [], addr, addr + max(n, 1)
    while at < end:
        r = next((r for r in regions if r[0] <= at < r[1]), None)
        assert r is not None, f"address {at:#x} lies in no mapping"
        out.append(r)
        at = r[1]
    return out


def next_event(w, want_type, want_version, timeout=10.0):
    """Read events from @w until (want_type, want_version) comes; the events seen."""
    import time
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ev = w.next(timeout=max(0.0, end - time.monotonic()))
        if ev is None:
            break
        seen.append((ev.type, ev.version))
        if (ev.type, ev.version) == (want_type, want_version):
            return seen
    pytest.fail(f"no {want_type} {want_version} event within {timeout}s; saw {seen}")


# --------------------------------------------------------------------------


def test_map_equals_safetensors(mount):
    """Every tensor of a mapped version equals safetensors' own reading of the
    file, with the file's dtype and shape, read-only; the info (dtype, shape,
    bytes, hash) matches the mount's tensors/ xattrs; versions() and current()
    match `hwfs status`."""
    from safetensors.numpy import load_file

    t = make_tensors(seed=3, n=6, max_kib=256)
    t["ids"] = np.arange(1000, dtype=np.int64).reshape(10, 100)
    t["half"] = np.linspace(-2, 2, 4096, dtype=np.float16).reshape(64, 64)
    t["bytes"] = np.frombuffer(b"hwfs" * 33, dtype=np.uint8).copy()  # odd length: 132
    t["scalar"] = np.array(3.5, dtype=np.float64)
    t["empty"] = np.zeros((0, 7), dtype=np.float32)
    write_version(mount, "v1", t)
    mount.run("commit", "v1")
    want = load_file(mount.vpath("v1", "model.safetensors"))

    with hwfs.open(mount.mnt) as m:
        assert m.mountpoint == mount.mnt
        assert m.current() == "v1"
        vs = m.versions()
        assert [(v.name, v.state, v.current) for v in vs] == [("v1", "sealed", True)]
        assert vs[0].bytes == mount.version("v1")["bytes"]
        with m.map("v1") as v:
            assert v.version == "v1"
            assert v.digest == mount.version("v1")["digest"]
            assert sorted(v) == sorted(want)
            for name, ref in want.items():
                a = v[name]
                assert a.dtype == ref.dtype and a.shape == ref.shape, name
                assert np.array_equal(a, ref), f"tensor {name} differs from the file"
                assert not a.flags.writeable
                with pytest.raises(ValueError):
                    a.flags.writeable = True
                info = v.info(name)
                assert info.nbytes == ref.nbytes and info.shape == ref.shape
                assert info.file == "model.safetensors"
                tfile = mount.vpath("v1", "tensors", name)
                assert os.getxattr(tfile, "user.hwfs.hash").decode() == info.hash, name
                assert os.getxattr(tfile, "user.hwfs.dtype").decode() == info.dtype, name
            assert "model.safetensors:ids" in v and np.array_equal(v["model.safetensors:ids"], t["ids"])
            with pytest.raises(KeyError, match="no tensor 'nope'"):
                v["nope"]
        # closed: no new lookups
        with pytest.raises(ValueError, match="closed"):
            v.buffer("ids")


def test_map_is_zero_copy(mount):
    """Touching every byte of a mapped 64 MiB version adds far less than its
    size to the process's anonymous memory, and each array's bytes lie in a
    read-only, file-backed mapping (the arena), not in a copy."""
    t = {f"layer.{i}.weight": np.random.default_rng(i).standard_normal((1024, 1024), dtype=np.float32)
         for i in range(16)}  # 16 x 4 MiB
    write_version(mount, "big", t)
    size = sum(a.nbytes for a in t.values())
    assert size == 64 * MiB

    with hwfs.open(mount.mnt) as m, m.map("big") as v:
        before = proc_status_bytes("self", "RssAnon")
        total = 0.0
        for name in v:
            a = v[name]
            assert not v.info(name).copied, name
            total += float(a.sum(dtype=np.float64))  # reads every byte
            assert a.ctypes.data == v.address(name)
            for r in regions_covering(a.ctypes.data, a.nbytes):
                lo, hi, perms, inode, path = r
                assert "w" not in perms, f"{name}: its mapping is writable ({r})"
                assert inode != 0 and path, f"{name}: anonymous memory ({r}), not the arena"
        grew = proc_status_bytes("self", "RssAnon") - before
        assert grew < size // 8, f"RssAnon grew by {grew} bytes reading a {size}-byte version"
        assert total == pytest.approx(sum(float(a.sum(dtype=np.float64)) for a in t.values()))


def test_array_keeps_mapping_alive(mount):
    """An array outlives Mapping.close(): the lease and the pages last until
    the last array is gone, then the mapping is unmapped."""
    import gc

    t = make_tensors(seed=5, n=3, max_kib=128)
    write_version(mount, "v1", t)
    with hwfs.open(mount.mnt) as m:
        v = m.map("v1")
        name = next(iter(t))
        a = v[name]
        v.close()
        assert v.closed and not v.unmapped
        assert np.array_equal(a, t[name])  # still readable: `a` holds the mapping
        del a
        gc.collect()
        assert v.unmapped


def test_mapping_survives_rm(mount_factory):
    """`hwfs rm` of a mapped version removes the name at once, but the mapped
    bytes stay intact (not reused by a later version) until the mapping goes;
    then the store frees them."""
    import gc

    mount = mount_factory(capacity="48M")
    t1 = {f"a.{i}": np.full((256, 1024), i + 1, dtype=np.float32) for i in range(16)}  # 16 MiB
    write_version(mount, "v1", t1)
    with hwfs.open(mount.mnt) as m:
        v = m.map("v1")
        arrays = {k: v[k] for k in v}
        v.close()
        mount.run("rm", "v1")
        assert not os.path.exists(mount.vpath("v1"))
        assert "v1" not in [x.name for x in m.versions()]
        # A new version as big as the removed one: it must not land on v1's bytes.
        t2 = {f"b.{i}": np.full((256, 1024), -(i + 1), dtype=np.float32) for i in range(16)}
        write_version(mount, "v2", t2)
        for k, a in arrays.items():
            assert np.array_equal(a, t1[k]), f"{k} changed under a live mapping after hwfs rm"
        held = mount.used_bytes()
        assert held >= 32 * MiB, f"store holds {held} bytes: v1's shards were freed under the lease"
        del arrays, a
        gc.collect()
        assert v.unmapped
        assert poll(lambda: mount.used_bytes() <= held - 16 * MiB, timeout=10), \
            f"v1's bytes were not freed after the mapping ended ({mount.used_bytes()} held)"


def test_watch_yields_events(mount):
    """A plain watch sees a version arrive (sealed), `current` flip to it, and
    a version removed, in that order, named."""
    with hwfs.open(mount.mnt) as m, m.watch() as w:
        assert w.current is None
        write_version(mount, "v1", make_tensors(seed=1, n=2, max_kib=64))
        next_event(w, "arrived", "v1")
        mount.run("commit", "v1")
        next_event(w, "current", "v1")
        write_version(mount, "v2", make_tensors(seed=2, n=2, max_kib=64))
        next_event(w, "arrived", "v2")
        mount.run("commit", "v2")
        next_event(w, "current", "v2")
        mount.run("rm", "v1")
        next_event(w, "removed", "v1")
    with hwfs.open(mount.mnt) as m, m.watch() as w:
        assert w.current == "v2"


# the syscall numbers of poll and ppoll (x86_64: 7 and 271; aarch64 has ppoll only: 73)
POLL_SYSCALLS = {"x86_64": {"7", "271"}, "aarch64": {"73"}}.get(os.uname().machine)


def in_poll(thread):
    """Is @thread blocked in poll()/ppoll() right now (/proc/self/task/TID/syscall)?"""
    try:
        with open(f"/proc/self/task/{thread.native_id}/syscall") as f:
            return f.read().split()[0] in POLL_SYSCALLS
    except (OSError, IndexError):
        return False


def test_watch_close_while_a_report_is_blocked(fake_daemon):
    """An engine whose node does not read its reports: a report blocks
    inside libhwfs for room on the socket.  close() from another thread then
    wakes it (the report raises) and frees the watch only after the report
    left the library, never under it; later calls raise ValueError."""
    if not POLL_SYSCALLS:
        pytest.skip(f"no poll syscall numbers known for {os.uname().machine}")
    fake = fake_daemon(lambda c, req: c.sendall(b'{"ok": true, "current": null}\n'))
    w = hwfs.open(fake.dir).watch(engine="stuck")
    sent, failed = [0], []

    def reporter():
        try:
            while True:
                w.report("loading", "v1")
                sent[0] += 1
        except (OSError, ValueError) as e:
            failed.append(e)

    t = threading.Thread(target=reporter, daemon=True)
    t.start()
    assert poll(lambda: in_poll(t) or not t.is_alive(), timeout=20), \
        f"the reports never filled the socket ({sent[0]} sent)"
    assert t.is_alive(), failed
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    closer.join(timeout=20)
    t.join(timeout=20)
    assert not t.is_alive(), "a report is still blocked in libhwfs after close()"
    assert not closer.is_alive(), "close() did not return"
    assert len(failed) == 1 and isinstance(failed[0], (ValueError, OSError)), failed
    with pytest.raises(ValueError, match="closed"):
        w.report("loaded", "v1")
    with pytest.raises(ValueError, match="closed"):
        w.next(timeout=0)


def test_errors(mount, tmp_path):
    """Clear errors: not an hwfs mount, no such version, an open version."""
    with pytest.raises(OSError) as e:
        hwfs.open(str(tmp_path))
    assert e.value.errno in (errno.ENOTSUP, errno.EOPNOTSUPP), e.value
    with hwfs.open(mount.mnt) as m:
        assert m.current() is None
        with pytest.raises(FileNotFoundError, match="nope"):
            m.map("nope")
        save_model(mount.vpath("open1", "m.safetensors"), make_tensors(seed=1, n=1, max_kib=64))
        with pytest.raises(OSError) as e:
            m.map("open1")
        assert e.value.errno == errno.EBUSY, e.value
        r = m.call({"op": "status"})
        assert r["pid"] == mount.pid


def test_names_with_a_nul_are_refused(mount):
    """A string with an embedded NUL is refused with ValueError before it
    reaches libhwfs, which would read it only up to the NUL (map('v1\\x00x')
    used to map v1): version names, engine names, report reasons, mount paths
    and raw requests, at every entry point that hands one to the library."""
    write_version(mount, "v1", make_tensors(seed=1, n=1, max_kib=64))
    with pytest.raises(ValueError, match="NUL"):
        hwfs.open(mount.mnt + "\0/elsewhere")
    with hwfs.open(mount.mnt) as m:
        refused = {
            "map": lambda: m.map("v1\0x"),
            "map on a GPU": lambda: m.map("v1\0x", gpu=0),
            "load": lambda: m.load("v1\0x", 0),
            "unload": lambda: m.unload("v1\0x"),
            "watch as an engine": lambda: m.watch(engine="e\0x"),
            "watch as a GPU engine": lambda: m.watch(engine="e\0x", gpu=0),
            "call (str)": lambda: m.call('{"op": "status"}\0{"op": "gc"}'),
            "call (bytes)": lambda: m.call(b'{"op": "status"}\0'),
        }
        for what, fn in refused.items():
            with pytest.raises(ValueError, match="NUL"):
                fn()
                pytest.fail(f"{what} accepted a name with a NUL")
        with m.watch(engine="e") as w:
            with pytest.raises(ValueError, match="NUL"):
                w.report("loaded", "v1\0x")
            with pytest.raises(ValueError, match="NUL"):
                w.report("refused", "v1", reason="why\0more")
        assert [e["name"] for e in m.call({"op": "status"})["engines"]] in ([], ["e"])
        with m.map("v1") as v:
            name = v.keys()[0]
            assert name + "\0x" not in v
            with pytest.raises(KeyError):
                v[name + "\0x"]


def test_library_lookup_error(tmp_path):
    """HWFS_LIBRARY naming a missing file: importing hwfs raises ImportError
    saying where it looked."""
    env = dict(os.environ, HWFS_LIBRARY=str(tmp_path / "nope.so"), PYTHONPATH=str(PYDIR))
    cp = subprocess.run([sys.executable, "-c", "import hwfs"], capture_output=True, text=True,
                        env=env, timeout=60)
    assert cp.returncode != 0
    assert "ImportError" in cp.stderr and "HWFS_LIBRARY" in cp.stderr and "nope.so" in cp.stderr


@pytest.mark.limit(300)
def test_make_install_package_finds_its_library(mount, tmp_path):
    """After `make install PREFIX=P`, the installed package finds P/lib/libhwfs.so.1
    through the LIBDIR of its _libdir.py, with no HWFS_LIBRARY and away from
    the build tree, and maps a version with it."""
    prefix = tmp_path / "prefix"
    cp = subprocess.run(["make", "-s", "-C", str(REPO), "install", f"PREFIX={prefix}"],
                        capture_output=True, text=True, timeout=280)
    assert cp.returncode == 0, cp.stderr
    m = re.search(r"^installed the Python package in (\S+)/hwfs$", cp.stdout, re.M)
    assert m, cp.stdout
    site = Path(m.group(1))
    assert (site / "hwfs" / "_libdir.py").exists()
    mount.run("publish", str(save_model(tmp_path / "src" / "m.safetensors",
                                        {"w": np.arange(4, dtype=np.int32)}).parent), "v1")
    env = {k: v for k, v in os.environ.items() if k != "HWFS_LIBRARY"}
    env["PYTHONPATH"] = str(site)
    code = ("import hwfs, hwfs._lib as L, sys; print(L.path); "
            "print(hwfs.open(sys.argv[1]).map('v1')['w'].tolist())")
    cp = subprocess.run([sys.executable, "-c", code, mount.mnt], capture_output=True, text=True,
                        timeout=60, cwd=tmp_path, env=env)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split("\n")[:2] == [str(prefix / "lib" / "libhwfs.so.1"), "[0, 1, 2, 3]"], cp.stdout
