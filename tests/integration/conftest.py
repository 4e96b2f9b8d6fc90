"""Shared fixtures and helpers for the hwfs integration tests.

Every test that needs a filesystem asks for ``mount`` (a fresh store and
mountpoint, default capacity) or ``mount_factory`` (``mount_factory(capacity=
"64M")``; may be called several times).  The helper object they return runs
``hwfs VERB ... -m MNT`` with a timeout, parses ``hwfs status --json`` and can
unmount, remount and kill -9 the daemon.  Whatever happens, teardown unmounts
(``hwfs umount``, then ``fusermount3 -u -z``), kills the daemon pid learned
from ``hwfs status`` if it is still alive, and removes the temporary dirs.

A per-test watchdog kills the daemons of the test's mounts when the test runs
past its limit (default 120 s, ``@pytest.mark.limit(seconds)`` to change), so a
hung FUSE request turns into an error instead of a hung CI job.  The helpers
that the tests import (``from conftest import ...``) are at the bottom.
"""

import ctypes
import errno
import faulthandler
import json
import mmap
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HWFS = os.environ.get("HWFS_BIN") or str(REPO / "build" / "hwfs")


def _time_scale():
    """How much slower than the optimised build the daemon under test runs: the Makefile's
    sanitizer passes set HWFS_TIME_SCALE (ASan 2, TSan 4); else 1.  Every deadline of the
    suite (watchdog limits, subprocess timeouts, waits on a condition) is multiplied by it,
    so a slow build cannot fail a test that only waits."""
    try:
        return max(1.0, float(os.environ.get("HWFS_TIME_SCALE", "1")))
    except ValueError:
        return 1.0


TIME_SCALE = _time_scale()


def scaled(seconds):
    """@seconds of deadline, for the build under test (TIME_SCALE times longer)."""
    return seconds * TIME_SCALE


TIMEOUT = scaled(60)  # seconds, for every subprocess
DEFAULT_TEST_LIMIT = 120  # seconds, per-test watchdog (times TIME_SCALE)
HEX32 = re.compile(r"^[0-9a-f]{32}$")
REQUIRED_TOOLS = ("fusermount3", "cp", "cmp", "rsync", "getfattr", "inotifywait", "ln", "mv", "touch", "ls")


# --------------------------------------------------------------------------
# process helpers


def sh(args, check=True, timeout=TIMEOUT, **kw):
    """Run @args (list), capture text output, fail the test on a timeout."""
    args = [str(a) for a in args]
    try:
        cp = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"command timed out after {timeout}s: {' '.join(args)}\n"
                    f"stdout: {e.stdout!r}\nstderr: {e.stderr!r}")
    if check and cp.returncode != 0:
        pytest.fail(f"command failed (exit {cp.returncode}): {' '.join(args)}\n"
                    f"stdout: {cp.stdout}\nstderr: {cp.stderr}")
    return cp


def _proc_state(pid):
    """Process state letter from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(")") + 2:].split()[0]


def pid_alive(pid):
    """True when @pid exists and is not a zombie."""
    st = _proc_state(pid)
    return st is not None and st != "Z"


def _is_hwfs_process(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"hwfs" in f.read()
    except OSError:
        return False


def wait_dead(pid, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return not pid_alive(pid)


def _unescape_mount_field(s):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_entries(path):
    """The lines of /proc/mounts whose mount point is @path (one per stacked mount)."""
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return [line for line in f
                if len(line.split()) > 1 and _unescape_mount_field(line.split()[1]) == path]


def is_mounted(path):
    return bool(mount_entries(path))


# --------------------------------------------------------------------------
# the mount helper

_ACTIVE = []  # HwfsMount objects of the running test (for the watchdog)


class HwfsMount:
    def __init__(self, capacity=None, extra=(), long_store=False, umask=None, prefix=()):
        self.capacity = capacity
        self.extra = list(extra)  # more `hwfs mount` options
        self.prefix = list(prefix)  # a command `hwfs mount` runs under (e.g. prlimit ...)
        self.umask = umask  # the umask `hwfs mount` (and so its daemon) runs under
        self.top = tempfile.mkdtemp(dir="/dev/shm", prefix="hwfs-test-")
        # long_store: a store path too long for a unix socket address (108 bytes)
        self.store = os.path.join(self.top, "s" * 120) if long_store else self.top
        self.mnt = os.path.realpath(tempfile.mkdtemp(prefix="hwfs-mnt-"))
        self.pid = None
        self.pids = []  # every daemon pid learned from status
        self.mounted = False
        self.mount_output = ""  # what the last `hwfs mount` printed (stdout and stderr)

    # -- paths
    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def vpath(self, version, *parts):
        return os.path.join(self.mnt, "versions", version, *parts)

    def log_tail(self, n=40):
        try:
            with open(os.path.join(self.store, "hwfs.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError as e:
            return f"(no daemon log: {e})"

    # -- commands
    def run(self, *args, check=True, timeout=TIMEOUT, input=None):
        """`hwfs ARGS -m MNT`; with check=True a non-zero exit fails the test."""
        args = [HWFS, *[str(a) for a in args], "-m", self.mnt]
        try:
            cp = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"timed out after {timeout}s: {' '.join(args)}\nstderr: {e.stderr!r}\n"
                        f"daemon log:\n{self.log_tail()}")
        if check and cp.returncode != 0:
            pytest.fail(f"exit {cp.returncode}: {' '.join(args)}\nstdout: {cp.stdout}\n"
                        f"stderr: {cp.stderr}\ndaemon log:\n{self.log_tail()}")
        return cp

    def status(self):
        cp = self.run("status", "--json")
        try:
            return json.loads(cp.stdout)
        except ValueError as e:
            pytest.fail(f"hwfs status --json printed invalid JSON ({e}): {cp.stdout!r}")

    def version(self, name):
        """The status record of version @name, or None."""
        for v in self.status()["versions"]:
            if v["name"] == name:
                return v
        return None

    def used_bytes(self):
        return self.status()["store"]["used_bytes"]

    def mount_args(self):
        """The `hwfs mount` command line (cluster nodes add their options)."""
        args = [*self.prefix, HWFS, "mount", self.mnt, "--store", self.store]
        if self.capacity:
            args += ["--capacity", str(self.capacity)]
        return args + self.extra

    def mount(self):
        args = self.mount_args()
        # Output goes to files, not pipes: a daemon that kept an inherited
        # pipe open would otherwise make us wait for it.
        with tempfile.TemporaryFile("w+") as out:
            try:
                rc = subprocess.run(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    timeout=TIMEOUT, umask=-1 if self.umask is None else self.umask
                                    ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            out.seek(0)
            text = out.read()
        self.mount_output = text
        if rc != 0:
            pytest.fail(f"`{' '.join(args)}` failed ({rc}): {text}\ndaemon log:\n{self.log_tail()}")
        self.mounted = True
        assert is_mounted(self.mnt), f"hwfs mount returned 0 but {self.mnt} is not in /proc/mounts"
        st = self.status()
        self.pid = int(st["pid"])
        self.pids.append(self.pid)
        return st

    def umount(self, check=True):
        cp = sh([HWFS, "umount", self.mnt], check=False)
        if check and cp.returncode != 0:
            pytest.fail(f"hwfs umount failed ({cp.returncode}): {cp.stderr}\n{self.log_tail()}")
        if cp.returncode == 0:
            self.mounted = False
        return cp

    def remount(self):
        if self.mounted:
            self.umount()
            if self.pid is not None:
                assert wait_dead(self.pid, 10), "daemon still alive after hwfs umount"
        return self.mount()

    def kill9(self):
        """kill -9 the daemon, then detach the dead mount (fusermount3 -u, else -z)."""
        assert self.pid is not None
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        assert wait_dead(self.pid, 10), f"daemon {self.pid} survived SIGKILL"
        cp = sh(["fusermount3", "-u", self.mnt], check=False)
        if cp.returncode != 0 or is_mounted(self.mnt):
            sh(["fusermount3", "-u", "-z", self.mnt], check=False)
        assert not is_mounted(self.mnt), "could not detach the mount of the killed daemon"
        self.mounted = False

    def kill_daemons(self):
        """Watchdog/cleanup: SIGKILL every daemon pid this helper learned."""
        for pid in self.pids:
            if pid_alive(pid) and _is_hwfs_process(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def cleanup(self):
        try:
            if is_mounted(self.mnt):
                try:
                    subprocess.run([HWFS, "umount", self.mnt], capture_output=True, timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True, timeout=30)
        finally:
            self.kill_daemons()
            for pid in self.pids:
                wait_dead(pid, 5)
            if not is_mounted(self.mnt):
                try:
                    os.rmdir(self.mnt)
                except OSError:
                    pass
            shutil.rmtree(self.top, ignore_errors=True)


# --------------------------------------------------------------------------
# pytest plumbing


def pytest_configure(config):
    config.addinivalue_line("markers", "limit(seconds): per-test watchdog limit (default 120; "
                            "times HWFS_TIME_SCALE under the sanitizer passes)")


@pytest.fixture(scope="session", autouse=True)
def _environment():
    """Fail (never skip) every test when the environment cannot run them."""
    problems = []
    try:
        if not stat.S_ISCHR(os.stat("/dev/fuse").st_mode):
            problems.append("/dev/fuse is not a character device")
    except FileNotFoundError:
        problems.append("/dev/fuse is missing (FUSE is not available in this environment)")
    if not os.access(HWFS, os.X_OK):
        problems.append(f"hwfs binary {HWFS} not found or not executable (run `make`, or set HWFS_BIN)")
    for tool in REQUIRED_TOOLS:
        if shutil.which(tool) is None:
            problems.append(f"required tool `{tool}` not found (run tools/install/install-deps.sh)")
    if not os.path.isdir("/dev/shm"):
        problems.append("/dev/shm is missing")
    if problems:
        pytest.fail("hwfs integration tests cannot run:\n  " + "\n  ".join(problems), pytrace=False)
    yield


@pytest.fixture(autouse=True)
def _watchdog(request):
    marker = request.node.get_closest_marker("limit")
    limit = scaled(marker.args[0] if marker else DEFAULT_TEST_LIMIT)
    fired = threading.Event()

    def on_timeout():
        fired.set()
        sys.stderr.write(f"\nwatchdog: {request.node.nodeid} ran past {limit}s; killing its hwfs daemons\n")
        for m in list(_ACTIVE):
            m.kill_daemons()

    timer = threading.Timer(limit, on_timeout)
    timer.daemon = True
    timer.start()
    # Last resort when even killing the daemon does not unblock the test.
    faulthandler.dump_traceback_later(limit + 60, exit=True)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
    if fired.is_set():
        pytest.fail(f"test ran past its {limit}s limit; the watchdog killed the daemon", pytrace=False)


@pytest.fixture
def mount_factory():
    """mount_factory(capacity=None, extra=(), long_store=False, umask=None, prefix=()) -> a
    mounted HwfsMount; all cleaned up after the test."""
    made = []

    def make(capacity=None, extra=(), **kw):
        m = HwfsMount(capacity, extra, **kw)
        made.append(m)
        _ACTIVE.append(m)
        m.mount()
        return m

    try:
        yield make
    finally:
        for m in reversed(made):
            try:
                m.cleanup()
            finally:
                if m in _ACTIVE:
                    _ACTIVE.remove(m)


@pytest.fixture
def mount(mount_factory):
    return mount_factory()


@pytest.fixture
def src(tmp_path):
    """A scratch directory for source data."""
    d = tmp_path / "src"
    d.mkdir()
    return d


# --------------------------------------------------------------------------
# synthetic data

N_TENSORS = 20
CHANGED_IDX = (3, 11)  # the "10%" of tensors that version 2 changes


def _rng(*key):
    import numpy as np

    return np.random.default_rng(list(key))


def make_tensors(seed=1, n=N_TENSORS, prefix="model.layers", changed=(), min_kib=64, max_kib=1024):
    """Deterministic float32 tensors of 64 KiB..1 MiB, shape (KiB, 256).

    Tensors whose index is in @changed get different values (same shape), so a
    second call with changed=CHANGED_IDX is "version 2 with 10% changed".
    """
    import numpy as np

    sizes = _rng(seed, 0xA11).integers(min_kib // 64, max_kib // 64 + 1, size=n) * 64
    sizes[0], sizes[-1] = min_kib, max_kib  # always cover both ends
    out = {}
    for i in range(n):
        variant = 1 if i in changed else 0
        data = _rng(seed, i, variant).standard_normal((int(sizes[i]), 256), dtype=np.float32)
        out[f"{prefix}.{i}.weight"] = data
    return out


def changed_names(tensors, changed=CHANGED_IDX):
    names = list(tensors)
    return [names[i] for i in changed]


def tensor_bytes(tensors, names=None):
    names = tensors.keys() if names is None else names
    return sum(tensors[n].nbytes for n in names)


def save_model(path, tensors, metadata=None):
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def random_file(path, size, seed=0):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = _rng(seed, 0xF11E)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(rng.bytes(n))
            left -= n
    return path


def make_hf_model(root, seed=7):
    """A Hugging Face-like model directory: config, tokenizer, two shards, a subdir."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t = make_tensors(seed, n=12, prefix=f"hf{seed}.layers")
    names = list(t)
    shard1 = {k: t[k] for k in names[:6]}
    shard2 = {k: t[k] for k in names[6:]}
    save_model(root / "model-00001-of-00002.safetensors", shard1, metadata={"format": "np"})
    save_model(root / "model-00002-of-00002.safetensors", shard2, metadata={"format": "np"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in shard1}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in shard2})
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": tensor_bytes(t)}, "weight_map": weight_map}, indent=2))
    (root / "config.json").write_text(json.dumps(
        {"architectures": ["TestForCausalLM"], "hidden_size": 256, "num_hidden_layers": 12,
         "torch_dtype": "float32"}, indent=2))
    vocab = {f"tok{i}": i for i in range(5000)}
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": vocab}}))
    (root / "subdir").mkdir(exist_ok=True)
    (root / "subdir" / "generation_config.json").write_text('{"temperature": 0.7}\n')
    (root / "subdir" / "deeper").mkdir(exist_ok=True)
    random_file(root / "subdir" / "deeper" / "blob.bin", 300_001, seed=seed)
    (root / "subdir" / "empty.txt").write_bytes(b"")
    return root


# --------------------------------------------------------------------------
# comparisons


def first_difference(a, b, chunk=1 << 20):
    """None when files @a and @b are byte-identical, else a description."""
    sa, sb = os.path.getsize(a), os.path.getsize(b)
    if sa != sb:
        return f"sizes differ: {a}={sa} {b}={sb}"
    with open(a, "rb") as fa, open(b, "rb") as fb:
        off = 0
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                for i, (p, q) in enumerate(zip(x, y)):
                    if p != q:
                        return f"first difference at byte {off + i}"
                return f"short read at {off}"
            if not x:
                return None
            off += len(x)


def assert_same_file(a, b):
    diff = first_difference(a, b)
    assert diff is None, f"{a} and {b} differ: {diff}"


def _entries(root, ignore_top=()):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in ignore_top]
            filenames = [f for f in filenames if f not in ignore_top]
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            r = os.path.normpath(os.path.join(rel, name))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[r] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[r] = ("dir", None)
            else:
                out[r] = ("file", st.st_size)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return out


def assert_tree_equal(src, dst, ignore_top=("tensors", "tp")):
    """Every entry of @src exists in @dst with identical bytes, and nothing else
    does (a sealed version's synthetic top-level tensors/ and tp/ dirs are ignored)."""
    a = _entries(src)
    b = _entries(dst, ignore_top=ignore_top)
    assert sorted(a) == sorted(b), (f"trees differ: only in source {sorted(set(a) - set(b))}, "
                                    f"only in mount {sorted(set(b) - set(a))}")
    for rel, (kind, info) in a.items():
        assert b[rel][0] == kind, f"{rel}: {kind} in source, {b[rel][0]} in mount"
        if kind == "file":
            assert_same_file(os.path.join(src, rel), os.path.join(dst, rel))
        elif kind == "link":
            assert b[rel][1] == info, f"{rel}: link target {b[rel][1]!r} != {info!r}"


def assert_error_line(cp, *words):
    """Non-zero exit, a `hwfs: error:` line on stderr, mentioning each of @words."""
    assert cp.returncode != 0, f"expected failure, got exit 0 (stdout {cp.stdout!r})"
    assert "hwfs: error:" in cp.stderr, f"no `hwfs: error:` line on stderr: {cp.stderr!r}"
    for w in words:
        assert w.lower() in cp.stderr.lower(), f"stderr does not mention {w!r}: {cp.stderr!r}"


def proc_status_bytes(pid, field):
    """Field @field of /proc/@pid/status ("RssAnon", "VmHWM", "VmLck": a size in kB), in
    bytes; @pid may be "self"."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def readlink_or_none(path):
    try:
        return os.readlink(path)
    except FileNotFoundError:
        return None


def read_text(path):
    """The text of the file @path (a log), or "" when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def poll(fn, timeout=5.0, interval=0.05):
    """Call @fn until it returns a truthy value or @timeout passes (times TIME_SCALE);
    return the last value."""
    end = time.monotonic() + scaled(timeout)
    while True:
        v = fn()
        if v or time.monotonic() >= end:
            return v
        time.sleep(interval)


def safetensors_header(path):
    """(header dict, data start) of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_libxxhash = None


def xxh3_128_hex(data):
    """XXH3-128 of @data in hwfs's canonical hex (big-endian high64, then low64),
    computed here with libxxhash's own XXH3_128bits: an expectation independent
    of hwfs's hashing code."""
    global _libxxhash
    if _libxxhash is None:
        lib = ctypes.CDLL("libxxhash.so.0")
        lib.XXH3_128bits.restype = _XXH128
        lib.XXH3_128bits.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
        _libxxhash = lib
    h = _libxxhash.XXH3_128bits(bytes(data), len(data))
    return f"{h.high64:016x}{h.low64:016x}"


def expect_errno(exc_info, *codes):
    e = exc_info.value
    assert e.errno in codes, f"expected {[errno.errorcode[c] for c in codes]}, got {e!r}"


def find_all(path, needle):
    """Offsets of every occurrence of @needle in the (sparse) file @path."""
    hits = []
    size = os.path.getsize(path)
    if size == 0:
        return hits
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = 0
        while True:
            # Skip holes quickly where the filesystem tells us about them.
            try:
                data = os.lseek(f.fileno(), pos, os.SEEK_DATA)
            except OSError:
                break
            i = mm.find(needle, data)
            if i < 0:
                break
            hits.append(i)
            pos = i + 1
    return hits


def flip_byte(path, off):
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, off)
        os.pwrite(fd, bytes([b[0] ^ 0xFF]), off)
        os.fsync(fd)
    finally:
        os.close(fd)

def ask_engine(sock, timeout=5.0):
    """What the C engine (hwfs-engine) listening on unix socket @sock serves: its
    answer to "what do you serve?" (a dict), or None when it does not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock))
            s.sendall(b"what do you serve?\n")
            buf = b""
            while not buf.endswith(b"\n"):
                data = s.recv(4096)
                if not data:
                    return None
                buf += data
            return json.loads(buf)
    except OSError:
        return None
