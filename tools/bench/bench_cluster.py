#!/usr/bin/env python3
"""bench_cluster.py — multi-node replication benchmark (`make bench-cluster`).

Builds a small cluster on this one machine out of network namespaces: one per
node (the publisher "pub" and up to 6 receivers r1..r6), one for the
coordinator, and a "hub" namespace holding a Linux bridge.  Every namespace is
joined to the bridge by a veth pair whose two ends are both capped with

    tc qdisc add dev IF root tbf rate 1gbit burst 1mb latency 10ms

so every node has a 1 Gbit/s link in each direction (--rate changes it; the
addresses, 10.201.7.0/24, exist only inside these namespaces; nothing leaves
them).  Daemons run with `nsenter --net=/run/netns/NS hwfs mount ... --join
...` (nsenter keeps the host's mount namespace, so the FUSE mounts are
visible here), stores on /dev/shm, mounted with --preallocate (the arena's
pages are allocated when the node mounts, as on a serving node, not while a
version arrives; --no-preallocate measures the other way).

Measured, each on a fresh cluster (fresh stores, so no shard is deduplicated):

  hwfs chain / tree:2 / star   a 1 GiB safetensors version (32 random float16
                               tensors of 32 MiB) published on pub with
                               `hwfs publish`, replicated to N = 2, 4, 6
                               receivers; seconds from the end of the publish
                               until MNT/versions/V exists on every receiver
                               (polled every 20 ms).
  rsync                        the way it is done today: `rsync --daemon` on pub
                               exporting the source directory, `rsync -a` on
                               every receiver in parallel; seconds until all end.
  commit latency               4 nodes (pub + 3 receivers, chain), two sealed
                               1 MiB versions everywhere, `hwfs commit` of the
                               two alternately 50 times on one node (wall time
                               of the command), p50 / p99 (target p99 <= 6 ms),
                               and where the time of the last 20 went (the
                               coordinator's commit history: PREPARE round,
                               decision record, COMMIT round, each node's own
                               check and flip, the rest outside the coordinator).
  rl (issue 9)                 an RL update: a 1 GiB bf16 version v1 (29
                               tensors of 16-64 MiB, llama-like shapes, two
                               files) and v2 = v1 with ~2% of the bf16 values
                               changed in every tensor (a float32 master w,
                               v1 = bf16(w), v2 = bf16(w + step), rounded to
                               nearest even; the step's scale calibrated so
                               that --rl-changed of the values change).  Chain
                               to N receivers that all hold v1 (replicated
                               first, untimed); v2 published on pub and timed
                               as above, with deltas on and with `-o delta=0`
                               on every daemon.  Also: wire bytes per receiver
                               (status replication.wire_bytes_received), the
                               zstd -1 size of XOR(v1, v2) as the reference,
                               encode/decode CPU s per GiB (status
                               replication.delta) beside the same run's
                               XXH3-128 CPU s per GiB (the machine's pace)
                               and their ratios to it; "n/a" where the daemon
                               does not report them.  Targets (issue 20): N=4 <=
                               0.25x S/B, N=6 <= 0.3x S/B, encode <= 0.5 and
                               decode <= 0.4 CPU s per GiB, wire <= 1.3x zstd.
                               Under each row: `hwfs sim`'s prediction, with
                               the model of the pipeline the daemon has (its
                               status reports delta.forwarded: codec workers,
                               encode ahead, cut-through deltas; else the
                               store-and-forward model) and the row's own
                               encode/decode rates and delta ratio.

Every time is also given as a ratio to S/B (size over link rate, 1 Gbit =
1e9 bit): 1 GiB / 1 Gbit/s = 8.59 s.  Target: chain <= 1.15x S/B and flat in
N; star and rsync are expected to grow with N (the publisher's link carries
every copy).  Results go to stdout as a table and to build/bench-cluster.json.

Everything runs on this machine's cores: with 2 cores, moving several GB/s
through veths, hashing and writing into tmpfs may make the CPU the
bottleneck rather than the links; the table shows CPU-busy % and the daemons'
CPU seconds for that reason.  Under it, per chain row: CPU seconds per GiB by
role (issue 29), from each daemon's own thread clocks (status
replication.cpu: agent thread, ZeroMQ I/O threads, codec workers), the
publisher's per GiB sent, a relay's and a leaf's per GiB received, beside the
raw TCP stream's sender + receiver CPU per GiB, and the row's speed as a
fraction of that raw stream (link check, same run).

Everything this script creates (namespaces, veths, bridge, mounts, processes,
temp dirs) carries the script's pid in its name and is torn down in a finally
block, also on Ctrl-C or SIGTERM.  Needs root, iproute2, rsync, fuse3, numpy.
The helpers it shares with the other benchmarks are in tools/bench/benchlib.py.

  python3 tools/bench/bench_cluster.py              full run (several minutes)
  python3 tools/bench/bench_cluster.py --quick      N = 2, 4 and 256 MiB (development)
  python3 tools/bench/bench_cluster.py --reps 3     repeat every (method, N); median reported
  python3 tools/bench/bench_cluster.py --scenario rl          only the RL update (--quick: 256 MiB, N = 2, 4)
  python3 tools/bench/bench_cluster.py --scenario replication only the methods and the commit latency
"""

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import (CMD_TIMEOUT, HWFS, REPO, bf16_bits, commit_breakdown, fmt, git_describe, ignore_interrupts,
                      interrupt_on_term, logger, machine, mount_daemon, mounted, pctl, print_commit_breakdown,
                      read_log, run, safetensors_header, stop_node, stop_proc, tail, write_json, xxh3_cpu_s_per_gib,
                      zstd_size)

import sim_model  # noqa: E402  `hwfs sim`'s prediction of each row (docs/sim.md)

SEED = 20240607
SUBNET = "10.201.7"          # /24 that exists only inside this script's namespaces
COORD_IP = f"{SUBNET}.2"
COORD_PORT = 7000
NODE_PORT = 7100
RSYNC_PORT = 8873
POLL_S = 0.020
RATE = "1gbit"
CHAIN_TARGET = 1.15
TARGET_COMMIT_P99_MS = 6.0   # issue 20: 4 nodes, no engine
METHODS = ("chain", "tree:2", "star", "rsync")
SCENARIOS = ("all", "replication", "rl")

PID = os.getpid()
TAG = f"hwfsb{PID}"          # every name this run creates starts with it


log = logger("bench-cluster")


def rate_bps(rate):
    """'2gbit' -> 2e9 (tc units: k/m/g are powers of 1000)."""
    r = rate.lower()
    for suf, mul in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1)):
        if r.endswith(suf):
            return float(r[: -len(suf)]) * mul
    raise ValueError(f"rate {rate!r}: use e.g. 2gbit or 500mbit")


def proc_cpu_s(pid):
    """(utime, stime) of @pid in seconds, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tck, int(fields[12]) / tck
    except (OSError, IndexError, ValueError):
        return None


def proc_minflt(pid):
    """Minor page faults of @pid (every first touch of a fresh 4 KiB page), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return None


def machine_cpu():
    """(busy, total) jiffies of all cores from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])
    return total - idle, total


def kill_group(p):
    """SIGKILL the process group led by Popen @p (started with start_new_session) and reap @p."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# --------------------------------------------------------------------------
# the model: N random float16 tensors in one safetensors file, written once


def write_model(path, n, tensor_mib, seed):
    import numpy as np

    nbytes = int(tensor_mib * (1 << 20)) // 8192 * 8192
    cols = 4096
    rows = nbytes // 2 // cols
    head, _, size = safetensors_header([(f"model.layers.{i:03d}.weight", "F16", [rows, cols]) for i in range(n)],
                                       "hwfs bench-cluster")
    with open(path, "wb") as f:
        f.write(head)
        for i in range(n):
            rng = np.random.default_rng([seed, i])
            bits = rng.integers(0, 1 << 16, size=nbytes // 2, dtype=np.uint16)
            f.write((bits & np.uint16(0xBFFF)).tobytes())  # finite float16 values
    return len(head) + size


# --------------------------------------------------------------------------
# network: namespaces, bridge, capped veths


class Net:
    """One namespace per member plus a hub with a bridge; every link capped
    both ways.  Everything is named after TAG and removed by teardown()."""

    def __init__(self, rate):
        self.rate = rate
        self.hub = f"{TAG}-hub"
        self.members = {}   # name -> (netns, ip)
        self.created = []   # namespaces created, for teardown
        self.devs = []      # (netns, dev, label) of every capped link end

    def ns_path(self, name):
        return f"/run/netns/{self.members[name][0]}"

    def ip(self, name):
        return self.members[name][1]

    def nsenter(self, name):
        return ["nsenter", f"--net={self.ns_path(name)}"]

    def _add_ns(self, ns):
        run(["ip", "netns", "add", ns])
        self.created.append(ns)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def setup(self, members):
        """@members: [(name, host byte of the address)]."""
        self._add_ns(self.hub)
        run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        for i, (name, host) in enumerate(members):
            ns, ip = f"{TAG}-{name}", f"{SUBNET}.{host}"
            self._add_ns(ns)
            self.members[name] = (ns, ip)
            inner, outer = f"hb{PID}n{i}", f"hb{PID}h{i}"   # <= 15 characters
            # Created straight in the namespaces: never present in the host's.
            run(["ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer,
                 "netns", self.hub])
            run(["ip", "-n", self.hub, "link", "set", outer, "master", "br0"])
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inner])
            self.devs += [(ns, inner, f"{name} out"), (self.hub, outer, f"{name} in")]
            for n_, dev in ((ns, inner), (self.hub, outer)):
                run(["tc", "-n", n_, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                     "burst", "1mb", "latency", "10ms"])
                run(["ip", "-n", n_, "link", "set", dev, "up"])
        # wait for the bridge ports to forward (no STP: immediate, but be sure)
        end = time.monotonic() + 10
        last = None
        for name in self.members:
            if name == members[0][0]:
                continue
            while True:
                last = run(self.nsenter(members[0][0]) + ["ping", "-c", "1", "-W", "1", self.ip(name)],
                           check=False) if shutil.which("ping") else None
                if last is None or last.returncode == 0 or time.monotonic() > end:
                    break
                time.sleep(0.1)

    def qdisc_stats(self):
        """label -> {bytes, packets, drops, overlimits} of every link's tbf."""
        out = {}
        for ns, dev, label in self.devs:
            cp = run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev], check=False, timeout=30)
            try:
                q = next(x for x in json.loads(cp.stdout) if x.get("kind") == "tbf")
                out[label] = {k: int(q.get(k, 0)) for k in ("bytes", "packets", "drops", "overlimits")}
            except (ValueError, StopIteration):
                pass
        return out

    def pids(self):
        """Pids of the processes living in our namespaces (all started by us)."""
        out = set()
        for ns in self.created:
            cp = run(["ip", "netns", "pids", ns], check=False, timeout=30)
            out.update(int(p) for p in cp.stdout.split() if p.isdigit())
        return out

    def teardown(self):
        for ns in reversed(self.created):
            run(["ip", "netns", "del", ns], check=False, timeout=30)
        self.created = []


# --------------------------------------------------------------------------
# hwfs cluster


class Node:
    def __init__(self, net, name, root, mntroot, capacity, preallocate=True):
        self.net, self.name, self.capacity = net, name, capacity
        self.preallocate = preallocate
        self.mnt = os.path.join(mntroot, name)
        os.makedirs(self.mnt, exist_ok=True)
        self.root = root
        self.store = None
        self.pid = None
        self.opts = []          # tunables NAME=VALUE given to the daemon with -o at the next mount
        self.url = f"tcp://{net.ip(name)}:{NODE_PORT}"

    def cmd(self, *args, check=True, timeout=CMD_TIMEOUT):
        return run([HWFS, *args, "-m", self.mnt], check=check, timeout=timeout)

    def status(self):
        return json.loads(self.cmd("status", "--json").stdout)

    def mount(self, run_dir, coord_url):
        self.store = os.path.join(run_dir, f"store-{self.name}")
        os.makedirs(self.store)
        args = self.net.nsenter(self.name) + [
            HWFS, "mount", self.mnt, "--store", self.store, "--capacity", self.capacity,
            "--join", coord_url, "--node", self.name, "--listen", self.url, "--insecure"] + (
            ["--preallocate"] if self.preallocate else []) + (["-o", ",".join(self.opts)] if self.opts else [])
        try:
            mount_daemon(args)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{self.log_tail()}") from None
        self.pid = int(self.status()["pid"])

    def log_tail(self, n=20):
        return tail(os.path.join(self.store or "", "hwfs.log"), n)

    def log_text(self):
        return read_log(os.path.join(self.store or "", "hwfs.log"))

    def has(self, version):
        return os.path.exists(os.path.join(self.mnt, "versions", version))

    def umount(self):
        """Unmount; kill the daemon (by its pid, ours) if it does not go."""
        stop_node(HWFS, self.mnt, self.pid)
        self.pid = None


class Cluster:
    """A coordinator and the named nodes, all fresh (new stores)."""

    def __init__(self, net, nodes, topology, run_dir, procs):
        self.net, self.nodes, self.topology, self.dir = net, nodes, topology, run_dir
        self.coord = None
        self.procs = procs          # every Popen this script started (teardown kills them)
        self.coord_url = f"tcp://{COORD_IP}:{COORD_PORT}"

    def start(self):
        os.makedirs(self.dir)
        args = self.net.nsenter("coord") + [HWFS, "coord", "--listen", self.coord_url,
                                            "--topology", self.topology, "--insecure", "-f"]
        self.coord_log = open(os.path.join(self.dir, "coord.log"), "ab")
        self.coord = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.coord_log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(self.coord)
        for n in self.nodes:   # join order = chain/tree order: pub first
            n.mount(self.dir, self.coord_url)
        self.wait_members()

    def wait_members(self, timeout=30):
        want = {n.name for n in self.nodes}
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            if self.coord.poll() is not None:
                raise RuntimeError(f"the coordinator exited ({self.coord.returncode}): {self.coord_tail()}")
            cp = self.nodes[0].cmd("status", "--cluster", "--json", check=False, timeout=10)
            if cp.returncode == 0:
                try:
                    last = json.loads(cp.stdout)
                    if {x.get("name") for x in last.get("nodes", []) if x.get("alive")} >= want:
                        return
                except ValueError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not form within {timeout}s; last: {last}\n{self.coord_tail()}")

    def coord_tail(self, n=20):
        return tail(os.path.join(self.dir, "coord.log"), n)

    def events(self):
        """Warnings and errors the coordinator and the nodes logged in this run."""
        out = []
        for who, text in [("coord", self.coord_tail(10 ** 6))] + [(n.name, n.log_text()) for n in self.nodes]:
            out += [f"{who}: {l.strip()}" for l in text.splitlines() if "[warn]" in l or "[error]" in l]
        return out

    def stop(self):
        for n in reversed(self.nodes):
            try:
                n.umount()
            except Exception as e:  # keep going: teardown must reach the end
                log(f"warning: unmounting {n.name}: {e}")
        if self.coord is not None:
            stop_proc(self.coord)
            self.coord_log.close()
            self.coord = None
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------
# measurements


def cpu_snapshot(pids):
    return {k: proc_cpu_s(p) for k, p in pids.items()}


def cpu_delta(a, b):
    """name -> [user s, system s] spent between snapshots @a and @b."""
    return {k: ([round(b[k][0] - a[k][0], 2), round(b[k][1] - a[k][1], 2)]
                if a.get(k) is not None and b.get(k) is not None else None) for k in a}


def qdisc_delta(a, b):
    """Per link end: bytes, drops, overlimits between two qdisc_stats(); plus totals."""
    per = {k: {f: b[k][f] - a[k][f] for f in b[k]} for k in b if k in a}
    per = {k: v for k, v in per.items() if v["bytes"] > 0}
    tot = {f: sum(v[f] for v in per.values()) for f in ("bytes", "packets", "drops", "overlimits")}
    return {"total": tot, "links": per}


def wait_arrivals(ctx, recv, version, t_start):
    """Poll every POLL_S until MNT/versions/@version exists on every node of
    @recv, at most ctx["timeout"] seconds from @t_start (monotonic).  Returns
    (name -> monotonic time it was seen, None) or (those seen, why it failed):
    the timeout, or every node still waiting logged "giving up on V" and
    nothing arrived for 10 s."""
    arrival = {}
    pending = {x.name: x for x in recv}
    deadline = t_start + ctx["timeout"]
    failed, gave_up_since, next_log_check = None, None, t_start + 0.5
    while pending:
        now = time.monotonic()
        for name, x in list(pending.items()):
            if x.has(version):
                arrival[name] = time.monotonic()
                del pending[name]
                gave_up_since = None
        if not pending:
            break
        if now > deadline:
            failed = f"did not reach {','.join(sorted(pending))} within {ctx['timeout']:g} s"
            break
        if now >= next_log_check:   # a puller that gave up never finishes: do not wait 120 s for it
            next_log_check = now + 0.5
            if all(f"giving up on {version}" in x.log_text() for x in pending.values()):
                gave_up_since = gave_up_since or now
                if now - gave_up_since > 10:
                    failed = (f"{','.join(sorted(pending))} gave up (\"giving up on {version}\" in their "
                              f"logs) and nothing arrived for 10 s")
                    break
        time.sleep(POLL_S)
    return arrival, failed


def io_threads_of(reps):
    """The most ZeroMQ I/O threads any node ran with (status replication.io_threads,
    tunable zmq_io_threads; a daemon that does not report it ran ZeroMQ's default, 1),
    from @reps: node name -> its status "replication" object."""
    return max([int(r.get("io_threads") or 1) for r in reps.values()] or [1])


CPU_KEYS = ("agent_s", "io_s", "codec_s", "receive_s", "forward_s", "serve_s")


def role_cpu(pub, recv, before, after):
    """Per node of a run: its role (publisher: @pub; relay: a receiver that
    sent shard bytes on; leaf: one that did not), the growth of its status
    replication.cpu seconds (the daemon's own thread clocks: agent thread,
    ZeroMQ I/O threads, codec workers, and of the agent thread's receiving,
    forwarding, serving) and shard bytes received and sent, from @before and
    @after (node name -> status "replication"), and "cpu_s_per_gib": every
    replication thread's seconds per GiB sent (publisher) or received (relay,
    leaf).  {} where the daemon does not report replication.cpu."""
    out = {}
    for x in [pub] + list(recv):
        b, a = before.get(x.name) or {}, after.get(x.name) or {}
        if "cpu" not in a or "cpu" not in b:
            return {}
        cpu = {k: round(a["cpu"].get(k, 0) - b["cpu"].get(k, 0), 3) for k in CPU_KEYS}
        rx = a.get("bytes_received", 0) - b.get("bytes_received", 0)
        tx = a.get("bytes_sent", 0) - b.get("bytes_sent", 0)
        role = "publisher" if x is pub else ("relay" if tx > 0 else "leaf")
        per = (rx if role != "publisher" else tx) / 2**30
        threads = cpu["agent_s"] + cpu["io_s"] + cpu["codec_s"]
        out[x.name] = {"role": role, "cpu_s": cpu, "bytes_received": rx, "bytes_sent": tx,
                       "cpu_s_per_gib": round(threads / per, 3) if per > 0 else None}
    return out


def roles_summary(runs):
    """Role -> median over @runs (and over the nodes of that role) of its
    cpu_s_per_gib and of each thread's seconds per GiB (agent, io, codec)."""
    acc = {}
    for r in runs:
        for node in (r.get("roles") or {}).values():
            if node["cpu_s_per_gib"] is None:
                continue
            per = (node["bytes_sent"] if node["role"] == "publisher" else node["bytes_received"]) / 2**30
            d = acc.setdefault(node["role"], {"all": [], "agent": [], "io": [], "codec": []})
            d["all"].append(node["cpu_s_per_gib"])
            for k in ("agent", "io", "codec"):
                d[k].append(node["cpu_s"][k + "_s"] / per)
    return {role: {k: round(statistics.median(v), 3) for k, v in d.items()} for role, d in acc.items()}


def check_sealed(pub, recv, version):
    """Check that every node of @recv holds @version sealed with the digest it
    has on @pub.  Returns (that digest, node name -> its status "replication"
    object, @pub's included); raises RuntimeError naming the first node that
    does not."""
    digest = next(v["digest"] for v in pub.status()["versions"] if v["name"] == version)
    rx = {}
    for x in recv:
        st = x.status()
        v = next((v for v in st["versions"] if v["name"] == version), None)
        if not v or v["state"] != "sealed" or v["digest"] != digest:
            raise RuntimeError(f"{version} on {x.name}: {v} (publisher's digest {digest})")
        rx[x.name] = st.get("replication", {})
    rx[pub.name] = pub.status().get("replication", {})
    return digest, rx


def replicate_once(ctx, topology, n, rep):
    """Fresh cluster pub + r1..rN with @topology; publish; wait for every receiver."""
    net, work = ctx["net"], ctx["work"]
    nodes = [ctx["nodes"]["pub"]] + [ctx["nodes"][f"r{i}"] for i in range(1, n + 1)]
    run_dir = os.path.join(work, f"run-{topology.replace(':', '')}-n{n}-{rep}")
    cl = Cluster(net, nodes, topology, run_dir, ctx["procs"])
    version = f"v-{topology.replace(':', '')}-n{n}-r{rep}"
    try:
        cl.start()
        pub, recv = nodes[0], nodes[1:]
        pids = {x.name: x.pid for x in nodes}
        pids["coord"] = cl.coord.pid
        rc0 = {x.name: x.status().get("replication", {}) for x in nodes}
        c0, qd0 = cpu_snapshot(pids), net.qdisc_stats()
        t0 = time.monotonic()
        pub.cmd("publish", ctx["srcdir"], version, timeout=600)
        t_pub = time.monotonic()
        c1, m1 = cpu_snapshot(pids), machine_cpu()
        f1 = {k: proc_minflt(p) for k, p in pids.items()}
        arrival, failed = wait_arrivals(ctx, recv, version, t_pub)
        events = cl.events()
        qd1 = net.qdisc_stats()
        if failed:
            log(f"  FAILED: {version} {failed}; arrived: {sorted(arrival)}")
            for e in events[-30:]:
                log(f"    {e}")
            return {"failed": failed, "replication_s": None, "total_s": None, "publish_s": t_pub - t0,
                    "arrival_s": {k: round(v - t_pub, 3) for k, v in sorted(arrival.items())},
                    "tbf": qdisc_delta(qd0, qd1), "events": events}
        end = max(arrival.values())
        c2, m2 = cpu_snapshot(pids), machine_cpu()
        f2 = {k: proc_minflt(p) for k, p in pids.items()}
        digest, rx = check_sealed(pub, recv, version)
        busy = (m2[0] - m1[0]) / max(1, m2[1] - m1[1])
        return {
            "replication_s": end - t_pub, "total_s": end - t0, "publish_s": t_pub - t0,
            "arrival_s": {k: round(v - t_pub, 3) for k, v in sorted(arrival.items())},
            "cpu_s_replication": cpu_delta(c1, c2), "cpu_s_publish": cpu_delta(c0, c1),
            "roles": role_cpu(pub, recv, rc0, rx),
            "machine_busy": round(busy, 3), "replication_counters": rx, "digest": digest,
            "tbf": qdisc_delta(qd0, qd1), "events": events,
            "minflt_replication": {k: (f2[k] - f1[k] if f1.get(k) is not None and f2.get(k) is not None else None)
                                   for k in f1},
        }
    finally:
        cl.stop()


def rsync_once(ctx, n, rep):
    net, work, procs = ctx["net"], ctx["work"], ctx["procs"]
    pub_ip = net.ip("pub")
    d = os.path.join(work, f"rsync-n{n}-{rep}")
    os.makedirs(d)
    conf = os.path.join(d, "rsyncd.conf")
    with open(conf, "w") as f:
        f.write(f"uid = root\ngid = root\nuse chroot = no\nmax connections = 0\n"
                f"log file = {d}/rsyncd.log\n"
                f"[mod]\n  path = {ctx['srcdir']}\n  read only = yes\n")
    daemon = subprocess.Popen(net.nsenter("pub") + ["rsync", "--daemon", "--no-detach", f"--config={conf}",
                                                    f"--address={pub_ip}", f"--port={RSYNC_PORT}"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    procs.append(daemon)
    clients = []
    try:
        end = time.monotonic() + 10
        while True:  # ready once it lists its module (asked from r1's namespace)
            cp = run(net.nsenter("r1") + ["rsync", f"rsync://{pub_ip}:{RSYNC_PORT}/"], check=False, timeout=10)
            if cp.returncode == 0 and "mod" in cp.stdout:
                break
            if daemon.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"rsync daemon did not start: {cp.stderr.strip()}")
            time.sleep(0.1)
        dests = []
        for i in range(1, n + 1):
            dst = os.path.join(d, f"r{i}")
            os.makedirs(dst)
            dests.append(dst)
        ru0, m0 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu()
        t0 = time.monotonic()
        for i, dst in enumerate(dests, 1):
            p = subprocess.Popen(net.nsenter(f"r{i}") + ["rsync", "-a", f"rsync://{pub_ip}:{RSYNC_PORT}/mod/",
                                                         dst + "/"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)
            procs.append(p)
            clients.append((f"r{i}", p))
        arrival = {}
        deadline = t0 + ctx["timeout"]
        while len(arrival) < n:
            for name, p in clients:
                if name not in arrival and p.poll() is not None:
                    arrival[name] = time.monotonic()
                    if p.returncode != 0:
                        raise RuntimeError(f"rsync to {name} failed ({p.returncode}): {p.stderr.read().decode()}")
            if len(arrival) < n and time.monotonic() > deadline:
                raise RuntimeError(f"rsync did not finish within {ctx['timeout']}s")
            time.sleep(POLL_S)
        t_end = max(arrival.values())
        m1 = machine_cpu()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        clients_cpu = [round(ru1.ru_utime - ru0.ru_utime, 2), round(ru1.ru_stime - ru0.ru_stime, 2)]
        for dst in dests:
            got = os.path.getsize(os.path.join(dst, "model.safetensors"))
            if got != ctx["size"]:
                raise RuntimeError(f"rsync wrote {got} bytes to {dst}, expected {ctx['size']}")
        daemon.terminate()
        daemon.wait(timeout=10)
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = [round(ru2.ru_utime - ru1.ru_utime, 2), round(ru2.ru_stime - ru1.ru_stime, 2)]
        return {"replication_s": t_end - t0, "total_s": t_end - t0,
                "arrival_s": {k: round(v - t0, 3) for k, v in sorted(arrival.items())},
                "cpu_s_replication": {"rsync clients": clients_cpu, "rsync daemon (pub)": server_cpu},
                "machine_busy": round((m1[0] - m0[0]) / max(1, m1[1] - m0[1]), 3)}
    finally:
        for p in [p for _, p in clients] + [daemon]:   # each leads its own process group (its forks)
            kill_group(p)
            if p.stderr:
                p.stderr.close()
        shutil.rmtree(d, ignore_errors=True)


def link_check(ctx, nbytes=512 << 20):
    """Raw TCP from pub to r1 (python sockets, one stream): what one capped link carries."""
    net = ctx["net"]
    ip = net.ip("r1")
    recv_py = ("import socket,sys,time\n"
               f"s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('{ip}',9000));"
               "s.listen(1);print('ready',flush=True)\n"
               "c,_=s.accept();n=0;b=bytearray(4<<20);m=memoryview(b);t=None\n"
               "while True:\n k=c.recv_into(m)\n if not k: break\n"
               " if t is None: t=time.monotonic()\n n+=k\n"
               "print(n,time.monotonic()-t,flush=True)\n")
    send_py = ("import socket\n"
               f"c=socket.create_connection(('{ip}',9000));b=bytes(8<<20)\n"
               f"for _ in range({nbytes // (8 << 20)}): c.sendall(b)\n"
               "c.close()\n")
    r = subprocess.Popen(net.nsenter("r1") + [sys.executable, "-c", recv_py], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ctx["procs"].append(r)
    try:
        if r.stdout.readline().strip() != "ready":
            raise RuntimeError(f"link check receiver: {r.stderr.read()}")
        ru0, m0 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu()
        run(net.nsenter("pub") + [sys.executable, "-c", send_py], timeout=120)
        out, err = r.communicate(timeout=60)
        ru1, m1 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu()
        got, secs = out.split()
        cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        return {"bytes": int(got), "seconds": round(float(secs), 3),
                "gbit_s": round(int(got) * 8 / float(secs) / 1e9, 3),
                "cpu_s_sender_receiver": round(cpu, 2), "cpu_s_per_gib": round(cpu / (int(got) / 2**30), 2),
                "machine_busy": round((m1[0] - m0[0]) / max(1, m1[1] - m0[1]), 3)}
    finally:
        if r.poll() is None:
            r.kill()
            r.wait(timeout=10)


def commit_latency(ctx, n_nodes=4, commits=50):
    """n_nodes (pub + receivers, chain) with two small versions; time hwfs commit."""
    net, work = ctx["net"], ctx["work"]
    nodes = [ctx["nodes"]["pub"]] + [ctx["nodes"][f"r{i}"] for i in range(1, n_nodes)]
    cl = Cluster(net, nodes, "chain", os.path.join(work, "run-commit"), ctx["procs"])
    try:
        cl.start()
        pub = nodes[0]
        names = ("ca", "cb")
        for k, v in enumerate(names):
            src = os.path.join(work, f"src-{v}")
            os.makedirs(src, exist_ok=True)
            write_model(os.path.join(src, "model.safetensors"), 4, 0.25, SEED + 100 + k)  # 1 MiB
            pub.cmd("publish", src, v)
        end = time.monotonic() + 60
        while not all(x.has(v) for x in nodes for v in names):
            if time.monotonic() > end:
                raise RuntimeError("the commit-latency versions did not reach every node in 60 s")
            time.sleep(POLL_S)
        node = nodes[-1]                       # commit from a receiver, not the publisher
        node.cmd("commit", names[1])           # warm-up, not counted
        lat = []
        for i in range(commits):
            v = names[i % 2]
            t = time.perf_counter()
            node.cmd("commit", v, timeout=60)
            lat.append((time.perf_counter() - t) * 1000)
        bd = commit_breakdown(json.loads(node.cmd("status", "--cluster", "--json").stdout).get("commits", []),
                              lat)
        last = names[(commits - 1) % 2]
        for x in nodes:
            cur = os.readlink(os.path.join(x.mnt, "current"))
            if cur != f"versions/{last}":
                raise RuntimeError(f"after the commits {x.name}'s current is {cur}, expected versions/{last}")
        return {"nodes": n_nodes, "from": node.name, "commits": commits,
                "p50_ms": round(statistics.median(lat), 2), "p99_ms": round(pctl(lat, 99), 2),
                "min_ms": round(min(lat), 2), "max_ms": round(max(lat), 2),
                "samples_ms": [round(x, 2) for x in lat], "breakdown": bd}
    finally:
        cl.stop()


# --------------------------------------------------------------------------
# rl: an RL update v1 -> v2 where ~2% of the bf16 values changed (issue 9)

RL_HIDDEN = 4096             # 4 layers at 4096: 29 bf16 tensors of 16-64 MiB, 1 GiB
RL_LAYERS = 4
RL_CHANGED = 0.02            # fraction of the bf16 values an update changes
RL_CONV_TARGETS = {4: 0.25, 6: 0.3}  # deltas on, N receivers: converged within this x S/B (issue 20)
RL_WIRE_TARGET = 1.3         # wire bytes per receiver <= 1.3 x zstd -1 of XOR(v1, v2)
RL_ENCODE_TARGET = 0.5       # encode CPU seconds per GiB encoded (issue 20)
RL_DECODE_TARGET = 0.4       # decode CPU seconds per GiB rebuilt (issue 20)
RL_V1, RL_V2 = "rl-v1", "rl-v2"
DELTA_KEYS = ("encoded", "encode_bytes", "encode_cpu_s", "decoded", "decode_bytes", "decode_cpu_s", "sent",
              "received", "failed", "whole", "ahead_encoded", "ahead_hits", "forwarded")


def rl_layout(hidden, layers):
    """The tensors of a llama-like bf16 model in two safetensors files:
    [(file index, name, shape, init std)]: an embedding [2h, h], then per
    layer q/o [h, h], k/v [h/2, h] (grouped-query attention), gate/up [1.5h, h]
    and down [h, 1.5h].  h = 4096 and 4 layers: 29 tensors, 16-64 MiB, 1 GiB."""
    h, inter = hidden, hidden * 3 // 2
    out = [(0, "model.embed_tokens.weight", [2 * h, h], 0.02)]
    for i in range(layers):
        f, p = (0 if i < (layers + 1) // 2 else 1), f"model.layers.{i}."
        proj = 0.02 / (2 * layers) ** 0.5      # GPT-2-style scaled init of the output projections
        out += [(f, p + "self_attn.q_proj.weight", [h, h], 0.02),
                (f, p + "self_attn.k_proj.weight", [h // 2, h], 0.02),
                (f, p + "self_attn.v_proj.weight", [h // 2, h], 0.02),
                (f, p + "self_attn.o_proj.weight", [h, h], proj),
                (f, p + "mlp.gate_proj.weight", [inter, h], 0.02),
                (f, p + "mlp.up_proj.weight", [inter, h], 0.02),
                (f, p + "mlp.down_proj.weight", [h, inter], proj)]
    return out


def rl_changed_fraction(k, n, seed):
    """Fraction of the bf16 values of @n N(0, 1) float32 weights that change
    when each weight moves by k * N(0, 1) (scale-free: the same for any std)."""
    import numpy as np

    rng = np.random.default_rng([seed, 1 << 20])
    w = rng.standard_normal(n, dtype=np.float32)
    a = bf16_bits(w)
    step = rng.standard_normal(n, dtype=np.float32)
    step *= np.float32(k)
    w += step
    return np.count_nonzero(a != bf16_bits(w)) / n


def rl_calibrate(target, seed, n=1 << 21):
    """The step scale k (step = k x the tensor's init std x N(0, 1), what an
    optimizer step of roughly constant relative size does) that changes
    @target of the bf16 values, by bisection in log space on a sample of @n
    weights.  Returns (k, the sample's fraction at k)."""
    lo, hi = 1e-7, 1.0
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        if rl_changed_fraction(mid, n, seed) < target:
            lo = mid
        else:
            hi = mid
    k = (lo * hi) ** 0.5
    return k, rl_changed_fraction(k, n, seed)


def write_rl_versions(v1dir, v2dir, xor_path, layout, k, seed):
    """Write v1 and v2 of the model @layout: a float32 master w per tensor
    (N(0, std), generated one tensor at a time), v1 = bf16(w), v2 = bf16(w +
    k * std * N(0, 1)), both rounded to nearest even; the same file and
    tensor names in @v1dir and @v2dir.  The XOR of the two versions' tensor
    data (headers left out), in file and tensor order, goes to @xor_path.
    Returns {"bytes": one version's size, "tensor_bytes", "changed": bf16
    values that differ, "elements", "per_tensor_changed": [fraction]}."""
    import numpy as np

    files = sorted({f for f, *_ in layout})
    nfiles = len(files)
    out = {"bytes": 0, "tensor_bytes": 0, "changed": 0, "elements": 0, "per_tensor_changed": [], "files": []}
    with open(xor_path, "wb") as xf:
        for f in files:
            name = f"model-{f + 1:05d}-of-{nfiles:05d}.safetensors"
            ts = [(i, t) for i, t in enumerate(layout) if t[0] == f]
            head, _, size = safetensors_header([(t[1], "BF16", t[2]) for _, t in ts], "hwfs bench-cluster rl")
            with open(os.path.join(v1dir, name), "wb") as f1, open(os.path.join(v2dir, name), "wb") as f2:
                f1.write(head)
                f2.write(head)
                for i, (_, tname, shape, std) in ts:
                    n = shape[0] * shape[1]
                    rng = np.random.default_rng([seed, i])
                    w = rng.standard_normal(n, dtype=np.float32)
                    w *= np.float32(std)
                    a = bf16_bits(w)
                    f1.write(a.data)
                    step = rng.standard_normal(n, dtype=np.float32)
                    step *= np.float32(k * std)
                    w += step
                    del step
                    b = bf16_bits(w)
                    del w
                    f2.write(b.data)
                    b ^= a
                    del a
                    xf.write(b.data)
                    c = int(np.count_nonzero(b))
                    del b
                    out["changed"] += c
                    out["elements"] += n
                    out["per_tensor_changed"].append(c / n)
            out["files"].append(name)
            out["bytes"] += len(head) + size
            out["tensor_bytes"] += size
    return out


def counters_delta(a, b):
    """What the status "replication" objects' counters grew by from @a to @b:
    {"wire_bytes_received": n or None, "delta": {key: n} or None}; None where
    a daemon does not report the field (yet)."""
    wa, wb = a.get("wire_bytes_received"), b.get("wire_bytes_received")
    da, db = a.get("delta"), b.get("delta")
    d = None
    if isinstance(da, dict) and isinstance(db, dict):
        d = {k: db[k] - da[k] for k in DELTA_KEYS if isinstance(da.get(k), (int, float))
             and isinstance(db.get(k), (int, float))}
    return {"wire_bytes_received": wb - wa if isinstance(wa, int) and isinstance(wb, int) else None, "delta": d}


def rl_once(ctx, n, rep, delta_on):
    """Fresh chain pub + r1..rN, every daemon with -o delta=0 unless
    @delta_on; publish v1 and wait for every receiver (untimed), then publish
    v2 and time until every receiver has it (as replicate_once).  Returns the
    run's figures; raises RuntimeError when a mount, a publish or v1 fails."""
    net, work, rl = ctx["net"], ctx["work"], ctx["rl"]
    nodes = [ctx["nodes"]["pub"]] + [ctx["nodes"][f"r{i}"] for i in range(1, n + 1)]
    run_dir = os.path.join(work, f"run-rl-{'on' if delta_on else 'off'}-n{n}-{rep}")
    cl = Cluster(net, nodes, "chain", run_dir, ctx["procs"])
    saved = [(x.opts, x.capacity) for x in nodes]
    for x in nodes:
        x.opts, x.capacity = ([] if delta_on else ["delta=0"]), rl["capacity"]
    try:
        cl.start()
        pub, recv = nodes[0], nodes[1:]
        t = time.monotonic()
        pub.cmd("publish", rl["v1dir"], RL_V1, timeout=600)
        arrival, failed = wait_arrivals(ctx, recv, RL_V1, time.monotonic())
        if failed:
            raise RuntimeError(f"v1 ({RL_V1}) {failed}: {cl.events()[-5:]}")
        _, st0 = check_sealed(pub, recv, RL_V1)
        log(f"  v1 on every node in {time.monotonic() - t:.1f} s (untimed)")
        pids = {x.name: x.pid for x in nodes}
        pids["coord"] = cl.coord.pid
        qd0 = net.qdisc_stats()
        t0 = time.monotonic()
        pub.cmd("publish", rl["v2dir"], RL_V2, timeout=600)
        t_pub = time.monotonic()
        c1, m1 = cpu_snapshot(pids), machine_cpu()
        arrival, failed = wait_arrivals(ctx, recv, RL_V2, t_pub)
        events = cl.events()
        qd1 = net.qdisc_stats()
        tbf = qdisc_delta(qd0, qd1)
        links_in = {x.name: tbf["links"].get(f"{x.name} in", {}).get("bytes") for x in recv}
        if failed:
            log(f"  FAILED: {RL_V2} {failed}; arrived: {sorted(arrival)}")
            for e in events[-30:]:
                log(f"    {e}")
            return {"failed": failed, "replication_s": None, "total_s": None, "publish_s": t_pub - t0,
                    "arrival_s": {k: round(v - t_pub, 3) for k, v in sorted(arrival.items())},
                    "tbf": tbf, "events": events}
        end = max(arrival.values())
        c2, m2 = cpu_snapshot(pids), machine_cpu()
        digest, st1 = check_sealed(pub, recv, RL_V2)
        grew = {name: counters_delta(st0.get(name, {}), st1.get(name, {})) for name in st1}
        wire = {x.name: grew[x.name]["wire_bytes_received"] for x in recv}
        dsum = None
        if any(g["delta"] is not None for g in grew.values()):
            dsum = {k: sum((g["delta"] or {}).get(k, 0) for g in grew.values()) for k in DELTA_KEYS}
        per_gib = lambda s, b: (dsum[s] / (dsum[b] / 2**30) if dsum and dsum.get(b) else None)  # noqa: E731
        # issue 20's pipeline (codec workers, encode ahead, cut-through deltas): its status has
        # delta.forwarded; the simulator models the run with that pipeline's parameters
        pipeline = any("forwarded" in (st.get("delta") or {}) for st in st1.values())
        # the machine's pace in this run, right after the codec ran: enc/dec over it compare runs
        xxh3 = xxh3_cpu_s_per_gib() if dsum else None
        return {
            "xxh3_cpu_s_per_gib": xxh3,
            "pipeline": pipeline, "io_threads": io_threads_of(st1),
            "replication_s": end - t_pub, "total_s": end - t0, "publish_s": t_pub - t0,
            "arrival_s": {k: round(v - t_pub, 3) for k, v in sorted(arrival.items())},
            "cpu_s_replication": cpu_delta(c1, c2),
            "machine_busy": round((m2[0] - m1[0]) / max(1, m2[1] - m1[1]), 3),
            "digest": digest, "wire_bytes_received": wire, "link_in_bytes": links_in,
            "pub_out_bytes": tbf["links"].get("pub out", {}).get("bytes"),
            "delta_counters": dsum, "encode_cpu_s_per_gib": per_gib("encode_cpu_s", "encode_bytes"),
            "decode_cpu_s_per_gib": per_gib("decode_cpu_s", "decode_bytes"),
            "counters_before": st0, "counters_after": st1, "tbf": tbf, "events": events,
        }
    finally:
        cl.stop()
        for x, (o, c) in zip(nodes, saved):
            x.opts, x.capacity = o, c


def mem_available():
    """MemAvailable of /proc/meminfo in bytes (0 when it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rl_scenario(ctx, a, ns_list, res):
    """The rl scenario: write v1 and v2 (and measure zstd -1 of their XOR),
    then for every N and rep one run with deltas on and one with delta=0.
    Fills res["rl"]; the sources are removed at the end."""
    hidden, layers = (RL_HIDDEN // 2 if a.quick else RL_HIDDEN), RL_LAYERS
    size_of = lambda L: sum(2 * s[0] * s[1] for _, _, s, _ in rl_layout(hidden, L))  # noqa: E731
    maxn = max(ns_list)
    cap_of = lambda L: 2 * size_of(L) + size_of(L) // 8 + (64 << 20)  # noqa: E731  v1 + v2 + margin
    # in memory at once: v1 and v2 sources, the XOR (while zstd reads it), maxN+1 stores
    per_store = lambda L: cap_of(L) if not a.no_preallocate else 2 * size_of(L)  # noqa: E731
    need = lambda L: 3 * size_of(L) + (maxn + 1) * per_store(L) + (1 << 30)  # noqa: E731
    free = min(shutil.disk_usage("/dev/shm").free, mem_available() or shutil.disk_usage("/dev/shm").free)
    if free < need(layers):
        fit = layers
        while fit > 1 and free < need(fit):
            fit -= 1
        if free < need(fit):
            raise RuntimeError(f"rl: {free / 2**30:.1f} GiB of memory free, {need(1) / 2**30:.1f} GiB needed "
                               f"even for one layer")
        log(f"NOTE: rl: {free / 2**30:.1f} GiB free (/dev/shm and MemAvailable), {need(layers) / 2**30:.1f} GiB "
            f"needed for {layers} layers; SCALED DOWN to {fit} layers ({size_of(fit) / 2**30:.2f} GiB)")
        layers = fit
    layout = rl_layout(hidden, layers)
    capacity = f"{-(-cap_of(layers) // (1 << 20))}M"
    d = os.path.join(ctx["work"], "rl")
    v1dir, v2dir = os.path.join(d, "v1"), os.path.join(d, "v2")
    os.makedirs(v1dir)
    os.makedirs(v2dir)
    out = {"cores": os.cpu_count(), "hidden": hidden, "layers": layers, "tensors": len(layout), "dtype": "BF16", "topology": "chain",
           "capacity": capacity, "target_changed": a.rl_changed, "runs": [], "notes": []}
    res["rl"] = out
    try:
        t = time.monotonic()
        k, sample = rl_calibrate(a.rl_changed, SEED)
        log(f"rl: step = {k:.4g} x std x N(0,1) changes {sample * 100:.2f}% of the bf16 values of a 2M sample "
            f"(target {a.rl_changed * 100:g}%; {time.monotonic() - t:.1f} s)")
        t = time.monotonic()
        xor_path = os.path.join(d, "xor.bin")
        g = write_rl_versions(v1dir, v2dir, xor_path, layout, k, SEED)
        sizes = [2 * s[0] * s[1] for _, _, s, _ in layout]
        log(f"rl: wrote v1 and v2, {g['bytes'] / 2**30:.3f} GiB each, {len(layout)} bf16 tensors of "
            f"{min(sizes) / 2**20:.0f}-{max(sizes) / 2**20:.0f} MiB in {len(g['files'])} files, "
            f"{time.monotonic() - t:.1f} s; measured: {g['changed'] / g['elements'] * 100:.3f}% of the bf16 values "
            f"changed (per tensor {min(g['per_tensor_changed']) * 100:.3f}-"
            f"{max(g['per_tensor_changed']) * 100:.3f}%)")
        t = time.monotonic()
        zb, zcpu = zstd_size(xor_path, 1)
        os.unlink(xor_path)
        log(f"rl: zstd -1 of XOR(v1, v2) tensor data: {zb / 2**20:.1f} MiB = {zb / g['tensor_bytes'] * 100:.2f}% "
            f"({zcpu:.2f} CPU s, {time.monotonic() - t:.1f} s)")
        sb = g["bytes"] * 8 / rate_bps(a.rate)
        out.update(step_k=k, sample_changed=sample, size_bytes=g["bytes"], tensor_bytes=g["tensor_bytes"],
                   changed_fraction=g["changed"] / g["elements"], per_tensor_changed=g["per_tensor_changed"],
                   files=g["files"], tensor_mib=[s / 2**20 for s in sizes], xor_zstd1_bytes=zb,
                   xor_zstd1_cpu_s=round(zcpu, 3), s_over_b=sb)
        ctx["rl"] = {"v1dir": v1dir, "v2dir": v2dir, "capacity": capacity}
        modes = [True] if a.rl_no_off else [True, False]
        off_refused = None
        for n in ns_list:
            for delta_on in modes:
                label = "on" if delta_on else "off"
                for rep in range(a.reps):
                    if not delta_on and off_refused:
                        break
                    log(f"rl delta={label} N={n} run {rep + 1}/{a.reps} ...")
                    try:
                        r = rl_once(ctx, n, rep, delta_on)
                    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                        if not delta_on and "tunable" in str(e):
                            off_refused = ("the daemon refuses `-o delta=0` (no `delta` tunable in this build): "
                                           "runs with deltas off skipped")
                            out["notes"].append(off_refused)
                            log(f"  NOTE: {off_refused}")
                            break
                        log(f"  FAILED: {e}")
                        r = {"failed": str(e).splitlines()[0], "error": str(e), "replication_s": None}
                    ok = not r.get("failed")
                    r.update(delta=delta_on, n=n, rep=rep, ratio=r["replication_s"] / sb if ok else None)
                    out["runs"].append(r)
                    if ok:
                        w = [v for v in r["wire_bytes_received"].values() if v is not None]
                        li = [v for v in r["link_in_bytes"].values() if v is not None]
                        log(f"  {r['replication_s']:.2f} s = {r['ratio']:.3f} x S/B; arrivals {r['arrival_s']}; "
                            f"wire/node {statistics.mean(w) / 2**20 if w else float('nan'):.1f} MiB; "
                            f"link in/node {statistics.mean(li) / 2**20 if li else float('nan'):.1f} MiB; "
                            f"delta counters {r['delta_counters']}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
        ctx.pop("rl", None)


def rl_rows(rl):
    """Aggregate rl runs per (delta on/off, N): medians; the targets' verdicts."""
    sb, zb = rl["s_over_b"], rl["xor_zstd1_bytes"]
    groups = {}
    for r in rl["runs"]:
        groups.setdefault((r["delta"], r["n"]), []).append(r)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    rows = []
    for (on, n), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], not kv[0][0])):
        ok = [r for r in rs if not r.get("failed")]
        row = {"delta": on, "n": n, "runs": len(rs), "failed_runs": len(rs) - len(ok),
               "failures": [r["failed"] for r in rs if r.get("failed")],
               "samples_s": [round(r["replication_s"], 3) for r in ok]}
        wire = [statistics.mean(v) for r in ok
                if (v := [x for x in r["wire_bytes_received"].values() if x is not None])]
        wire_max = [max(v) for r in ok if (v := [x for x in r["wire_bytes_received"].values() if x is not None])]
        link = [statistics.mean(v) for r in ok if (v := [x for x in r["link_in_bytes"].values() if x is not None])]
        rep_s = med([r["replication_s"] for r in ok])
        row.update(replication_s=rep_s, ratio=rep_s / sb if rep_s is not None else None,
                   total_s=med([r["total_s"] for r in ok]),
                   wire_per_node=med(wire), wire_max_node=max(wire_max) if wire_max else None,
                   wire_x_zstd=med(wire) / zb if wire else None, link_in_per_node=med(link),
                   cpu_s=med([sum(sum(v) for v in r["cpu_s_replication"].values() if v) for r in ok]),
                   machine_busy=med([r["machine_busy"] for r in ok]),
                   encode_cpu_s_per_gib=med([r["encode_cpu_s_per_gib"] for r in ok
                                             if r["encode_cpu_s_per_gib"] is not None]),
                   decode_cpu_s_per_gib=med([r["decode_cpu_s_per_gib"] for r in ok
                                             if r["decode_cpu_s_per_gib"] is not None]),
                   xxh3_cpu_s_per_gib=med([r["xxh3_cpu_s_per_gib"] for r in ok
                                           if r.get("xxh3_cpu_s_per_gib") is not None]),
                   delta_counters=ok[-1]["delta_counters"] if ok else None,
                   pipeline=any(r.get("pipeline") for r in ok),
                   io_threads=max([r.get("io_threads", 1) for r in ok] or [1]))
        rows.append(row)
    verdicts = {}
    for n, target in RL_CONV_TARGETS.items():
        rn = next((r for r in rows if r["delta"] and r["n"] == n), None)
        if rn is None or rn["ratio"] is None:
            verdicts[f"converge_n{n}"] = {"value": None, "target": target,
                                          "result": "n/a" if rn is None else "FAILED"}
        else:
            verdicts[f"converge_n{n}"] = {"value": rn["ratio"], "target": target,
                                          "result": "PASS" if rn["ratio"] <= target and not rn["failed_runs"]
                                          else "MISS"}
    on = [r for r in rows if r["delta"]]
    wmax = [r["wire_max_node"] for r in on if r["wire_max_node"] is not None]
    verdicts["wire"] = ({"value": max(wmax) / zb, "result": "PASS" if max(wmax) / zb <= RL_WIRE_TARGET
                         else "MISS"} if wmax else {"value": None, "result": "n/a"})
    dec = [r["decode_cpu_s_per_gib"] for r in on if r["decode_cpu_s_per_gib"] is not None]
    verdicts["decode"] = ({"value": max(dec), "result": "PASS" if max(dec) <= RL_DECODE_TARGET
                           else "MISS"} if dec else {"value": None, "result": "n/a"})
    enc = [r["encode_cpu_s_per_gib"] for r in on if r["encode_cpu_s_per_gib"] is not None]
    verdicts["encode"] = ({"value": max(enc), "result": "PASS" if max(enc) <= RL_ENCODE_TARGET
                           else "MISS"} if enc else {"value": None, "result": "n/a"})
    return rows, verdicts


def print_rl(rl):
    """The rl scenario's table, targets and notes on stdout; rows and
    verdicts stored into @rl."""
    if "s_over_b" not in rl:
        print("\nhwfs RL update: FAILED before any run (see the log)")
        return
    rows, verdicts = rl_rows(rl)
    rl["rows"], rl["verdicts"] = rows, verdicts
    sb, zb = rl["s_over_b"], rl["xor_zstd1_bytes"]
    cores = rl.get("cores") or 1
    mib = lambda v: "n/a" if v is None else f"{v / 2**20:.1f}"  # noqa: E731
    over = lambda v, base: v / base if v is not None and base else None  # noqa: E731
    print(f"\nhwfs RL update (issue 9): v1 -> v2 of a {rl['size_bytes'] / 2**30:.2f} GiB bf16 version "
          f"({rl['tensors']} tensors of {min(rl['tensor_mib']):.0f}-{max(rl['tensor_mib']):.0f} MiB in "
          f"{len(rl['files'])} files), {rl['changed_fraction'] * 100:.2f}% of the bf16 values changed (measured; "
          f"target {rl['target_changed'] * 100:g}%), chain, every receiver holding v1; S/B = {sb:.2f} s")
    print(f"zstd -1 of XOR(v1, v2) tensor data: {mib(zb)} MiB ({zb / rl['tensor_bytes'] * 100:.2f}% of the data; "
          f"zstd used {rl['xor_zstd1_cpu_s'] / (rl['tensor_bytes'] / 2**30):.2f} CPU s per GiB)\n")
    hdr = (f"{'delta':5} {'N':>2} {'conv s':>7} {'x S/B':>6} {'wire MiB/node':>13} {'x zstd':>6} "
           f"{'link MiB/node':>13} {'CPU s':>6} {'floor':>6} {'busy':>5} {'enc s/GiB':>9} {'dec s/GiB':>9} "
           f"{'xxh3':>5} {'enc x':>5} {'dec x':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{'on' if r['delta'] else 'off':5} {r['n']:>2} {fmt(r['replication_s'], '7.2f')} "
              f"{fmt(r['ratio'], '6.3f')} {mib(r['wire_per_node']):>13} "
              f"{fmt(r['wire_x_zstd'], '6.2f')} "
              f"{mib(r['link_in_per_node']):>13} {fmt(r['cpu_s'], '6.1f')} "
              f"{fmt(None if r['cpu_s'] is None else r['cpu_s'] / cores / sb, '6.3f')} "
              f"{fmt(r['machine_busy'], '4.0f', 100)}% "
              f"{fmt(r['encode_cpu_s_per_gib'], '9.2f')} "
              f"{fmt(r['decode_cpu_s_per_gib'], '9.2f')} "
              f"{fmt(r.get('xxh3_cpu_s_per_gib'), '5.3f')} "
              f"{fmt(over(r['encode_cpu_s_per_gib'], r.get('xxh3_cpu_s_per_gib')), '5.2f')} "
              f"{fmt(over(r['decode_cpu_s_per_gib'], r.get('xxh3_cpu_s_per_gib')), '5.2f')}"
              + (f"  {r['failed_runs']}/{r['runs']} runs FAILED" if r["failed_runs"] else ""))
        run = {"topology": "chain", "n": r["n"], "size": rl["size_bytes"], "link": f"{rl['size_bytes'] * 8 / sb:.0f}",
               "shard": rl["size_bytes"] // rl["tensors"]}
        if r["delta"]:
            run.update(delta=rl["changed_fraction"], delta_ratio=(r["wire_per_node"] or 0.0237 * rl["size_bytes"])
                       / rl["size_bytes"])
            if r["encode_cpu_s_per_gib"]:
                run["encode_gibps"] = 1 / r["encode_cpu_s_per_gib"]
            if r["decode_cpu_s_per_gib"]:
                run["decode_gibps"] = 1 / r["decode_cpu_s_per_gib"]
        run["io_threads"] = r.get("io_threads", 1)
        sim_compare(r, run, cores, pipeline=r.get("pipeline", False))
        for why in r["failures"]:
            print(f"  FAILED delta {'on' if r['delta'] else 'off'} N={r['n']}: {why}")
    print("  conv s: from the end of `hwfs publish` of v2 until MNT/versions/v2 exists on every receiver "
          "(each then checked sealed with the publisher's digest)")
    print("  wire: status replication.wire_bytes_received grown during v2, mean over receivers; link: bytes the "
          "receiver's tbf carried in (TCP/IP headers and control traffic included)")
    print("  enc/dec s/GiB: status replication.delta CPU seconds per GiB of raw shard bytes encoded / rebuilt, "
          "all nodes; CPU s, busy: daemons + coordinator, and the whole machine, during v2")
    print("  xxh3: CPU s per GiB of XXH3-128 over 128 MiB on the bench's thread right after v2 converged (the "
          "machine's pace in that run); enc x / dec x: enc / dec s/GiB over it, what compares runs on a machine "
          "whose pace drifts (docs/benchmarks.md, \"Issue 29, item 3\")")
    print(f"  floor: CPU s / {cores} cores, x S/B: the time this run's CPU work takes spread perfectly over the "
          f"machine's cores (a CPU bound; the link bound of the deltas-on runs is far lower)")
    for r in rows:
        dc = r["delta_counters"]
        if dc:
            print(f"  delta counters, all nodes (last run), deltas {'on' if r['delta'] else 'off'} N={r['n']}: "
                  + ", ".join(f"{k} {dc[k]}" for k in ("encoded", "sent", "received", "decoded", "whole", "failed",
                                                   "ahead_encoded", "ahead_hits", "forwarded")
                     if k in dc))
    v = verdicts
    val = lambda x, f, unit="": "n/a" if x["value"] is None else format(x["value"], f) + unit  # noqa: E731
    print()
    for n, target in RL_CONV_TARGETS.items():
        print(f"  N={n}, deltas on, converges <= {target:g} x S/B: {val(v[f'converge_n{n}'], '.3f', ' x')}  "
              f"{v[f'converge_n{n}']['result']}")
    print(f"  wire bytes per node <= {RL_WIRE_TARGET:g} x zstd -1 of the XOR (largest receiver, deltas on): "
          f"{val(v['wire'], '.2f', ' x')}  {v['wire']['result']}")
    print(f"  encode <= {RL_ENCODE_TARGET:g} CPU s per GiB (deltas on, largest row): "
          f"{val(v['encode'], '.2f')}  {v['encode']['result']}")
    print(f"  decode <= {RL_DECODE_TARGET:g} CPU s per GiB (deltas on, largest row): "
          f"{val(v['decode'], '.2f')}  {v['decode']['result']}")
    for note in rl.get("notes", []):
        print(f"  note: {note}")


# --------------------------------------------------------------------------


def check_env():
    if os.geteuid() != 0:
        sys.exit("bench-cluster: needs root (network namespaces, tc, FUSE)")
    if not os.access(HWFS, os.X_OK):
        sys.exit(f"bench-cluster: {HWFS} not found; run make all")
    for tool in ("ip", "tc", "nsenter", "rsync", "fusermount3"):
        if not shutil.which(tool):
            sys.exit(f"bench-cluster: `{tool}` not found (iproute2, util-linux, rsync, fuse3)")
    try:
        import numpy  # noqa: F401
    except ImportError:
        sys.exit("bench-cluster: numpy is needed (tools/install/install-deps.sh)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=SCENARIOS, default="all",
                    help="replication: the methods and the commit latency; rl: the RL update v1 -> v2 "
                         "(deltas on and off); all: both (default)")
    ap.add_argument("--quick", action="store_true", help="N = 2 and 4 only, 256 MiB (development)")
    ap.add_argument("--nodes", default=None, help="receiver counts, e.g. 2,4,6 (default; --quick: 2,4)")
    ap.add_argument("--tensors", type=int, default=None, help="tensors in the version (default 32; --quick 8)")
    ap.add_argument("--tensor-mib", type=float, default=32, help="MiB per tensor (default 32)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    ap.add_argument("--rate", default=RATE, help=f"tbf rate of every link (default {RATE})")
    ap.add_argument("--reps", type=int, default=1, help="runs per (method, N); median reported (default 1)")
    ap.add_argument("--commits", type=int, default=50, help="commits timed for the latency (default 50; 0: skip)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a replication may take (default 120)")
    ap.add_argument("--no-preallocate", action="store_true",
                    help="mount the nodes without --preallocate (pages allocated as shards arrive)")
    ap.add_argument("--no-link-check", action="store_true", help="skip the raw TCP check of one link")
    ap.add_argument("--rl-changed", type=float, default=RL_CHANGED,
                    help=f"rl: fraction of the bf16 values v2 changes (default {RL_CHANGED:g})")
    ap.add_argument("--rl-no-off", action="store_true", help="rl: skip the runs with deltas off (delta=0)")
    ap.add_argument("--json", default=str(REPO / "build" / "bench-cluster.json"), help="where to write results")
    a = ap.parse_args()

    check_env()
    ns_list = [int(x) for x in (a.nodes or ("2,4" if a.quick else "2,4,6")).split(",")]
    if not ns_list or min(ns_list) < 1 or max(ns_list) > 6:
        sys.exit("bench-cluster: --nodes takes receiver counts between 1 and 6")
    methods = [m for m in a.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            sys.exit(f"bench-cluster: unknown method {m!r} (one of {', '.join(METHODS)})")
    if not 0 < a.rl_changed < 0.5:
        sys.exit("bench-cluster: --rl-changed takes a fraction between 0 and 0.5")
    do_repl, do_rl = a.scenario in ("all", "replication"), a.scenario in ("all", "rl")
    tensors = a.tensors or (8 if a.quick else 32)
    size_est = int(tensors * a.tensor_mib * (1 << 20))
    maxn = max(ns_list)
    hosts = max(maxn, 3 if a.commits > 0 and do_repl else 1)   # the commit latency needs pub + r1..r3

    # /dev/shm must hold the source, maxN+1 stores (or maxN rsync copies) and a margin;
    # a preallocated store holds its whole capacity (1.5 x the version + 64 MiB).
    free = shutil.disk_usage("/dev/shm").free
    per_store = 1.5 if not a.no_preallocate else 1.0
    need = lambda t: int(t * a.tensor_mib * (1 << 20) * (1 + per_store * (maxn + 1))) + (576 << 20)  # noqa: E731
    if do_repl and free < need(tensors):
        fit = tensors
        while fit > 1 and free < need(fit):
            fit -= 1
        if free < need(fit):
            sys.exit(f"bench-cluster: /dev/shm has {free / 2**30:.1f} GiB free; not even one tensor fits")
        log(f"NOTE: /dev/shm has {free / 2**30:.1f} GiB free, {need(tensors) / 2**30:.1f} GiB needed for "
            f"{tensors} x {a.tensor_mib:g} MiB; SCALED DOWN to {fit} tensors "
            f"({fit * a.tensor_mib / 1024:.2f} GiB)")
        tensors = fit
        size_est = int(tensors * a.tensor_mib * (1 << 20))
    capacity = f"{max(256, -(-size_est * 3 // 2 // (1 << 20)) + 64)}M"

    # Ctrl-C and SIGTERM end the run through the finally below.
    interrupt_on_term()

    work = tempfile.mkdtemp(dir="/dev/shm", prefix=f"{TAG}-")
    mntroot = tempfile.mkdtemp(prefix=f"{TAG}-mnt-")
    net = Net(a.rate)
    ctx = {"net": net, "work": work, "procs": [], "timeout": a.timeout, "nodes": {}}
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["python3", "tools/bench/bench_cluster.py"]
                                                                           + sys.argv[1:]),
           "machine": machine(),
           "rate": a.rate, "rate_bps": rate_bps(a.rate), "tensors": tensors, "tensor_mib": a.tensor_mib,
           "receivers": ns_list, "reps": a.reps, "statistic": "median", "capacity": capacity,
           "preallocate": not a.no_preallocate, "scenario": a.scenario, "runs": []}
    interrupted = False
    try:
        # Run a private copy of the programs: a rebuild of build/ during the run changes nothing.
        # build/hwfs runs build/hwfs-core beside it for the daemon's verbs (tools/cli/hwfs_cli.h).
        global HWFS
        os.makedirs(os.path.join(work, "bin"))
        res["binary"] = HWFS
        core = os.path.join(os.path.dirname(os.path.realpath(HWFS)), "hwfs-core")
        if os.path.exists(core):
            shutil.copy2(core, os.path.join(work, "bin", "hwfs-core"))
        HWFS = shutil.copy2(HWFS, os.path.join(work, "bin", "hwfs"))
        res["git"] = git_describe()
        srcdir = os.path.join(work, "src")
        if do_repl:
            os.makedirs(srcdir)
            log(f"writing {tensors} x {a.tensor_mib:g} MiB random float16 tensors to {srcdir}")
            t = time.monotonic()
            size = write_model(os.path.join(srcdir, "model.safetensors"), tensors, a.tensor_mib, SEED)
            ctx.update(srcdir=srcdir, size=size)
            sb = size * 8 / rate_bps(a.rate)
            res.update(size_bytes=size, s_over_b=sb)
            log(f"  {size / 2**30:.3f} GiB in {time.monotonic() - t:.1f} s; S/B = {sb:.3f} s at {a.rate}")

        members = [("coord", 2), ("pub", 10)] + [(f"r{i}", 10 + i) for i in range(1, hosts + 1)]
        log(f"network: {len(members)} namespaces + hub {TAG}-hub, {SUBNET}.0/24, every link tbf {a.rate} "
            f"both ways")
        net.setup(members)
        for name, _ in members[1:]:
            ctx["nodes"][name] = Node(net, name, work, mntroot, capacity, not a.no_preallocate)

        if not a.no_link_check:
            lc = link_check(ctx)
            res["link_check"] = lc
            log(f"link check: raw TCP pub -> r1 {lc['gbit_s']:.2f} Gbit/s ({lc['bytes'] >> 20} MiB), "
                f"{lc['cpu_s_per_gib']:.2f} CPU s per GiB (sender + receiver processes)")

        for m in (methods if do_repl else []):
            for n in ns_list:
                for rep in range(a.reps):
                    log(f"{m:7} N={n} run {rep + 1}/{a.reps} ...")
                    try:
                        r = rsync_once(ctx, n, rep) if m == "rsync" else replicate_once(ctx, m, n, rep)
                    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                        log(f"  FAILED: {e}")
                        r = {"failed": str(e).splitlines()[0], "error": str(e), "replication_s": None}
                    ok = not r.get("failed")
                    r.update(method=m, n=n, rep=rep, ratio=r["replication_s"] / sb if ok else None)
                    res["runs"].append(r)
                    if ok:
                        log(f"  {r['replication_s']:.2f} s = {r['ratio']:.2f} x S/B; arrivals {r['arrival_s']}; "
                            f"CPU busy {r['machine_busy'] * 100:.0f}%; CPU s (user, sys) {r['cpu_s_replication']}")
        if do_repl and a.commits > 0:
            log(f"commit latency: 4 nodes, {a.commits} commits ...")
            try:
                res["commit"] = commit_latency(ctx, 4, a.commits)
                log(f"  p50 {res['commit']['p50_ms']:.1f} ms, p99 {res['commit']['p99_ms']:.1f} ms")
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                log(f"  FAILED: {e}")
                res["commit"] = {"failed": str(e)}
        shutil.rmtree(srcdir, ignore_errors=True)     # its memory goes to the rl versions
        if do_rl:
            try:
                rl_scenario(ctx, a, ns_list, res)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                log(f"rl: FAILED: {e}")
                res.setdefault("rl", {})["failed"] = str(e)
        return finish(res, a.json)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; tearing down")
        return 130
    finally:
        ignore_interrupts()
        teardown(ctx, net, work, mntroot)
        if interrupted:
            log("torn down")


def teardown(ctx, net, work, mntroot):
    for node in ctx["nodes"].values():
        try:
            node.umount()
        except Exception as e:
            log(f"warning: unmounting {node.name}: {e}")
    for p in ctx["procs"]:
        try:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        except Exception:
            pass
    # Anything still living in our namespaces was started by us (they are new, named after our pid).
    try:
        left = net.pids()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            log(f"killed {len(left)} leftover process(es) in this run's namespaces: {sorted(left)}")
    except Exception as e:
        log(f"warning: listing the namespaces' processes: {e}")
    net.teardown()
    for node in ctx["nodes"].values():
        if mounted(node.mnt):
            log(f"warning: {node.mnt} is still mounted")
    shutil.rmtree(mntroot, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def finish(res, json_path):
    """Print the results of the scenarios that ran and write them to @json_path."""
    if "s_over_b" in res:
        print_replication(res)
    if "rl" in res:
        print_rl(res["rl"])
    write_json(res, json_path)
    print(f"\nresults written to {json_path}")
    return 0


def sim_compare(row, run, cores, pipeline=False):
    """Print under a table row `hwfs sim`'s prediction of it (the model parameters of
    tools/bench/sim_recorded.json, with this machine's cores and the run's own measured
    rates where @run has them) and the error against the measured time; both also
    go into @row (sim_s, sim_err, sim_model).  @pipeline: the daemon has issue 20's
    pipeline (its status reports delta.forwarded): the parameter set
    sim_model.PIPELINE (cut-through relays, encode ahead, fused rebuild, the
    import's CPU) with one codec worker per online CPU (codec_threads 0); else the
    store-and-forward parameters the older recorded rows were measured with."""
    if row.get("replication_s") is None:
        return
    try:
        rec = sim_model.load_recorded()
        over = {"host_cores": cores, "io_threads": 1}
        if pipeline:
            over["codec_workers"] = sim_model.online_cpus()
        params = sim_model.params_for(rec, sim_model.PIPELINE if pipeline else None, **over)
        params.update({k: run.pop(k) for k in list(run) if k in params})
        res = sim_model.predict(HWFS, params, run)
        row["sim_s"] = res["converged_s"]
        row["sim_err"] = res["converged_s"] / row["replication_s"] - 1
        row["sim_model"] = sim_model.PIPELINE if pipeline else "store-and-forward"
        model = (f"relay cut, encode ahead, {params['codec_workers']} codec workers, fused rebuild"
                 if pipeline else "store-and-forward")
        print(f"{'':11}sim: {res['converged_s']:.2f} s, error {row['sim_err'] * 100:+.1f}% of the measured "
              f"(bottleneck: {res['bottleneck']}; model: {model})")
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as e:
        print(f"{'':11}sim: n/a ({type(e).__name__}: {str(e)[:80]})")


def print_replication(res):
    """The replication scenario's table and verdicts on stdout; rows and
    verdicts stored into @res."""
    sb = res["s_over_b"]
    groups = {}
    for r in res["runs"]:
        groups.setdefault((r["method"], r["n"]), []).append(r)
    rows = []
    for (m, n), rs in groups.items():
        ok = [r for r in rs if not r.get("failed")]
        bad = [r for r in rs if r.get("failed")]
        row = {"method": m, "n": n, "runs": len(rs), "failed_runs": len(bad),
               "failures": [r["failed"] for r in bad], "replication_s": None, "total_s": None, "ratio": None,
               "total_ratio": None, "machine_busy": None, "proc_cpu_s": None, "samples_s": [round(r["replication_s"], 3) for r in ok],
               "io_threads": max([io_threads_of(r.get("replication_counters") or {}) for r in ok] or [1])}
        if ok:
            rep_s = statistics.median(r["replication_s"] for r in ok)
            tot_s = statistics.median(r["total_s"] for r in ok)
            row.update(replication_s=round(rep_s, 3), total_s=round(tot_s, 3), ratio=round(rep_s / sb, 3),
                       total_ratio=round(tot_s / sb, 3),
                       machine_busy=statistics.median(r["machine_busy"] for r in ok),
                       proc_cpu_s=round(statistics.median(
                           sum(sum(v) for v in r["cpu_s_replication"].values() if v) for r in ok), 2))
        row["roles_cpu_s_per_gib"] = roles_summary(ok)
        lc = res.get("link_check")
        if lc and row["replication_s"]:
            row["x_raw_tcp"] = round(res["size_bytes"] * 8 / (lc["gbit_s"] * 1e9) / row["replication_s"], 3)
        rows.append(row)
    by_m = {}
    for row in rows:
        by_m.setdefault(row["method"], []).append(row)
    verdicts = {}
    for row in rows:
        row["target"] = f"<= {CHAIN_TARGET:g}" if row["method"] == "chain" else "-"
        if row["ratio"] is None:
            row["result"] = "FAILED"
        else:
            if row["method"] == "chain":
                row["result"] = "PASS" if row["ratio"] <= CHAIN_TARGET and not row["failed_runs"] else "MISS"
            else:
                row["result"] = "info"
            if row["failed_runs"]:
                row["result"] += f", {row['failed_runs']}/{row['runs']} runs FAILED"
        if row["method"] == "chain":
            verdicts[f"chain_n{row['n']}"] = row["result"]
    chain_ok = [r["ratio"] for r in by_m.get("chain", []) if r["ratio"] is not None]
    if len(chain_ok) > 1:
        spread = max(chain_ok) / min(chain_ok)
        verdicts["chain_flat"] = {"max_over_min": round(spread, 3), "result": "PASS" if spread <= 1.15 else "MISS"}
    for m in ("star", "rsync"):
        s_ = sorted((r for r in by_m.get(m, []) if r["ratio"] is not None), key=lambda r: r["n"])
        if len(s_) > 1:
            verdicts[f"{m}_grows"] = {"ratios": [r["ratio"] for r in s_],
                                      "grows": all(b["ratio"] > a["ratio"] for a, b in zip(s_, s_[1:]))}
    res["rows"], res["verdicts"] = rows, verdicts

    print(f"\nhwfs replication across nodes: {res['size_bytes'] / 2**30:.2f} GiB version "
          f"({res['tensors']} x {res['tensor_mib']:g} MiB tensors), links tbf {res['rate']} each way, "
          f"S/B = {sb:.2f} s; {'median of ' + str(res['reps']) + ' runs' if res['reps'] > 1 else '1 run each'}; "
          f"arenas {'preallocated at mount' if res.get('preallocate') else 'allocated on demand'}\n")
    if "link_check" in res:
        lc = res["link_check"]
        print(f"link check: one TCP stream pub -> r1 carries {lc['gbit_s']:.2f} Gbit/s; sender + receiver "
              f"processes use {lc['cpu_s_per_gib']:.2f} CPU s per GiB (machine {lc['machine_busy'] * 100:.0f}% busy)\n")
    hdr = (f"{'method':8} {'N':>2} {'repl s':>8} {'x S/B':>7} {'pub+repl s':>10} {'x S/B':>7} "
           f"{'CPU s':>6} {'busy':>5} {'target':>8}  result")
    print(hdr)
    print("-" * len(hdr))
    for row in rows:
        print(f"{row['method']:8} {row['n']:>2} {fmt(row['replication_s'], '8.2f')} {fmt(row['ratio'], '7.2f')} "
              f"{fmt(row['total_s'], '10.2f')} {fmt(row['total_ratio'], '7.2f')} "
              f"{fmt(row['proc_cpu_s'], '6.1f')} {fmt(row['machine_busy'], '4.0f', 100)}% "
              f"{row['target']:>8}  {row['result']}")
        if row["method"] != "rsync":
            sim_compare(row, {"topology": row["method"], "n": row["n"], "size": res["size_bytes"],
                              "shard": int(res["tensor_mib"] * (1 << 20)) // 8192 * 8192, "link": res["rate"],
                              "io_threads": row.get("io_threads", 1)},
                        res["machine"]["cores"])
    if any(row.get("roles_cpu_s_per_gib") for row in rows):
        lc = res.get("link_check") or {}
        print("\nreplication CPU s per GiB by role (the daemons' own thread clocks, status replication.cpu: "
              "agent thread + ZeroMQ I/O + codec workers; publisher per GiB sent, relay and leaf per GiB "
              f"received); raw TCP sender + receiver: {fmt(lc.get('cpu_s_per_gib'), '4.2f')}")
        for row in rows:
            if not row.get("roles_cpu_s_per_gib"):
                continue
            parts = [f"{role} {v['all']:.2f} (agent {v['agent']:.2f}, I/O {v['io']:.2f}, codec {v['codec']:.2f})"
                     for role, v in sorted(row["roles_cpu_s_per_gib"].items(),
                                           key=lambda kv: ("publisher", "relay", "leaf").index(kv[0]))]
            raw = f"; {row['x_raw_tcp']:.2f} x one raw TCP stream" if row.get("x_raw_tcp") else ""
            print(f"  {row['method']:8} N={row['n']}: " + ", ".join(parts) + raw)
    for row in rows:
        for why in row["failures"]:
            print(f"  FAILED {row['method']} N={row['n']}: {why}")
    print("  repl s: from the end of `hwfs publish` until MNT/versions/V exists on every receiver "
          "(rsync: all clients done)")
    print("  pub+repl s: from the start of `hwfs publish` (local import, no network)")
    print(f"  CPU s: CPU seconds of the daemons + coordinator (rsync: all rsync processes) during repl; busy: "
          f"all {res['machine']['cores']} cores of the machine, during repl")
    if "chain_flat" in verdicts:
        v = verdicts["chain_flat"]
        print(f"  chain flat in N: max/min ratio {v['max_over_min']:.2f} (<= 1.15)  {v['result']}")
    for m in ("star", "rsync"):
        if f"{m}_grows" in verdicts:
            v = verdicts[f"{m}_grows"]
            print(f"  {m} grows with N: {' -> '.join(f'{x:.2f}' for x in v['ratios'])}  "
                  f"{'yes' if v['grows'] else 'no'}")
    if res.get("commit", {}).get("failed"):
        print(f"\ncommit latency: FAILED: {res['commit']['failed']}")
    elif res.get("commit"):
        c = res["commit"]
        print(f"\ncommit latency ({c['nodes']} nodes, chain, `hwfs commit` on {c['from']}, {c['commits']} commits): "
              f"p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms (max {c['max_ms']:.1f} ms)  "
              f"target p99 <= {TARGET_COMMIT_P99_MS:g} ms  {'PASS' if c['p99_ms'] <= TARGET_COMMIT_P99_MS else 'MISS'}")
        print_commit_breakdown(c.get("breakdown"))
    print("\nCPU seconds per process during replication, user+system (kernel network work in softirq "
          "is not always charged to them):")
    for r in res["runs"]:
        if r.get("failed"):
            continue
        cs = ", ".join(f"{k} {v[0]:.1f}+{v[1]:.1f}" for k, v in r["cpu_s_replication"].items() if v is not None)
        extra = ""
        pub_out = r.get("tbf", {}).get("links", {}).get("pub out", {}).get("bytes")
        if pub_out is not None:
            extra += f"; pub's link carried {pub_out / res['size_bytes']:.1f}x the version (wire bytes)"
        flt = [v for k, v in r.get("minflt_replication", {}).items() if k.startswith("r") and v is not None]
        if flt:
            extra += f"; {statistics.mean(flt) * 4096 / res['size_bytes']:.2f} page faults per 4 KiB received"
        print(f"  {r['method']:7} N={r['n']} run {r['rep'] + 1}: {cs}{extra}")
    print(f"\ncaveat: all {res['machine']['cores']} cores of this one machine run every node, the kernel's "
          "veth/bridge forwarding and the tmpfs writes; when CPU busy is near 100% the CPU, not the "
          "links, is the bottleneck, and the ratios are upper bounds of what real links would show.")


if __name__ == "__main__":
    sys.exit(main())
