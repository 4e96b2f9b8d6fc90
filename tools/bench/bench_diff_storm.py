#!/usr/bin/env python3
"""bench_diff_storm.py — the daemon under a storm of `hwfs diff --elements`
(issue 16 item 6).

64 parallel element diffs by uid 65534 (setpriv), in WAVES waves over the 12
ordered pairs of 4 versions of one F32 tensor of MIB MiB (2% of it changed
from one version to the next), while root commits in a loop.  Prints how many
diffs answered or were refused as busy, the daemon's peak anonymous memory
(sampled every 10 ms; the arena is shared memory, not counted) and root
commit latency, idle and during the storm.

RAW=1 times each commit over the control socket (the daemon alone) instead of
running `hwfs commit` (a process per commit: on a small machine the storm's
64 processes slow that one down too); SPAWN_ONLY=1 runs `hwfs ls` instead of
the diffs (what the processes alone cost).  Needs root, /dev/fuse and numpy;
mounts under /tmp with its store in /dev/shm and unmounts at the end.

usage: tools/bench/bench_diff_storm.py HWFS_BINARY [WAVES=3] [MIB=32]
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

PARALLEL = 64
NAMES = ["v1", "v2", "v3", "v4"]


class Node:
    """One mount of HWFS_BINARY (store in /dev/shm) and what the bench asks of it."""

    def __init__(self, hwfs):
        self.hwfs = os.path.abspath(hwfs) if "/" in hwfs else hwfs  # the diffs run in /
        self.store = tempfile.mkdtemp(dir="/dev/shm", prefix="storm-")
        self.mnt = tempfile.mkdtemp(prefix="storm-mnt-")
        subprocess.run([hwfs, "mount", self.mnt, "--store", self.store], check=True, umask=0)
        self.pid = json.loads(self.run("status", "--json").stdout)["pid"]

    def run(self, *args):
        return subprocess.run([self.hwfs, *args, "-m", self.mnt], capture_output=True, text=True)

    def commit(self, version):
        """Commit @version as root: over the control socket with RAW=1, else `hwfs commit`."""
        if not os.environ.get("RAW"):
            cp = self.run("commit", version)
            assert cp.returncode == 0, cp.stderr
            return
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(os.getxattr(self.mnt, "user.hwfs.control").decode())
            s.sendall(json.dumps({"op": "commit", "version": version}).encode() + b"\n")
            res = json.loads(s.makefile("rb").readline())
        assert res.get("ok"), res

    def rss_anon(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) << 10
        raise RuntimeError("no RssAnon")

    def close(self):
        subprocess.run([self.hwfs, "umount", self.mnt])
        shutil.rmtree(self.store, ignore_errors=True)
        os.rmdir(self.mnt)


def publish_versions(node, src, mib):
    """NAMES published from @src, each one F32 tensor of @mib MiB, 2% changed each time."""
    rng = np.random.default_rng(1)
    w = rng.integers(0, 1 << 32, (mib << 20) // 4, dtype=np.uint32)
    for name in NAMES:
        w = w.copy()
        w[rng.integers(0, len(w), len(w) // 50)] ^= 1 << 7
        d = os.path.join(src, name)
        os.makedirs(d)
        os.chmod(d, 0o755)
        h = json.dumps({"w": {"dtype": "F32", "shape": [len(w)],
                              "data_offsets": [0, w.nbytes]}}).encode()
        h += b" " * (-len(h) % 8)
        path = os.path.join(d, "m.safetensors")
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h)
            f.write(w.tobytes())
        os.chmod(path, 0o644)
        cp = node.run("publish", d, name)
        assert cp.returncode == 0, cp.stderr


def timed_commits(node, n=None, stop=None):
    """Seconds of each root commit (alternating v2 and v3): @n of them, or until @stop is set."""
    out, k = [], 0
    while (stop is None and k < n) or (stop is not None and not stop.is_set()):
        t0 = time.monotonic()
        node.commit(NAMES[k % 2 + 1])
        out.append(time.monotonic() - t0)
        k += 1
        if stop is not None:
            time.sleep(0.02)
    return out


def wave(node, w):
    """PARALLEL requests at once as uid 65534: (answered, busy, other errors)."""
    pairs = [(a, b) for a in NAMES for b in NAMES if a != b]
    counts = [0, 0, 0]
    procs = []
    for i in range(PARALLEL):
        args = ["ls"] if os.environ.get("SPAWN_ONLY") else \
            ["diff", *pairs[(i + w) % len(pairs)], "--elements", "--json"]
        procs.append(subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534",
                                       "--clear-groups", node.hwfs, *args, "-m", node.mnt],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd="/"))
    for p in procs:
        _, err = p.communicate()
        k = 0 if p.returncode == 0 else 1 if "busy" in err else 2
        counts[k] += 1
        if k == 2:
            print("other error:", err.strip())
    return counts


def ms(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main():
    hwfs = sys.argv[1]
    waves = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    mib = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    src = tempfile.mkdtemp(prefix="storm-src-")
    os.chmod(src, 0o755)
    node = Node(hwfs)
    try:
        publish_versions(node, src, mib)
        node.commit("v1")
        idle = timed_commits(node, n=20)
        base = node.rss_anon()
        peak, stop, busy_lat = [base], threading.Event(), []

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], node.rss_anon())
                time.sleep(0.01)

        threads = [threading.Thread(target=sample),
                   threading.Thread(target=lambda: busy_lat.extend(timed_commits(node, stop=stop)))]
        for t in threads:
            t.start()
        t0, totals = time.monotonic(), [0, 0, 0]
        try:
            for w in range(waves):
                totals = [a + b for a, b in zip(totals, wave(node, w))]
        finally:
            stop.set()
            for t in threads:
                t.join()
        print(f"{hwfs}: {waves}x{PARALLEL} requests, tensors of {mib} MiB, "
              f"{time.monotonic() - t0:.1f} s: {totals[0]} answered, {totals[1]} busy, "
              f"{totals[2]} other")
        print(f"  daemon RssAnon: base {base >> 20} MiB, peak {peak[0] >> 20} MiB "
              f"(+{(peak[0] - base) >> 20} MiB)")
        print(f"  root commit idle: median {ms(idle, .5):.0f} ms, max {ms(idle, 1):.0f} ms")
        print(f"  root commit during the storm ({len(busy_lat)}): median {ms(busy_lat, .5):.0f} "
              f"ms, p90 {ms(busy_lat, .9):.0f} ms, max {ms(busy_lat, 1):.0f} ms")
    finally:
        node.close()
        shutil.rmtree(src, ignore_errors=True)


if __name__ == "__main__":
    main()
