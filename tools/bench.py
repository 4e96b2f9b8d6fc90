#!/usr/bin/env python3
"""bench.py — single-node hwfs benchmark (`make bench`).

Creates a 2 GiB safetensors file (64 float16 tensors of 32 MiB, deterministic)
on tmpfs, mounts hwfs with its store on /dev/shm and measures, in one run:

  read cold    cat MNT/versions/v1/F > /dev/null right after drop_caches
  read warm    the same again, page cache warm
  cp ingest    cp F MNT/versions/v2/ (open version)  vs  cp F /dev/shm/dir/
  publish      hwfs publish DIR v1  (informational)   vs  cp -r DIR /dev/shm/dir
  growth       store.used_bytes growth of v3 (10% of tensors changed) / changed bytes

Read and copy baselines are the same operation on the tmpfs source, timed
right next to each hwfs repetition.  Every timing is repeated (--reps, default
3) and the MEDIAN is reported and judged (best and all samples are in the JSON).  GB/s means 10^9 bytes per second.  Results go to
stdout as a table and to build/bench.json.  The helpers it shares with the
other benchmarks are in tools/benchlib.py.

  python3 tools/bench.py                   full run
  python3 tools/bench.py --baseline-only   tmpfs baselines only (no hwfs needed)
  python3 tools/bench.py --tensors 8       smaller model for a quick check
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
    "cp_ingest": (">=", 0.50),
    "growth": ("<=", 1.02),
}


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
    a = ap.parse_args()

    total = int(a.tensors * a.tensor_mib * (1 << 20))
    n_changed = max(1, round(a.tensors / 10))
    need = 5 * total + (n_changed * a.tensor_mib * (1 << 20)) + (256 << 20)
    free = shutil.disk_usage("/dev/shm").free
    if free < need:
        sys.exit(f"bench: /dev/shm has {free / 2**30:.1f} GiB free, needs {need / 2**30:.1f} GiB")
    if not a.baseline_only and not os.access(HWFS, os.X_OK):
        sys.exit(f"bench: {HWFS} not found; run make (or use --baseline-only)")
    capacity = a.capacity or f"{max(1, -(-3 * total // (1 << 30)))}G"

    work = tempfile.mkdtemp(dir="/dev/shm", prefix="hwfs-bench-")
    mnt = tempfile.mkdtemp(prefix="hwfs-bench-mnt-")
    srcdir, src3dir, tmpfs_dst = Path(work, "src"), Path(work, "src-v3"), Path(work, "tmpfs-copy")
    for d in (srcdir, src3dir, tmpfs_dst):
        d.mkdir()
    h = Hwfs(mnt, str(Path(work, "store")), capacity)
    os.mkdir(h.store)
    res = {"model_bytes": total, "tensors": a.tensors, "tensor_mib": a.tensor_mib, "reps": a.reps,
           "statistic": "median", "gb": "1e9 bytes", "capacity": capacity, "metrics": {}}
    M = res["metrics"]
    try:
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
        return finish(res, a.json)
    finally:
        h.cleanup()
        if not h.mounted():
            shutil.rmtree(mnt, ignore_errors=True)
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def finish(res, json_path):
    M = res["metrics"]
    rows = []
    for key, label in (("read_cold", "read cold (cat after drop_caches)"), ("read_warm", "read warm (cat)"),
                       ("cp_ingest", "cp ingest into open version"), ("publish", "hwfs publish")):
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
    print(f"\nhwfs single-node benchmark: {res['model_bytes'] / 2**30:.2f} GiB model, "
          f"{res['tensors']} tensors; median of {res['reps']} runs; GB/s = 1e9 B/s\n")
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
    if "read_cold" in M and M["read_cold"].get("caches_dropped") is False:
        print("  note: drop_caches was not permitted; 'read cold' ran with a warm page cache")
    res["verdicts"] = verdicts
    write_json(res, json_path)
    print(f"\nresults written to {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
