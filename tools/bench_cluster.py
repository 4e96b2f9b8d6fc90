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
                               of the command), p50 / p99.

Every time is also given as a ratio to S/B (size over link rate, 1 Gbit =
1e9 bit): 1 GiB / 1 Gbit/s = 8.59 s.  Target: chain <= 1.15x S/B and flat in
N; star and rsync are expected to grow with N (the publisher's link carries
every copy).  Results go to stdout as a table and to build/bench-cluster.json.

Everything runs on this machine's cores: with 2 cores, moving several GB/s
through veths, hashing and writing into tmpfs may make the CPU the
bottleneck rather than the links; the table shows CPU-busy % and the daemons'
CPU seconds for that reason.

Everything this script creates (namespaces, veths, bridge, mounts, processes,
temp dirs) carries the script's pid in its name and is torn down in a finally
block, also on Ctrl-C or SIGTERM.  Needs root, iproute2, rsync, fuse3, numpy.
The helpers it shares with the other benchmarks are in tools/benchlib.py.

  python3 tools/bench_cluster.py              full run (several minutes)
  python3 tools/bench_cluster.py --quick      N = 2, 4 and 256 MiB (development)
  python3 tools/bench_cluster.py --reps 3     repeat every (method, N); median reported
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

from benchlib import (CMD_TIMEOUT, HWFS, REPO, fmt, git_describe, ignore_interrupts, interrupt_on_term, logger,
                      machine, mount_daemon, mounted, pctl, read_log, run, safetensors_header, stop_node, stop_proc,
                      tail, write_json)

SEED = 20240607
SUBNET = "10.201.7"          # /24 that exists only inside this script's namespaces
COORD_IP = f"{SUBNET}.2"
COORD_PORT = 7000
NODE_PORT = 7100
RSYNC_PORT = 8873
POLL_S = 0.020
RATE = "1gbit"
CHAIN_TARGET = 1.15
METHODS = ("chain", "tree:2", "star", "rsync")

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
            ["--preallocate"] if self.preallocate else [])
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
        c0, m0, qd0 = cpu_snapshot(pids), machine_cpu(), net.qdisc_stats()
        f0 = {k: proc_minflt(p) for k, p in pids.items()}
        t0 = time.monotonic()
        pub.cmd("publish", ctx["srcdir"], version, timeout=600)
        t_pub = time.monotonic()
        c1, m1 = cpu_snapshot(pids), machine_cpu()
        f1 = {k: proc_minflt(p) for k, p in pids.items()}
        arrival = {}
        pending = {x.name: x for x in recv}
        deadline = t_pub + ctx["timeout"]
        failed, gave_up_since, next_log_check = None, None, t_pub + 0.5
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
        # check: every receiver holds exactly the publisher's version
        digest = next(v["digest"] for v in pub.status()["versions"] if v["name"] == version)
        rx = {}
        for x in recv:
            st = x.status()
            v = next((v for v in st["versions"] if v["name"] == version), None)
            if not v or v["state"] != "sealed" or v["digest"] != digest:
                raise RuntimeError(f"{version} on {x.name}: {v} (publisher's digest {digest})")
            rx[x.name] = st.get("replication", {})
        rx[pub.name] = pub.status().get("replication", {})
        busy = (m2[0] - m1[0]) / max(1, m2[1] - m1[1])
        return {
            "replication_s": end - t_pub, "total_s": end - t0, "publish_s": t_pub - t0,
            "arrival_s": {k: round(v - t_pub, 3) for k, v in sorted(arrival.items())},
            "cpu_s_replication": cpu_delta(c1, c2), "cpu_s_publish": cpu_delta(c0, c1),
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
        last = names[(commits - 1) % 2]
        for x in nodes:
            cur = os.readlink(os.path.join(x.mnt, "current"))
            if cur != f"versions/{last}":
                raise RuntimeError(f"after the commits {x.name}'s current is {cur}, expected versions/{last}")
        return {"nodes": n_nodes, "from": node.name, "commits": commits,
                "p50_ms": round(statistics.median(lat), 2), "p99_ms": round(pctl(lat, 99), 2),
                "min_ms": round(min(lat), 2), "max_ms": round(max(lat), 2),
                "samples_ms": [round(x, 2) for x in lat]}
    finally:
        cl.stop()


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
        sys.exit("bench-cluster: numpy is needed (tools/install-deps.sh)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    tensors = a.tensors or (8 if a.quick else 32)
    size_est = int(tensors * a.tensor_mib * (1 << 20))
    maxn = max(ns_list)
    hosts = max(maxn, 3 if a.commits > 0 else 1)   # the commit latency needs pub + r1..r3

    # /dev/shm must hold the source, maxN+1 stores (or maxN rsync copies) and a margin;
    # a preallocated store holds its whole capacity (1.5 x the version + 64 MiB).
    free = shutil.disk_usage("/dev/shm").free
    per_store = 1.5 if not a.no_preallocate else 1.0
    need = lambda t: int(t * a.tensor_mib * (1 << 20) * (1 + per_store * (maxn + 1))) + (576 << 20)  # noqa: E731
    if free < need(tensors):
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
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["python3", "tools/bench_cluster.py"]
                                                                           + sys.argv[1:]),
           "machine": machine(),
           "rate": a.rate, "rate_bps": rate_bps(a.rate), "tensors": tensors, "tensor_mib": a.tensor_mib,
           "receivers": ns_list, "reps": a.reps, "statistic": "median", "capacity": capacity,
           "preallocate": not a.no_preallocate, "runs": []}
    interrupted = False
    try:
        # Run a private copy of the binary: a rebuild of build/hwfs during the run changes nothing.
        global HWFS
        os.makedirs(os.path.join(work, "bin"))
        res["binary"] = HWFS
        HWFS = shutil.copy2(HWFS, os.path.join(work, "bin", "hwfs"))
        res["git"] = git_describe()
        srcdir = os.path.join(work, "src")
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

        for m in methods:
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
        if a.commits > 0:
            log(f"commit latency: 4 nodes, {a.commits} commits ...")
            try:
                res["commit"] = commit_latency(ctx, 4, a.commits)
                log(f"  p50 {res['commit']['p50_ms']:.1f} ms, p99 {res['commit']['p99_ms']:.1f} ms")
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                log(f"  FAILED: {e}")
                res["commit"] = {"failed": str(e)}
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
               "total_ratio": None, "machine_busy": None, "proc_cpu_s": None, "samples_s": [round(r["replication_s"], 3) for r in ok]}
        if ok:
            rep_s = statistics.median(r["replication_s"] for r in ok)
            tot_s = statistics.median(r["total_s"] for r in ok)
            row.update(replication_s=round(rep_s, 3), total_s=round(tot_s, 3), ratio=round(rep_s / sb, 3),
                       total_ratio=round(tot_s / sb, 3),
                       machine_busy=statistics.median(r["machine_busy"] for r in ok),
                       proc_cpu_s=round(statistics.median(
                           sum(sum(v) for v in r["cpu_s_replication"].values() if v) for r in ok), 2))
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
              f"p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms (max {c['max_ms']:.1f} ms)")
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
    write_json(res, json_path)
    print(f"\nresults written to {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
