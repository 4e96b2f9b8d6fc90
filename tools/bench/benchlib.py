"""benchlib.py — helpers shared by the benchmarks (tools/bench/bench.py,
tools/bench/bench_cluster.py, tools/bench/bench_engine.py).

The three scripts start hwfs daemons, time commands and write a report; the
small things they all do live here, once: running a command that must succeed (its stderr in the error), a log line with
the script's prefix, the nearest-rank percentile, /proc/mounts and pid checks,
dropping the page cache, `hwfs mount` (a command whose daemon stays behind)
and the teardown of a mounted node (`hwfs umount`, a lazy unmount if it stays
mounted, SIGKILL to its daemon by pid), stopping a process started with Popen,
the tail of a log, the header of a safetensors file, float32 -> bfloat16
rounding and the size of a file under `zstd -1`, the description of the
machine, its pace now (XXH3-128 CPU per GiB) and the git revision, Ctrl-C/SIGTERM handling around a teardown, a
table cell that may be empty, and writing the results as JSON.

Nothing here keeps state and no command runs on import: each script passes
what differs (its hwfs binary, which may be a private copy, and its timeouts).
The scripts run as `python3 tools/bench_X.py`, so this directory is on sys.path.
"""

import io
import json
import math
import os
import platform
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HWFS = os.environ.get("HWFS_BIN") or str(REPO / "build" / "hwfs")
CMD_TIMEOUT = 120     # seconds a command may take unless the caller says otherwise
STOP_GRACE = 5        # seconds a daemon or process gets to exit before SIGKILL
DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4}


def logger(prefix):
    """A log(msg) function that prints "PREFIX: msg" on stderr."""
    def log(msg):
        print(f"{prefix}: {msg}", file=sys.stderr, flush=True)
    return log


def run(args, timeout=CMD_TIMEOUT, check=True, **kw):
    """Run @args (stdin /dev/null, output captured as text); with @check, raise
    RuntimeError with the command and its stderr when it exits non-zero."""
    args = [str(a) for a in args]
    cp = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    if check and cp.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({cp.returncode}): {cp.stderr.strip()}")
    return cp


def pctl(xs, p):
    """Nearest-rank percentile @p of @xs."""
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def mounted(path):
    """Whether something is mounted on @path (per /proc/mounts)."""
    with open("/proc/mounts") as f:
        return any(len(l.split()) > 1 and l.split()[1] == path for l in f)


def pid_alive(pid):
    """Whether process @pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def drop_caches(what, timeout=CMD_TIMEOUT):
    """sync, then write @what to /proc/sys/vm/drop_caches (1: the page cache;
    3: also dentries and inodes); tmpfs pages stay.  True if done (needs root)."""
    subprocess.run(["sync"], timeout=timeout)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{what}\n")
        return True
    except OSError:
        return False


def mount_daemon(args, timeout=CMD_TIMEOUT):
    """Run @args, an `hwfs mount ...` that leaves its daemon behind, with its
    output in a temporary file (the daemon inherits the descriptors: a pipe
    would not reach EOF while it runs).  Raises RuntimeError with the output
    when it fails."""
    args = [str(a) for a in args]
    with tempfile.TemporaryFile("w+") as out:
        rc = subprocess.run(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=timeout).returncode
        out.seek(0)
        text = out.read().strip()
    if rc != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({rc}): {text}")


def stop_node(hwfs, mnt, pid, umount_timeout=60, lazy_timeout=30):
    """Take down the hwfs mount @mnt whose daemon is @pid (None if unknown):
    `hwfs umount`, `fusermount3 -u -z` if it is still mounted after that, then
    @pid gets STOP_GRACE seconds to exit and SIGKILL if it is still an hwfs
    process.  Never raises for a command that fails or times out (it runs in
    teardowns); the mountpoint is left for the caller to remove."""
    try:
        if mounted(mnt):
            run([hwfs, "umount", mnt], check=False, timeout=umount_timeout)
    except subprocess.TimeoutExpired:
        pass
    if mounted(mnt):
        try:
            run(["fusermount3", "-u", "-z", mnt], check=False, timeout=lazy_timeout)
        except subprocess.TimeoutExpired:
            pass
    if not pid:
        return
    end = time.monotonic() + STOP_GRACE
    while pid_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"hwfs" in f.read():     # not a process that took the pid after ours exited
                os.kill(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        pass


def stop_proc(p, grace=STOP_GRACE):
    """SIGTERM Popen @p if it still runs, SIGKILL after @grace seconds; reaps it."""
    if p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)


def read_log(path):
    """The text of the log @path, or "" when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(path, n):
    """The last @n lines of the log @path ("" when it cannot be read)."""
    return "".join(io.StringIO(read_log(path)).readlines()[-n:])


def safetensors_header(tensors, generator):
    """The bytes a safetensors file of @tensors [(name, dtype, shape)], in that
    order, starts with: the 8-byte header length and the JSON header (its
    __metadata__ names @generator) padded to 8 bytes.  Returns (those bytes,
    [each tensor's offset from the start of the data], the data's size)."""
    header, offsets, off = {"__metadata__": {"format": "pt", "generator": generator}}, [], 0
    for name, dt, shape in tensors:
        n = DTYPE_SIZE[dt] * math.prod(shape)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        offsets.append(off)
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    return struct.pack("<Q", len(hj)) + hj, offsets, off


def bf16_bits(f32):
    """The bfloat16 bit patterns (uint16) of the finite float32 numpy array
    @f32, rounded to nearest, ties to even (what torch's .to(torch.bfloat16)
    does), computed on a uint32 view: one uint32 temporary of @f32's size and
    the uint16 result; @f32 is left as it is."""
    import numpy as np

    u = f32.view(np.uint32)
    t = u >> 16
    t &= 1                  # the lowest bit that is kept: ties go to even
    t += 0x7FFF
    t += u                  # no overflow for finite values (<= 0xFF7FFFFF)
    t >>= 16
    return t.astype(np.uint16)


def zstd_size(path, level=1, timeout=CMD_TIMEOUT * 5):
    """(bytes, CPU seconds) of `zstd -LEVEL -c PATH`: the compressed size of
    the file @path, counted as zstd writes it (nothing is kept), and the CPU
    time zstd used.  Raises RuntimeError when zstd fails."""
    t0 = os.times()
    p = subprocess.Popen(["zstd", f"-{level}", "-q", "-c", str(path)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    n = 0
    try:
        while True:
            b = p.stdout.read(1 << 20)
            if not b:
                break
            n += len(b)
        err = p.stderr.read().decode(errors="replace").strip()
        rc = p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
    if rc != 0:
        raise RuntimeError(f"`zstd -{level} -c {path}` failed ({rc}): {err}")
    t1 = os.times()
    return n, (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)


def xxh3_cpu_s_per_gib(nbytes=128 << 20, reps=3):
    """This machine's pace now: the median CPU seconds per GiB of XXH3-128
    (libxxhash, the hash hwfs checks shards with and the codec's rebuild
    computes) over @nbytes of memory, @reps times, on this thread
    (time.thread_time(), as the daemons' codec counters count their
    workers).  The codec's CPU per GiB over this, measured in the same run,
    is what compares runs on a machine whose pace drifts (docs/benchmarks.md,
    "Issue 29, item 3").  None when libxxhash cannot be loaded."""
    import ctypes
    import ctypes.util

    class H128(ctypes.Structure):
        _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
        fn = lib.XXH3_128bits
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = H128, [ctypes.c_void_p, ctypes.c_size_t]
    buf = bytearray(os.urandom(1 << 20)) * max(1, nbytes >> 20)
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    fn(addr, len(buf))  # pages touched before the first timed rep
    per = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn(addr, len(buf))
        per.append((time.thread_time() - t0) / (len(buf) / 2**30))
    return sorted(per)[len(per) // 2]


def machine():
    """Cores, kernel release and memory (GiB) of this machine, for the results."""
    return {"cores": os.cpu_count(), "kernel": platform.release(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def git_describe():
    """`git describe --always --dirty` of the tree, or None."""
    return run(["git", "-C", REPO, "describe", "--always", "--dirty"], check=False).stdout.strip() or None


def interrupt_on_term():
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so that a
    run's finally (its teardown) runs for them too."""
    def on_term(sig, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)


def ignore_interrupts():
    """Ignore Ctrl-C and SIGTERM from here on: a second one must not stop the teardown."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def fmt(v, spec, scale=1):
    """@v * @scale formatted with @spec ("8.2f"), or "-" right-aligned in its width when None."""
    width = int(spec.split(".")[0])
    return f"{'-':>{width}}" if v is None else format(v * scale, spec)


def write_json(res, path):
    """Write @res as indented JSON to @path (its directory made if need be)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------
# commit latency: where a commit's time goes


def commit_breakdown(history, wall_ms):
    """Where the time of the last commits went, from the coordinator's commit
    history (`hwfs status --cluster --json` "commits": the last 20, oldest
    first) and @wall_ms, the wall times the caller measured for the same
    commits, oldest first (their last len(history) are paired with it).

    Per commit (ms): wall; outside = wall - the coordinator's duration (the
    CLI's start, the control socket, the node's agent relaying COMMIT_REQ and
    COMMIT_RES); prepare = request -> the decision (the PREPARE round);
    node_prepare = the slowest node's own checks and engine barrier; record =
    writing the decision (--state, fsync); commit = decision -> the last ACK
    (the COMMIT round); node_flip = the slowest node's own flip and its record.
    Returns {row: {"p50", "p99"}} over the commits that were committed, or {}."""
    hist = [c for c in history if c.get("outcome") == "committed" and c.get("decided_s") is not None]
    pairs = list(zip(wall_ms[-len(history):], history)) if history else []
    rows = {k: [] for k in ("wall", "outside", "prepare", "node_prepare", "record", "commit", "node_flip")}
    for wall, c in pairs:
        if c not in hist:
            continue
        rows["wall"].append(wall)
        rows["outside"].append(wall - c["duration_s"] * 1000)
        rows["prepare"].append(max(c.get("ready_s", {}).values() or [0]) * 1000)
        rows["node_prepare"].append(max(c.get("prepare_us", {}).values() or [0]) / 1000)
        rows["record"].append(c.get("record_s", 0) * 1000)
        rows["commit"].append((max(c.get("ack_s", {}).values() or [0]) - c["decided_s"]) * 1000)
        rows["node_flip"].append(max(c.get("flip_us", {}).values() or [0]) / 1000)
    if not rows["wall"]:
        return {}
    return {k: {"p50": round(sorted(v)[len(v) // 2], 3), "p99": round(pctl(v, 99), 3), "n": len(v)}
            for k, v in rows.items()}


BREAKDOWN_LABELS = (
    ("wall", "the commit as timed (wall)"),
    ("outside", "  outside the coordinator (CLI start, control socket, agent relay)"),
    ("prepare", "  PREPARE round (request -> every READY)"),
    ("node_prepare", "    slowest node's own check + engine barrier"),
    ("record", "  decision recorded (--state: write, fsync, rename)"),
    ("commit", "  COMMIT round (decision -> every ACK)"),
    ("node_flip", "    slowest node's own flip (symlink + rename + applied record)"),
)


def print_commit_breakdown(bd, indent="  "):
    """Print commit_breakdown()'s result as a table (nothing when it is empty)."""
    if not bd:
        return
    print(f"{indent}where the time went, the last {bd['wall']['n']} commits (coordinator's history; ms):")
    for k, label in BREAKDOWN_LABELS:
        r = bd.get(k)
        if r:
            print(f"{indent}  {label:70} p50 {r['p50']:6.2f}  p99 {r['p99']:6.2f}")
