#!/usr/bin/env python3
"""bench.py — single-node hwfs benchmark (`make bench`).

Creates a 2 GiB safetensors file (64 float16 tensors of 32 MiB, deterministic)
on tmpfs, mounts hwfs with its store on /dev/shm and measures, in one run:

  read cold    cat MNT/versions/v1/F > /dev/null right after drop_caches
  read warm    the same again, page cache warm
  cp ingest    cp F MNT/versions/v2/ (open version)  vs  cp F /dev/shm/dir/
               (F is v1's file: every byte is a duplicate, the store keeps
               its staging pages; informational, the target is on "plain cp")
  publish      hwfs publish DIR v1  (informational)   vs  cp -r DIR /dev/shm/dir
  growth       store.used_bytes growth of v3 (10% of tensors changed) / changed bytes

and, beside them, the same three figures the way a plain user takes them
(the "plain" rows, issue 20; docs/benchmarks.md says why they differ):

  plain cold   one file of fresh random bytes (--plain-gib, default 2 GiB, not
               safetensors), copied into an open version and sealed;
               `cat MNT/versions/p/F` right after `echo 3 > drop_caches`
  plain warm   the same again
  plain 128k   `dd bs=128K` of it, cold and warm: 128 KiB reads whatever
               st_blksize says (cat asks stat(2) for its buffer size)
  plain cp     `cp G MNT/versions/q/` of another file of fresh random bytes,
               which the store does not have (removed again after each
               repetition, so every repetition writes new bytes)

and the parallel-reader rows (issue 29, item 4), with fio on one file of fresh
random bytes (--readers-gib, default 2 GiB) copied into a version and sealed,
the page cache dropped (echo 1 > drop_caches) before every run, hwfs and tmpfs:

  readers seq1   one sequential reader, 1 MiB reads (psync)
  readers seq4   4 sequential readers, each its own quarter (TP workers)
  readers rand4  4 random readers, 4 KiB reads (psync)
  readers mmap4  4 random readers, 4 KiB, through mmap (fio's mmap engine)

Read and copy baselines are the same operation on the tmpfs source, timed
right next to each hwfs repetition.  Every timing is repeated (--reps, default
3) and the MEDIAN is reported and judged (best and all samples are in the JSON).  GB/s means 10^9 bytes per second.  Results go to
stdout as a table and to build/bench.json.  The helpers it shares with the
other benchmarks are in tools/bench/benchlib.py.

  python3 tools/bench/bench.py                   full run
  python3 tools/bench/bench.py --baseline-only   tmpfs baselines only (no hwfs needed)
  python3 tools/bench/bench.py --tensors 8       smaller model for a quick check
  python3 tools/bench/bench.py --plain-only      only the plain rows
  python3 tools/bench/bench.py --readers-only    only the parallel-reader rows (needs fio)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (HWFS, REPO, drop_caches, fmt, logger, mount_daemon, mounted, run, safetensors_header,
                      stop_node, write_json)

CMD_TIMEOUT = 600
SEED = 20240601
TARGETS = {  # metric -> (comparison, threshold)
    "read_cold": (">=", 0.60),
    "read_warm": (">=", 0.95),
    "growth": ("<=", 1.02),
    "plain_cold": (">=", 0.60),
    "plain_warm": (">=", 0.95),
    "plain_cp": (">=", 0.50),
    "readers_seq4": (">=", 0.35),
    "readers_rand4": (">=", 0.40),
    "readers_mmap4": (">=", 0.40),
}
PLAIN_ROWS = (("plain_cold", "plain: cat, echo 3 > drop_caches"), ("plain_warm", "plain: cat, warm"),
              ("plain_cold_128k", "plain: dd bs=128K, cold"), ("plain_warm_128k", "plain: dd bs=128K, warm"),
              ("plain_cp", "plain: cp new bytes into open version"))
# fio shapes of the parallel-reader rows: key, label, jobs, arguments ({q}: a quarter of
# the file, {io}: the bytes each random reader reads)
READER_ROWS = (
    ("readers_seq1", "readers: 1 seq, 1 MiB", 1, ["--rw=read", "--bs=1M", "--ioengine=psync"]),
    ("readers_seq4", "readers: 4 seq, 1 MiB, a quarter each", 4,
     ["--rw=read", "--bs=1M", "--ioengine=psync", "--size={q}", "--offset_increment={q}"]),
    ("readers_rand4", "readers: 4 random 4 KiB", 4,
     ["--rw=randread", "--bs=4k", "--ioengine=psync", "--io_size={io}"]),
    ("readers_mmap4", "readers: 4 mmap random 4 KiB", 4,
     ["--rw=randread", "--bs=4k", "--ioengine=mmap", "--io_size={io}"]),
)


log = logger("bench")
DROP = 1                  # what drop_caches drops: the page cache (FUSE pages; tmpfs pages stay)


def timed(args, **kw):
    """Seconds taken by one command (stdout to /dev/null)."""
    args = [str(a) for a in args]
    t0 = time.perf_counter()
    cp = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                        timeout=CMD_TIMEOUT, **kw)
    dt = time.perf_counter() - t0
    if cp.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({cp.returncode}): {cp.stderr.strip()}")
    return dt


def proc_cpu(pid):
    """CPU seconds (user + system) process @pid has used so far, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def write_random(path, nbytes, seed):
    """@nbytes of fresh pseudo-random bytes (no two files alike) into @path."""
    import numpy as np

    rng = np.random.default_rng([SEED, seed, time.time_ns()])
    step = 64 << 20
    with open(path, "wb") as f:
        for pos in range(0, nbytes, step):
            n = min(step, nbytes - pos)
            f.write(rng.integers(0, 1 << 63, size=n // 8, dtype=np.int64).tobytes() + os.urandom(n % 8))


def sync():
    subprocess.run(["sync"], timeout=CMD_TIMEOUT)


def stats(nbytes, secs):
    rates = [nbytes / s / 1e9 for s in secs]
    return {"median_gbps": statistics.median(rates), "best_gbps": max(rates),
            "samples_s": [round(s, 4) for s in secs]}


# --------------------------------------------------------------------------
# model generation (streamed, deterministic)


def tensor_bytes(i, nbytes, variant=0):
    import numpy as np

    rng = np.random.default_rng([SEED, i, variant])
    bits = rng.integers(0, 1 << 16, size=nbytes // 2, dtype=np.uint16)
    return (bits & np.uint16(0xBFFF)).tobytes()  # finite float16 values, |x| < 2


def write_model(path, n, tensor_mib):
    nbytes = int(tensor_mib * (1 << 20)) // 8192 * 8192
    cols = 4096
    rows = nbytes // 2 // cols
    names = [f"model.layers.{i:03d}.weight" for i in range(n)]
    head, offsets, size = safetensors_header([(name, "F16", [rows, cols]) for name in names], "hwfs bench")
    with open(path, "wb") as f:
        f.write(head)
        for i in range(n):
            f.write(tensor_bytes(i, nbytes))
    return {"path": str(path), "bytes": len(head) + size, "tensor_bytes": nbytes, "data_start": len(head),
            "tensors": list(zip(names, offsets))}


def make_changed_copy(model, dst, changed_idx):
    """Copy the model to @dst and rewrite the tensors in @changed_idx in place."""
    shutil.copyfile(model["path"], dst)
    with open(dst, "r+b") as f:
        for i in changed_idx:
            _, off = model["tensors"][i]
            f.seek(model["data_start"] + off)
            f.write(tensor_bytes(i, model["tensor_bytes"], variant=1))
    return len(changed_idx) * model["tensor_bytes"]


# --------------------------------------------------------------------------
# hwfs helpers


class Hwfs:
    def __init__(self, mnt, store, capacity):
        self.mnt, self.store, self.capacity = mnt, store, capacity
        self.pid = None

    def cmd(self, *args, check=True):
        return run([HWFS, *args, "-m", self.mnt], check=check, timeout=CMD_TIMEOUT)

    def status(self):
        return json.loads(self.cmd("status", "--json").stdout)

    def used(self):
        return self.status()["store"]["used_bytes"]

    def mount(self):
        mount_daemon([HWFS, "mount", self.mnt, "--store", self.store, "--capacity", self.capacity])
        self.pid = int(self.status()["pid"])

    def mounted(self):
        return mounted(self.mnt)

    def wait_used(self, pred, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred(self.used()):
                return True
            time.sleep(0.1)
        return False

    def cleanup(self):
        stop_node(HWFS, self.mnt, self.pid, umount_timeout=120, lazy_timeout=60)


# --------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=64, help="number of tensors (default 64)")
    ap.add_argument("--tensor-mib", type=float, default=32, help="MiB per tensor (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per timing (default 3)")
    ap.add_argument("--capacity", default=None, help="hwfs --capacity (default: 3x the model, in GiB)")
    ap.add_argument("--baseline-only", action="store_true", help="measure the tmpfs baselines only")
    ap.add_argument("--json", default=str(REPO / "build" / "bench.json"), help="where to write the results")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--plain-gib", type=float, default=2, help="size of the plain rows' files (default 2)")
    ap.add_argument("--plain-only", action="store_true", help="only the plain rows (the way a user measures)")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain rows")
    ap.add_argument("--readers-gib", type=float, default=2, help="size of the reader rows' file (default 2)")
    ap.add_argument("--readers-io-mib", type=int, default=0,
                    help="MiB each random reader reads (default: a quarter of the file, so the four "
                         "read as many bytes as the file holds, as the sequential ones do)")
    ap.add_argument("--readers-rows", default="seq1,seq4,rand4,mmap4",
                    help="which reader rows (default: all four)")
    ap.add_argument("--readers-only", action="store_true", help="only the parallel-reader rows (fio)")
    ap.add_argument("--no-readers", action="store_true", help="skip the parallel-reader rows")
    a = ap.parse_args()
    if a.plain_only and a.no_plain:
        sys.exit("bench: --plain-only and --no-plain exclude each other")
    if a.readers_only and (a.no_readers or a.plain_only):
        sys.exit("bench: --readers-only excludes --no-readers and --plain-only")
    if a.plain_only or a.readers_only:  # an "only" runs nothing else
        a.no_plain, a.no_readers = a.no_plain or a.readers_only, a.no_readers or a.plain_only
    if not a.no_readers and not shutil.which("fio"):
        sys.exit("bench: fio not found (tools/install/install-deps.sh installs it; or --no-readers)")

    total = int(a.tensors * a.tensor_mib * (1 << 20))
    n_changed = max(1, round(a.tensors / 10))
    plain_bytes = int(a.plain_gib * (1 << 30)) // 4096 * 4096
    readers_bytes = int(a.readers_gib * (1 << 30)) // (4 << 20) * (4 << 20)
    only = a.plain_only or a.readers_only
    # the plain and reader rows each run after the others have given their memory back
    need = max(0 if only else 5 * total + (n_changed * a.tensor_mib * (1 << 20)),
               0 if a.no_plain else 5 * plain_bytes, 0 if a.no_readers else 3 * readers_bytes) + (256 << 20)
    free = shutil.disk_usage("/dev/shm").free
    if free < need:
        sys.exit(f"bench: /dev/shm has {free / 2**30:.1f} GiB free, needs {need / 2**30:.1f} GiB")
    if not a.baseline_only and not os.access(HWFS, os.X_OK):
        sys.exit(f"bench: {HWFS} not found; run make (or use --baseline-only)")
    capacity = a.capacity or f"{max(1, -(-(3 * total + 3 * plain_bytes) // (1 << 30)))}G"

    work = tempfile.mkdtemp(dir="/dev/shm", prefix="hwfs-bench-")
    mnt = tempfile.mkdtemp(prefix="hwfs-bench-mnt-")
    srcdir, src3dir, tmpfs_dst = Path(work, "src"), Path(work, "src-v3"), Path(work, "tmpfs-copy")
    for d in (srcdir, src3dir, tmpfs_dst):
        d.mkdir()
    h = Hwfs(mnt, str(Path(work, "store")), capacity)
    os.mkdir(h.store)
    res = {"model_bytes": total, "plain_bytes": plain_bytes, "readers_bytes": readers_bytes,
           "tensors": a.tensors, "tensor_mib": a.tensor_mib,
           "reps": a.reps,
           "statistic": "median", "gb": "1e9 bytes", "capacity": capacity, "metrics": {}}
    M = res["metrics"]
    try:
        if only:
            if not a.baseline_only:
                h.mount()
            if not a.no_plain:
                plain_rows(a, h, work, plain_bytes, M)
            if not a.no_readers:
                reader_rows(a, h, work, readers_bytes, M)
            return finish(res, a.json)
        log(f"writing {a.tensors} x {a.tensor_mib:g} MiB float16 tensors to {srcdir}")
        t0 = time.perf_counter()
        model = write_model(srcdir / "model.safetensors", a.tensors, a.tensor_mib)
        changed_idx = list(range(0, a.tensors, a.tensors // n_changed))[:n_changed]
        changed = make_changed_copy(model, src3dir / "model.safetensors", changed_idx)
        F, size = model["path"], model["bytes"]
        res["model_bytes"] = size
        log(f"  {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s; v3 changes "
            f"{len(changed_idx)} tensors ({changed / 2**20:.0f} MiB)")

        # Each hwfs repetition is paired with an adjacent repetition of its
        # tmpfs baseline, so drift of the machine hits both sides alike.
        only = a.baseline_only

        def paired(label, base_fn, hwfs_fn):
            bs, hs = [], []
            for _ in range(a.reps):
                bs.append(base_fn())
                if not only:
                    hs.append(hwfs_fn())
            b = stats(size, bs)
            h_ = stats(size, hs) if hs else None
            log(f"{label:12} tmpfs {b['median_gbps']:.2f} GB/s"
                + (f", hwfs {h_['median_gbps']:.2f} GB/s" if h_ else ""))
            return {"hwfs": h_, "baseline": b}

        def tmpfs_read():
            return timed(["cat", F])

        def tmpfs_cp():
            t = timed(["cp", F, tmpfs_dst])
            os.unlink(tmpfs_dst / "model.safetensors")
            sync()
            return t

        def tmpfs_cpr():
            t = timed(["cp", "-r", srcdir, tmpfs_dst / "dir"])
            shutil.rmtree(tmpfs_dst / "dir")
            sync()
            return t

        subprocess.run(["cat", F], stdout=subprocess.DEVNULL, timeout=CMD_TIMEOUT)
        if only:
            M["publish"] = paired("publish", tmpfs_cpr, None)
            M["read_cold"] = paired("read", tmpfs_read, None)
            M["read_warm"] = M["read_cold"]
            M["cp_ingest"] = paired("cp", tmpfs_cp, None)
            M["growth"] = {"hwfs_bytes": None, "changed_bytes": changed, "ratio": None}
            shutil.rmtree(srcdir)
            shutil.rmtree(src3dir)
            if not a.no_plain:
                plain_rows(a, h, work, plain_bytes, M)
            if not a.no_readers:
                reader_rows(a, h, work, readers_bytes, M)
            return finish(res, a.json)

        h.mount()
        log(f"mounted {mnt} (store {h.store}, capacity {capacity})")
        u0 = h.used()
        pubs = iter(range(a.reps))

        def publish():
            r = next(pubs)
            name = "v1" if r == a.reps - 1 else f"pub{r}"
            t = timed([HWFS, "publish", srcdir, name, "-m", mnt])
            if name != "v1":  # give the shards back so the next publish stores them anew
                h.cmd("rm", name)
                if not h.wait_used(lambda u: u <= u0):
                    log(f"warning: used_bytes did not return to {u0} after hwfs rm {name}")
            return t

        M["publish"] = paired("publish", tmpfs_cpr, publish)

        V1F = os.path.join(mnt, "versions", "v1", "model.safetensors")
        dropped = []

        def cold_read():
            dropped.append(drop_caches(DROP, timeout=CMD_TIMEOUT))
            return timed(["cat", V1F])

        M["read_cold"] = paired("read cold", tmpfs_read, cold_read)
        M["read_cold"]["caches_dropped"] = all(dropped)
        if not all(dropped):
            log("warning: could not write /proc/sys/vm/drop_caches; the cold read is not cold")

        subprocess.run(["cat", V1F], stdout=subprocess.DEVNULL, timeout=CMD_TIMEOUT)
        M["read_warm"] = paired("read warm", tmpfs_read, lambda: timed(["cat", V1F]))

        v2 = os.path.join(mnt, "versions", "v2")
        os.mkdir(v2)

        def hwfs_cp():
            t = timed(["cp", F, v2 + "/"])
            os.unlink(os.path.join(v2, "model.safetensors"))
            sync()
            return t

        M["cp_ingest"] = paired("cp ingest", tmpfs_cp, hwfs_cp)

        before = h.used()
        t = timed([HWFS, "publish", src3dir, "v3", "-m", mnt])
        h.wait_used(lambda u: u > before, timeout=5)
        growth = h.used() - before
        M["growth"] = {"hwfs_bytes": growth, "changed_bytes": changed, "ratio": growth / changed,
                       "publish_s": round(t, 4)}
        log(f"growth       {growth / 2**20:.1f} MiB for {changed / 2**20:.1f} MiB changed")
        res["status"] = h.status()["store"]
        if not (a.no_plain and a.no_readers):
            # the model, its copies and versions go first: the plain and reader rows need the memory
            for v in ("v1", "v3"):
                h.cmd("rm", v)
            shutil.rmtree(srcdir)
            shutil.rmtree(src3dir)
            h.wait_used(lambda u: u <= u0, timeout=60)
            if not a.no_plain:
                plain_rows(a, h, work, plain_bytes, M)
            if not a.no_readers:
                reader_rows(a, h, work, readers_bytes, M)
        return finish(res, a.json)
    finally:
        h.cleanup()
        if not h.mounted():
            shutil.rmtree(mnt, ignore_errors=True)
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def plain_rows(a, h, work, nbytes, M):
    """The issue-20 rows: what a user who copies one file of new bytes in and
    reads it back with cat sees (docs/benchmarks.md, "plain rows").  Each hwfs
    repetition is paired with an adjacent tmpfs one; the daemon's CPU seconds
    over the hwfs repetitions are recorded too (CPU s per GiB)."""
    only = a.baseline_only
    pdir, tdst = Path(work, "plain"), Path(work, "plain-tmpfs-copy")
    pdir.mkdir()
    tdst.mkdir()
    R, G = pdir / "read.bin", pdir / "new.bin"
    log(f"plain rows: writing 2 x {nbytes / 2**30:.2f} GiB of fresh random bytes to {pdir}")
    write_random(R, nbytes, 1)
    write_random(G, nbytes, 2)
    gib = nbytes / 2**30

    def paired(key, base_fn, hwfs_fn, hwfs_after=None):
        """@hwfs_after (the clean-up of a repetition) runs outside the daemon's CPU count."""
        bs, hs, cpu = [], [], []
        for _ in range(a.reps):
            bs.append(base_fn())
            if not only:
                c0 = proc_cpu(h.pid)
                hs.append(hwfs_fn())
                c1 = proc_cpu(h.pid)
                if c0 is not None and c1 is not None:
                    cpu.append(c1 - c0)
                if hwfs_after:
                    hwfs_after()
        b = stats(nbytes, bs)
        h_ = stats(nbytes, hs) if hs else None
        if h_ and cpu:
            h_["daemon_cpu_s_per_gib"] = round(statistics.median(cpu) / gib, 3)
        log(f"{key:16} tmpfs {b['median_gbps']:.2f} GB/s"
            + (f", hwfs {h_['median_gbps']:.2f} GB/s" if h_ else ""))
        M[key] = {"hwfs": h_, "baseline": b, "bytes": nbytes}

    def cat(path):
        return timed(["cat", path])

    def dd128(path):
        return timed(["dd", f"if={path}", "of=/dev/null", "bs=128K"])

    def tmpfs_cp():
        t = timed(["cp", G, tdst])
        os.unlink(tdst / G.name)
        sync()
        return t

    subprocess.run(["cat", R, G], stdout=subprocess.DEVNULL, timeout=CMD_TIMEOUT)
    if only:
        for key, fn in (("plain_cold", cat), ("plain_warm", cat), ("plain_cold_128k", dd128),
                        ("plain_warm_128k", dd128)):
            paired(key, lambda fn=fn: fn(R), None)
        paired("plain_cp", tmpfs_cp, None)
        return
    vp = Path(h.mnt, "versions", "plain")
    vq = Path(h.mnt, "versions", "plainq")
    vp.mkdir()
    vq.mkdir()
    subprocess.run(["cp", R, vp], check=True, timeout=CMD_TIMEOUT)
    h.cmd("seal", "plain")
    F = vp / R.name
    dropped = []

    def cold(fn):
        dropped.append(drop_caches(3, timeout=CMD_TIMEOUT))
        return fn(F)

    paired("plain_cold", lambda: cat(R), lambda: cold(cat))
    subprocess.run(["cat", F], stdout=subprocess.DEVNULL, timeout=CMD_TIMEOUT)
    paired("plain_warm", lambda: cat(R), lambda: cat(F))
    paired("plain_cold_128k", lambda: dd128(R), lambda: cold(dd128))
    subprocess.run(["cat", F], stdout=subprocess.DEVNULL, timeout=CMD_TIMEOUT)
    paired("plain_warm_128k", lambda: dd128(R), lambda: dd128(F))
    M["plain_cold"]["caches_dropped"] = all(dropped)
    u0 = h.used()

    def hwfs_cp_clean():
        os.unlink(vq / G.name)  # the store forgets these bytes: the next repetition writes new ones
        sync()
        if not h.wait_used(lambda u: u <= u0):
            log(f"warning: used_bytes did not return to {u0} after removing {vq / G.name}")

    paired("plain_cp", tmpfs_cp, lambda: timed(["cp", G, vq]), hwfs_cp_clean)
    h.cmd("rm", "plain")
    os.unlink(R)
    os.unlink(G)


def fio_gbps(path, nbytes, jobs, args, io_bytes):
    """One fio run of @jobs readers of @path (@nbytes long) with @args: (GB/s over
    the group's run time, seconds).  The caller drops the page cache first; fio
    must not (--invalidate=0): its per-job fadvise would race the other jobs."""
    q = nbytes // 4
    cmd = ["fio", "--output-format=json", "--name=readers", f"--filename={path}", "--readonly",
           "--invalidate=0", f"--size={nbytes}", f"--numjobs={jobs}", "--group_reporting",
           *[x.format(q=q, io=io_bytes) for x in args]]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT)
    if cp.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({cp.returncode}): {cp.stderr.strip()}")
    rd = json.loads(cp.stdout[cp.stdout.index("{"):])["jobs"][0]["read"]
    secs = rd["runtime"] / 1000
    want = jobs * (io_bytes if "--io_size={io}" in args else q if "--size={q}" in args else nbytes)
    if not secs or rd["io_bytes"] < want:
        raise RuntimeError(f"fio read {rd['io_bytes']} bytes in {secs} s: `{' '.join(cmd)}`")
    return rd["io_bytes"] / secs / 1e9, secs


def reader_rows(a, h, work, nbytes, M):
    """The parallel-reader rows (issue 29, item 4; docs/benchmarks.md, "Parallel
    readers"): the fio shapes of READER_ROWS on one sealed file of fresh random
    bytes and on its tmpfs source, each run paired with the other, the page cache
    dropped before every run of either (tmpfs pages stay: they are the file)."""
    only = a.baseline_only
    rdir = Path(work, "readers")
    rdir.mkdir()
    R = rdir / "readers.bin"
    log(f"reader rows: writing {nbytes / 2**30:.2f} GiB of fresh random bytes to {R}")
    write_random(R, nbytes, 3)
    io_bytes = min(nbytes, a.readers_io_mib << 20) if a.readers_io_mib else nbytes // 4
    rows = [r for r in READER_ROWS if r[0].split("_", 1)[1] in a.readers_rows.split(",")]
    F = None
    if not only:
        vr = Path(h.mnt, "versions", "readers")
        vr.mkdir()
        subprocess.run(["cp", R, vr], check=True, timeout=CMD_TIMEOUT)
        h.cmd("seal", "readers")
        F = vr / R.name
    dropped = []

    def one(path, jobs, args):
        dropped.append(drop_caches(1, timeout=CMD_TIMEOUT))
        return fio_gbps(path, nbytes, jobs, args, io_bytes)

    for key, label, jobs, args in rows:
        bs, hs, cpu = [], [], []
        for _ in range(a.reps):
            bs.append(one(R, jobs, args)[0])
            if not only:
                c0 = proc_cpu(h.pid)
                hs.append(one(F, jobs, args)[0])
                c1 = proc_cpu(h.pid)
                if c0 is not None and c1 is not None:
                    cpu.append(c1 - c0)
        b = {"median_gbps": statistics.median(bs), "best_gbps": max(bs), "samples_gbps": bs}
        h_ = {"median_gbps": statistics.median(hs), "best_gbps": max(hs), "samples_gbps": hs} if hs else None
        if h_ and cpu:
            h_["daemon_cpu_s"] = round(statistics.median(cpu), 3)
        log(f"{key:16} tmpfs {b['median_gbps']:.2f} GB/s"
            + (f", hwfs {h_['median_gbps']:.2f} GB/s" if h_ else ""))
        M[key] = {"hwfs": h_, "baseline": b, "bytes": nbytes, "jobs": jobs, "fio": args,
                  "random_io_bytes_per_job": io_bytes, "caches_dropped": all(dropped)}
    if not only:
        h.cmd("rm", "readers")
    os.unlink(R)


def finish(res, json_path):
    M = res["metrics"]
    rows = []
    for key, label in (("read_cold", "read cold (cat after drop_caches)"), ("read_warm", "read warm (cat)"),
                       ("cp_ingest", "cp ingest, bytes v1 has (dedup)"), ("publish", "hwfs publish"),
                       *PLAIN_ROWS, *[(k, l) for k, l, _, _ in READER_ROWS]):
        m = M.get(key)
        if not m:
            continue
        hv = m["hwfs"]["median_gbps"] if m.get("hwfs") else None
        bv = m["baseline"]["median_gbps"]
        ratio = hv / bv if hv is not None else None
        m["ratio"] = ratio
        rows.append((label, hv, bv, ratio, key))
    g = M.get("growth")

    verdicts = {}
    if any(k in M for k in ("read_cold", "cp_ingest", "publish")):
        what = f"{res['model_bytes'] / 2**30:.2f} GiB model, {res['tensors']} tensors"
    elif any(k in M for k, _ in PLAIN_ROWS):
        what = f"plain rows only, {res['plain_bytes'] / 2**30:.2f} GiB file"
    else:
        what = f"reader rows only, {res['readers_bytes'] / 2**30:.2f} GiB file"
    print(f"\nhwfs single-node benchmark: {what}; median of {res['reps']} runs; GB/s = 1e9 B/s\n")
    hdr = f"{'metric':36} {'hwfs GB/s':>10} {'base GB/s':>10} {'ratio':>7} {'target':>8}  result"
    print(hdr)
    print("-" * len(hdr))

    def verdict(key, ratio):
        if key not in TARGETS:
            return "-", "info"
        op, thr = TARGETS[key]
        if ratio is None:
            return f"{op} {thr:g}", "n/a"
        ok = ratio >= thr if op == ">=" else ratio <= thr
        return f"{op} {thr:g}", "PASS" if ok else "MISS"

    for label, hv, bv, ratio, key in rows:
        tgt, v = verdict(key, ratio)
        verdicts[key] = v
        print(f"{label:36} {fmt(hv, '10.2f')} {fmt(bv, '10.2f')} {fmt(ratio, '7.2f')} {tgt:>8}  {v}")
    if g:
        tgt, v = verdict("growth", g["ratio"])
        verdicts["growth"] = v
        hb = None if g["hwfs_bytes"] is None else g["hwfs_bytes"] / 2**20
        print(f"{'store growth, 10% changed (MiB)':36} {fmt(hb, '10.1f')} {g['changed_bytes'] / 2**20:10.1f} "
              f"{fmt(g['ratio'], '7.3f')} {tgt:>8}  {v}")
        print("  (growth row: hwfs = store.used_bytes growth, base = changed tensor bytes, in MiB)")
    if any(k in M for k, _ in PLAIN_ROWS):
        cpu = ", ".join(f"{k.split('_', 1)[1]} {M[k]['hwfs']['daemon_cpu_s_per_gib']}" for k, _ in PLAIN_ROWS
                        if k in M and M[k].get("hwfs") and "daemon_cpu_s_per_gib" in M[k]["hwfs"])
        print(f"  (plain rows: one {res['plain_bytes'] / 2**30:.2f} GiB file of new random bytes; "
              f"daemon CPU s per GiB: {cpu or 'n/a'})")
    if any(k in M for k, _, _, _ in READER_ROWS):
        print(f"  (reader rows: fio on one {res['readers_bytes'] / 2**30:.2f} GiB file of random bytes, "
              "page cache dropped before each run; ratio = hwfs / tmpfs, same run)")
    for k in ("read_cold", "plain_cold", "readers_seq1"):
        if k in M and M[k].get("caches_dropped") is False:
            print(f"  note: drop_caches was not permitted; '{k}' ran with a warm page cache")
    res["verdicts"] = verdicts
    write_json(res, json_path)
    print(f"\nresults written to {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
