#!/usr/bin/env python3
"""bench_metrics.py — how long a node's /metrics scrape takes with many versions.

Mounts a fresh store with --http 127.0.0.1:0, makes N sealed versions (a
directory with one small file each, made through the mount and sealed over
the control socket, so no process is started per version), then times
--scrapes GETs of /metrics and prints the median, p99 and max.  The issue's
bound is < 10 ms with 10 000 versions (docs/operations.md).

    python3 tools/bench/bench_metrics.py [--versions 10000] [--scrapes 200]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HWFS = os.environ.get("HWFS_BIN") or os.path.join(REPO, "build", "hwfs")


def call(ctl, req):
    """One control request over the daemon's socket: the reply (a dict)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(ctl)
        s.sendall((json.dumps(req) + "\n").encode())
        buf = b""
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    return json.loads(buf.split(b"\n", 1)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", type=int, default=10000)
    ap.add_argument("--scrapes", type=int, default=200)
    a = ap.parse_args()
    top = tempfile.mkdtemp(dir="/dev/shm", prefix="hwfs-bench-metrics-")
    mnt = tempfile.mkdtemp(prefix="hwfs-bench-mnt-")
    subprocess.run([HWFS, "mount", mnt, "--store", top, "--capacity", "1G", "--http",
                    "127.0.0.1:0"], check=True)
    try:
        st = json.loads(subprocess.run([HWFS, "status", "--json", "-m", mnt], check=True,
                                       capture_output=True, text=True).stdout)
        addr = st["http"]
        ctl = os.getxattr(mnt, "user.hwfs.control").decode()
        t0 = time.monotonic()
        for i in range(a.versions):
            v = f"v{i:05d}"
            os.mkdir(os.path.join(mnt, "versions", v))
            with open(os.path.join(mnt, "versions", v, "f.bin"), "wb") as f:
                f.write(i.to_bytes(8, "little") * 16)
            r = call(ctl, {"op": "seal", "version": v})
            if not r.get("ok"):
                sys.exit(f"seal {v}: {r}")
        made = time.monotonic() - t0
        url = f"http://{addr}/metrics"
        times = []
        for _ in range(a.scrapes):
            t = time.perf_counter()
            with urllib.request.urlopen(url) as resp:
                body = resp.read()
            times.append((time.perf_counter() - t) * 1000)
        assert f"hwfs_versions {a.versions}".encode() in body, body[:400]
        times.sort()
        print(f"{a.versions} versions (made in {made:.1f} s); {a.scrapes} scrapes of "
              f"{len(body)} bytes: median {statistics.median(times):.2f} ms, "
              f"p99 {times[int(len(times) * 0.99) - 1]:.2f} ms, max {times[-1]:.2f} ms")
    finally:
        subprocess.run([HWFS, "umount", mnt])
        os.rmdir(mnt)
        subprocess.run(["rm", "-rf", top])


if __name__ == "__main__":
    main()
