#!/usr/bin/env python3
"""bench_engine.py — what an engine sees (`make bench-engine`).

Part 1, one node: a 2 GiB safetensors version (two files; bf16 matrices of a
7B-like layer shape and f32 norms, random bytes) is published into a mount
whose store is on /dev/shm, and the same two files are kept on tmpfs.
--tmpfs DIR puts both (the store and the baseline files) under DIR instead;
--huge mounts a private tmpfs with huge=within_size for them (root; removed
at the end), so the arena and the baseline files are in transparent huge
pages alike.  In one run, each repetition times, back to back:

  map        hwfs.open(MNT).map(V) (the Python package over libhwfs: the
             daemon passes its arena read-only, no byte is copied), then touch
  load_file  safetensors.torch.load_file(F) of the tmpfs copy (the baseline:
             the same bytes in a file on tmpfs), then touch
  pread      the same with backend="pread" (load_file copies every byte into
             fresh memory), then touch                             (info)
  mmap       mmap(MAP_SHARED, PROT_READ) of each tmpfs file, no safetensors:
             the cheapest way to have the bytes in the process     (info)
  mnt cold   load_file(MNT/versions/V/F) right after the kernel's page cache
             was dropped (echo 3 > /proc/sys/vm/drop_caches), then touch
  mnt warm   the same again, page cache warm, then touch

"touch" is the same for all: one byte read from every 4 KiB page of every
tensor (numpy sum over a page-strided uint8 view), so every byte of the
version is mapped into the process when the clock stops.  --touch full reads
every byte instead (numpy sum over uint64 views; adds the same memory-bandwidth
cost to every row).  Ratios are baseline time / method time (> 1: faster than
the baseline); the median of --reps is reported.

Part 2, a cluster on loopback: a coordinator and --nodes daemons (--insecure,
ports the daemons pick), one C engine (build/hwfs-engine) registered on each.
Two versions (--cluster-mib each) are published on the first node and
replicated to all; then --commits `hwfs commit` alternate between them, issued
on the last node.  Timed per commit: from the start of `hwfs commit` until it
has returned and every engine's socket answers the new version (each engine
answers a request line with {"version", "digest", ...}; the script asks the
sockets in turn once the command returned: asking while the commit runs
would take the cores it runs on, each answer being a pass over the version).
The swap pause per engine and commit comes from `hwfs status --json`
(engines[].last_swap_pause_us, checked against the swap counter).

Targets printed beside the figures: map+touch >= 2x load_file from tmpfs;
commit -> all serving p99 <= 10 ms; `hwfs commit` with no engine p99 <= 6 ms;
swap pause p99 <= 1 ms.  Part 2 also prints where the time of the last 20
commits went (the coordinator's commit history: PREPARE round, the decision's
record, COMMIT round, each node's own check and flip, and what is outside the
coordinator: the CLI's start, the control socket, the agent's relay), and
the same commits over the control socket without the CLI.  Results go to
stdout as a table and to build/bench-engine.json.  Everything started here is
stopped by pid and every temp dir removed in a finally (also on Ctrl-C).  The
helpers it shares with the other benchmarks are in tools/bench/benchlib.py.

  python3 tools/bench/bench_engine.py            full run (about a minute on 2 cores)
  python3 tools/bench/bench_engine.py --quick    small sizes, few reps (checks it runs)
"""

import argparse
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import (CMD_TIMEOUT, DTYPE_SIZE, HWFS, REPO, commit_breakdown, drop_caches, git_describe,
                      ignore_interrupts, interrupt_on_term, logger, machine, mount_daemon, mounted, pctl,
                      print_commit_breakdown, run, safetensors_header, stop_node, stop_proc, tail,
                      write_json)

ENGINE = os.environ.get("HWFS_ENGINE_BIN") or str(REPO / "build" / "hwfs-engine")
sys.path.insert(0, str(REPO / "tools" / "python"))

SEED = 20261123
PAGE = 4096
TARGET_MAP = 2.0          # map+touch >= 2x load_file from tmpfs
TARGET_SERVE_P99_MS = 10.0  # issue 20 (was 20 ms): 4 nodes, a C engine on each
TARGET_BARE_P99_MS = 6.0  # issue 20: 4 nodes, no engine (`hwfs commit` returns)
TARGET_PAUSE_P99_US = 1000.0
LISTENING = re.compile(r"coord: listening on (tcp://\S+)")


log = logger("bench-engine")
DROP = 3                  # what drop_caches drops: the page cache, dentries and inodes


# --------------------------------------------------------------------------
# the model: a 7B-like set of tensors (bf16 matrices, f32 norms), random bytes


def model_layout(gib):
    """[(file, [(name, dtype, shape)])] of about @gib GiB in two files."""
    if gib >= 1:
        hidden, inter, vocab = 4096, 11008, 32000
    else:                                   # --quick: same structure, small
        hidden, inter, vocab = 512, 1376, 4000
    per_layer = (4 * hidden * hidden + 3 * hidden * inter) * 2 + 2 * hidden * 4
    fixed = 2 * vocab * hidden * 2 + hidden * 4
    layers = max(1, round((gib * (1 << 30) - fixed) / per_layer))
    tensors = [("model.embed_tokens.weight", "BF16", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", "F32", [hidden]),
                    (p + "self_attn.q_proj.weight", "BF16", [hidden, hidden]),
                    (p + "self_attn.k_proj.weight", "BF16", [hidden, hidden]),
                    (p + "self_attn.v_proj.weight", "BF16", [hidden, hidden]),
                    (p + "self_attn.o_proj.weight", "BF16", [hidden, hidden]),
                    (p + "post_attention_layernorm.weight", "F32", [hidden]),
                    (p + "mlp.gate_proj.weight", "BF16", [inter, hidden]),
                    (p + "mlp.up_proj.weight", "BF16", [inter, hidden]),
                    (p + "mlp.down_proj.weight", "BF16", [hidden, inter])]
    tensors += [("model.norm.weight", "F32", [hidden]), ("lm_head.weight", "BF16", [vocab, hidden])]
    half = len(tensors) // 2
    return [("model-00001-of-00002.safetensors", tensors[:half]),
            ("model-00002-of-00002.safetensors", tensors[half:])]


def write_safetensors(path, tensors, seed):
    """Write @tensors [(name, dtype, shape)] with random bytes; return the file size."""
    import numpy as np

    head, _, size = safetensors_header(tensors, "hwfs bench-engine")
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(head)
        for name, dt, shape in tensors:
            n = DTYPE_SIZE[dt] * math.prod(shape)
            while n > 0:
                k = min(n, 64 << 20)
                f.write(rng.bytes(k))
                n -= k
    return len(head) + size


def write_model(d, gib, seed):
    os.makedirs(d, exist_ok=True)
    total, count = 0, 0
    for i, (fname, tensors) in enumerate(model_layout(gib)):
        total += write_safetensors(os.path.join(d, fname), tensors, [seed, i])
        count += len(tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["BenchForCausalLM"], "generator": "hwfs bench-engine"}, f)
    return total, count


# --------------------------------------------------------------------------
# touching the bytes


def touch_array(a, mode):
    """Read @a (a uint8 numpy array): one byte per page, or every byte. Returns a number."""
    import numpy as np

    if mode == "page":
        return int(a[::PAGE].sum(dtype=np.uint64)) + int(a[-1])
    n8 = a.size // 8 * 8
    s = int(a[:n8].view(np.uint64).sum(dtype=np.uint64)) if n8 else 0
    return s + int(a[n8:].sum(dtype=np.uint64))


def touch_torch(tensors, mode):
    import torch

    total = 0
    for t in tensors.values():
        if t.numel():
            total += touch_array(t.reshape(-1).view(torch.uint8).numpy(), mode)
    return total


def load_file_touch(files, mode, backend=None):
    """load_file every file, touch every tensor; returns (seconds, tensors)."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    n = 0
    for f in files:
        d = load_file(f) if backend is None else load_file(f, backend=backend)
        touch_torch(d, mode)
        n += len(d)
        del d
    return time.perf_counter() - t0, n


def mmap_touch(files, mode):
    """mmap every file read-only (MAP_SHARED), touch its bytes: the cheapest way a
    process gets a tmpfs file's bytes (header included); returns seconds."""
    import mmap
    import numpy as np

    t0 = time.perf_counter()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        a = np.frombuffer(m, dtype=np.uint8)
        touch_array(a, mode)
        del a
        m.close()
    return time.perf_counter() - t0


def map_touch(mount, version, mode):
    """hwfs.open(mount).map(version), touch every tensor; returns (seconds, tensors, bytes)."""
    import numpy as np
    import hwfs

    t0 = time.perf_counter()
    with hwfs.open(mount) as h:
        m = h.map(version)
        n, nbytes = 0, 0
        for ti in m.tensors():
            a = np.frombuffer(m.buffer(f"{ti.file}:{ti.name}"), dtype=np.uint8)
            if a.size:
                touch_array(a, mode)
            n += 1
            nbytes += a.size
            del a
        dt = time.perf_counter() - t0
        m.close()
        if not m.unmapped:
            raise RuntimeError(f"the mapping of {version} outlived its last array")
    return dt, n, nbytes


# --------------------------------------------------------------------------
# daemons, coordinator, engines


class Node:
    """One `hwfs mount` (standalone or joined), stopped by its pid in cleanup()."""

    def __init__(self, name, root, capacity):
        self.name = name
        self.mnt = tempfile.mkdtemp(prefix=f"hwfsbe-mnt-{name}-")
        self.store = os.path.join(root, f"store-{name}")
        os.makedirs(self.store)
        self.capacity = capacity
        self.pid = None

    def cmd(self, *args, check=True, timeout=CMD_TIMEOUT):
        """`hwfs ARGS -m MNT`."""
        return run([HWFS, *args, "-m", self.mnt], check=check, timeout=timeout)

    def status(self):
        return json.loads(self.cmd("status", "--json").stdout)

    def mount(self, extra=()):
        """`hwfs mount` (it daemonizes); @extra: e.g. --join URL --node N --listen ..."""
        mount_daemon([HWFS, "mount", self.mnt, "--store", self.store, "--capacity", self.capacity, *extra])
        self.pid = int(self.status()["pid"])

    def has(self, version):
        return os.path.isdir(os.path.join(self.mnt, "versions", version))

    def cleanup(self):
        """Unmount (lazily if need be), SIGKILL the daemon by its pid if it stays, remove the dir."""
        stop_node(HWFS, self.mnt, self.pid)
        self.pid = None
        if not mounted(self.mnt):
            shutil.rmtree(self.mnt, ignore_errors=True)


class Engine:
    """build/hwfs-engine on one node: answers each request line on a unix socket."""

    def __init__(self, node, sockdir, procs):
        self.node, self.name = node, f"eng-{node.name}"
        self.path = os.path.join(sockdir, f"{self.name}.sock")
        self.logpath = os.path.join(sockdir, f"{self.name}.log")
        self.procs = procs
        self.proc, self.sock, self.buf, self.log = None, None, b"", None

    def start(self):
        """Start the engine (its stderr to a log) and wait until its socket answers."""
        self.log = open(self.logpath, "ab")
        self.proc = subprocess.Popen([ENGINE, "-m", self.node.mnt, "--name", self.name, "--listen", self.path],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.procs.append(self.proc)
        end = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                self.connect()
                self.query()
                return
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError(f"{self.name} did not answer on {self.path} in 30 s: {self.log_tail()}")
                time.sleep(0.05)

    def connect(self):
        if self.sock:
            self.sock.close()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)       # an engine that stops answering fails the run, not hangs it
        self.sock.connect(self.path)
        self.buf = b""

    def query(self):
        """One request line, one answer line: the engine's JSON object."""
        self.ask()
        return self.answer()

    def ask(self):
        """Send one request line (answer() reads its answer)."""
        self.sock.sendall(b"{}\n")

    def answer(self):
        """The answer line of the last ask(): the engine's JSON object."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError(f"{self.name} closed its socket")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def log_tail(self, n=10):
        return tail(self.logpath, n)

    def stop(self):
        if self.sock:
            self.sock.close()
            self.sock = None
        if self.proc:
            stop_proc(self.proc)
        if self.log:
            self.log.close()
            self.log = None


def start_coord(work, procs):
    """`hwfs coord` on a port it picks (loopback, --insecure), in the foreground under
    Popen; returns (Popen, the endpoint it logged, its open log file)."""
    logpath = os.path.join(work, "coord.log")
    logf = open(logpath, "ab")
    p = subprocess.Popen([HWFS, "coord", "--listen", "tcp://127.0.0.1:*", "--state",
                          os.path.join(work, "coord-state"), "--insecure", "-f"],
                         stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(p)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with open(logpath, errors="replace") as f:
            text = f.read()
        if p.poll() is not None:
            raise RuntimeError(f"hwfs coord exited ({p.returncode}): {text[-2000:]}")
        m = LISTENING.search(text)
        if m:
            return p, m.group(1), logf
        time.sleep(0.05)
    raise RuntimeError("hwfs coord did not log its endpoint in 10 s")


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"{what} within {timeout:g} s")
        time.sleep(0.02)


def engines_of(node):
    return {e["name"]: e for e in node.status().get("engines", [])}


# --------------------------------------------------------------------------
# part 1: one node


def part_map(a, ctx):
    work = ctx["work"]
    src = os.path.join(work, "src")
    log(f"writing a {a.gib:g} GiB model to {src} (tmpfs)")
    t = time.monotonic()
    size, ntensors = write_model(src, a.gib, SEED)
    files = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
    log(f"  {size / 2**30:.2f} GiB, {ntensors} tensors in {len(files)} files, {time.monotonic() - t:.1f} s")
    cap = f"{int(size * 1.25 / 2**20) + 256}M"
    node = Node("single", work, cap)
    ctx["nodes"].append(node)
    node.mount()
    node.cmd("publish", src, "v1", timeout=600)
    mfiles = [os.path.join(node.mnt, "versions", "v1", os.path.basename(f)) for f in files]
    rows = {k: [] for k in ("map", "load_file", "pread", "mmap", "mnt_cold", "mnt_warm")}
    # One untimed pass of each first (imports, the first mapping of the arena).
    map_touch(node.mnt, "v1", a.touch)
    load_file_touch(files, a.touch)
    # The tmpfs rows come before any drop_caches: on this kernel, mapping a tmpfs
    # file after `echo 3 > drop_caches` costs about 4x more per page than before
    # (measured: 0.16 s -> 0.67 s for 2 GiB), which would slow the baseline.
    for rep in range(a.reps):
        dt, n, nb = map_touch(node.mnt, "v1", a.touch)
        if n != ntensors:
            raise RuntimeError(f"map gave {n} tensors, the model has {ntensors}")
        rows["map"].append(dt)
        rows["load_file"].append(load_file_touch(files, a.touch)[0])
        rows["pread"].append(load_file_touch(files, a.touch, backend="pread")[0])
        rows["mmap"].append(mmap_touch(files, a.touch))
        log(f"  rep {rep + 1}/{a.reps}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in rows.items() if v))
    can_drop = drop_caches(DROP)
    if not can_drop:
        log("cannot write /proc/sys/vm/drop_caches (not root?): the cold row is skipped")
    for rep in range(a.reps):
        if can_drop:
            drop_caches(DROP)
            rows["mnt_cold"].append(load_file_touch(mfiles, a.touch)[0])
        rows["mnt_warm"].append(load_file_touch(mfiles, a.touch)[0])
        log(f"  mount rep {rep + 1}/{a.reps}: cold {rows['mnt_cold'][-1] if can_drop else float('nan'):.3f} s, "
            f"warm {rows['mnt_warm'][-1]:.3f} s")
    node.cleanup()
    ctx["nodes"].remove(node)
    base = statistics.median(rows["load_file"])
    out = {"bytes": size, "tensors": ntensors, "files": len(files), "touch": a.touch, "reps": a.reps,
           "cold_measured": can_drop, "rows": {}}
    for k, v in rows.items():
        if not v:
            continue
        med = statistics.median(v)
        out["rows"][k] = {"median_s": round(med, 4), "gbps": round(size / med / 1e9, 3),
                          "ratio_vs_load_file": round(base / med, 3), "samples_s": [round(x, 4) for x in v]}
    return out


# --------------------------------------------------------------------------
# part 2: commit -> every engine serving


def cluster_commits(node):
    """The coordinator's history of the last commits (`hwfs status --cluster --json`)."""
    return json.loads(node.cmd("status", "--cluster", "--json").stdout).get("commits", [])


def ctl_commit(path, version):
    """One commit over the daemon's control socket @path (what `hwfs commit` asks)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(json.dumps({"op": "commit", "version": version}).encode() + b"\n")
        res = json.loads(s.makefile("rb").readline())
    if not res.get("ok"):
        raise RuntimeError(f"commit of {version} over the control socket: {res}")


def part_commit(a, ctx):
    work, procs = ctx["work"], ctx["procs"]
    cdir = os.path.join(work, "cluster")
    os.makedirs(cdir)
    coord, url, logf = start_coord(cdir, procs)
    ctx["files"].append(logf)
    cap = f"{int(a.cluster_mib * 3) + 128}M"
    nodes = [Node(f"n{i}", cdir, cap) for i in range(a.nodes)]
    ctx["nodes"].extend(nodes)
    for n in nodes:
        n.mount(["--join", url, "--node", n.name, "--listen", "tcp://127.0.0.1:*", "--insecure"])
    want = {n.name for n in nodes}

    def formed():
        cs = json.loads(nodes[0].cmd("status", "--cluster", "--json", check=False).stdout or "{}")
        return {x.get("name") for x in cs.get("nodes", []) if x.get("alive")} >= want
    wait_for(formed, 30, "the cluster did not form")
    names = ("ca", "cb")
    digests = {}
    for k, v in enumerate(names):
        src = os.path.join(cdir, f"src-{v}")
        os.makedirs(src)
        write_safetensors(os.path.join(src, "model.safetensors"),
                          [(f"w{i}", "BF16", [int(a.cluster_mib * 2**20) // 8 // 4096, 4096]) for i in range(4)],
                          [SEED, 100 + k])
        nodes[0].cmd("publish", src, v)
        digests[v] = next(x["digest"] for x in nodes[0].status()["versions"] if x["name"] == v)
    wait_for(lambda: all(n.has(v) for n in nodes for v in names), 120, "the versions did not reach every node")
    committer = nodes[-1]
    # Reference: the same commits with no engine registered (the barrier then
    # waits for nothing; the time is the two-phase commit alone).
    bare_ms = []
    for i in range(a.commits):
        t0 = time.perf_counter()
        committer.cmd("commit", names[i % 2])
        bare_ms.append((time.perf_counter() - t0) * 1000)
    bare_bd = commit_breakdown(cluster_commits(committer), bare_ms)
    # The same over the control socket (no `hwfs commit` process to start):
    # the daemon's and the cluster's share of the time.
    ctl_path = os.getxattr(committer.mnt, "user.hwfs.control").decode()
    ctl_ms = []
    for i in range(a.commits):
        t0 = time.perf_counter()
        ctl_commit(ctl_path, names[i % 2])
        ctl_ms.append((time.perf_counter() - t0) * 1000)
    engines = [Engine(n, cdir, procs) for n in nodes]
    ctx["engines"].extend(engines)
    for e in engines:
        e.start()
    wait_for(lambda: all(e.name in engines_of(e.node) for e in engines), 30, "the engines did not register")
    committer.cmd("commit", names[1])                       # warm-up, not counted
    wait_for(lambda: all(e.query().get("version") == names[1] for e in engines), 30,
             f"the engines did not serve {names[1]} after the warm-up commit")
    serve_ms, cmd_ms, pauses = [], [], []
    swaps = {e.name: engines_of(e.node)[e.name].get("swaps") for e in engines}
    for i in range(a.commits):
        v = names[i % 2]
        t0 = time.perf_counter()
        p = subprocess.Popen([HWFS, "commit", v, "-m", committer.mnt], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The command is waited for first, without asking the engines: each
        # question costs its engine a pass over the version's bytes (the
        # checksum) and the script a core, which the commit's processes, on
        # the same cores, would wait for (issue 29).  Then each engine is
        # asked until it serves @v, all of them at once (each answer is a
        # pass over the version's bytes): "every engine serves it" is the
        # later of the command's return and the last engine's swap (never
        # earlier than the engines served it).
        out, err = p.communicate(timeout=60)
        t_cmd = time.perf_counter()
        if p.returncode != 0:
            raise RuntimeError(f"hwfs commit {v} failed ({p.returncode}): {err.strip()}")
        pending = list(engines)
        deadline = t0 + 30
        while pending:
            for e in pending:      # every engine computes its answer at once
                e.ask()
            for e in list(pending):
                ans = e.answer()
                if ans.get("version") == v:
                    if ans.get("digest") != digests[v]:
                        raise RuntimeError(f"{e.name} serves {v} with digest {ans.get('digest')}, "
                                           f"expected {digests[v]}")
                    pending.remove(e)
            if time.perf_counter() > deadline:
                raise RuntimeError(f"commit {i} of {v}: {[e.name for e in pending]} did not serve it in 30 s")
        t_all = time.perf_counter()
        serve_ms.append((t_all - t0) * 1000)
        cmd_ms.append((t_cmd - t0) * 1000)
        if i == a.commits - 1:
            eng_bd = commit_breakdown(cluster_commits(committer), cmd_ms)
        for e in engines:
            rec = engines_of(e.node)[e.name]
            if rec.get("swaps") is not None and swaps[e.name] is not None and rec["swaps"] <= swaps[e.name]:
                raise RuntimeError(f"{e.name}: the swap counter did not grow after commit {i} ({rec})")
            swaps[e.name] = rec.get("swaps")
            pauses.append(rec.get("last_swap_pause_us"))
    pauses = [x for x in pauses if x is not None]
    return {"nodes": a.nodes, "commits": a.commits, "version_bytes": int(a.cluster_mib * 2**20),
            "from": committer.name,
            "serve_p50_ms": round(statistics.median(serve_ms), 3), "serve_p99_ms": round(pctl(serve_ms, 99), 3),
            "serve_max_ms": round(max(serve_ms), 3),
            "cmd_p50_ms": round(statistics.median(cmd_ms), 3), "cmd_p99_ms": round(pctl(cmd_ms, 99), 3),
            "bare_p50_ms": round(statistics.median(bare_ms), 3), "bare_p99_ms": round(pctl(bare_ms, 99), 3),
            "ctl_p50_ms": round(statistics.median(ctl_ms), 3), "ctl_p99_ms": round(pctl(ctl_ms, 99), 3),
            "bare_breakdown": bare_bd, "engine_breakdown": eng_bd,
            "bare_samples_ms": [round(x, 3) for x in bare_ms],
            "pause_p50_us": statistics.median(pauses) if pauses else None,
            "pause_p99_us": pctl(pauses, 99) if pauses else None,
            "pause_samples": len(pauses),
            "serve_samples_ms": [round(x, 3) for x in serve_ms]}


# --------------------------------------------------------------------------


def teardown(ctx):
    for e in ctx["engines"]:
        try:
            e.stop()
        except Exception as ex:  # keep going: the rest must be stopped too
            log(f"warning: stopping {e.name}: {ex}")
    for n in reversed(ctx["nodes"]):
        try:
            n.cleanup()
        except Exception as ex:
            log(f"warning: unmounting {n.name}: {ex}")
    for p in ctx["procs"]:
        try:
            stop_proc(p)
        except Exception:
            pass
    for f in ctx["files"]:
        f.close()
    shutil.rmtree(ctx["work"], ignore_errors=True)
    if ctx.get("huge_dir"):
        run(["umount", ctx["huge_dir"]], check=False)
        os.rmdir(ctx["huge_dir"])


def verdict(ok):
    return "PASS" if ok else "MISS"


def report(res, path):
    m = res.get("map")
    print()
    if m:
        print(f"hwfs engines, part 1: a {m['bytes'] / 2**30:.2f} GiB version ({m['tensors']} tensors, "
              f"{m['files']} files) into process memory; touch = {m['touch']} "
              f"({'one byte per 4 KiB page' if m['touch'] == 'page' else 'every byte'}); "
              f"median of {m['reps']}; store and baseline files on {res.get('tmpfs', '/dev/shm')}\n")
        hdr = f"{'method':40} {'s':>8} {'GB/s':>7} {'x base':>7} {'target':>8}  result"
        print(hdr)
        print("-" * len(hdr))
        labels = {"map": "hwfs map (libhwfs, zero-copy) + touch",
                  "load_file": "load_file tmpfs + touch (baseline)",
                  "pread": "load_file tmpfs backend=pread + touch",
                  "mmap": "mmap tmpfs file (no safetensors) + touch",
                  "mnt_cold": "load_file mount, cold + touch",
                  "mnt_warm": "load_file mount, warm + touch"}
        for k, lab in labels.items():
            r = m["rows"].get(k)
            if not r:
                print(f"{lab:40} {'-':>8} {'-':>7} {'-':>7} {'':>8}  skipped (drop_caches needs root)")
                continue
            tgt, res_ = "", "info"
            if k == "map":
                tgt, res_ = f">= {TARGET_MAP:g}", verdict(r["ratio_vs_load_file"] >= TARGET_MAP)
            elif k == "load_file":
                res_ = "-"
            print(f"{lab:40} {r['median_s']:8.3f} {r['gbps']:7.2f} {r['ratio_vs_load_file']:7.2f} {tgt:>8}  {res_}")
    c = res.get("commit")
    if c and not c.get("failed"):
        print(f"\nhwfs engines, part 2: {c['nodes']} nodes + coordinator on loopback, a C engine on each, "
              f"two {c['version_bytes'] / 2**20:g} MiB versions, {c['commits']} commits from {c['from']}\n")
        print(f"  commit -> every engine serves it  p50 {c['serve_p50_ms']:.2f} ms  p99 {c['serve_p99_ms']:.2f} ms"
              f"  (target p99 <= {TARGET_SERVE_P99_MS:g} ms)  {verdict(c['serve_p99_ms'] <= TARGET_SERVE_P99_MS)}")
        print(f"  `hwfs commit` returns             p50 {c['cmd_p50_ms']:.2f} ms  p99 {c['cmd_p99_ms']:.2f} ms  (info)")
        print(f"  `hwfs commit`, no engine at all   p50 {c['bare_p50_ms']:.2f} ms  p99 {c['bare_p99_ms']:.2f} ms"
              f"  (target p99 <= {TARGET_BARE_P99_MS:g} ms)  {verdict(c['bare_p99_ms'] <= TARGET_BARE_P99_MS)}")
        print(f"  control socket, no engine, no CLI p50 {c['ctl_p50_ms']:.2f} ms  p99 {c['ctl_p99_ms']:.2f} ms  (info)")
        if c["pause_p99_us"] is not None:
            print(f"  swap pause (engines' reports)     p50 {c['pause_p50_us']} us  p99 {c['pause_p99_us']} us"
                  f"  (target p99 <= {TARGET_PAUSE_P99_US:g} us)  "
                  f"{verdict(c['pause_p99_us'] <= TARGET_PAUSE_P99_US)}")
        else:
            print("  swap pause: no engine reported one  MISS")
        print("\n  no engine:")
        print_commit_breakdown(c.get("bare_breakdown"), "    ")
        print("  with the engines (the barrier waits for each engine's report):")
        print_commit_breakdown(c.get("engine_breakdown"), "    ")
    elif c:
        print(f"\npart 2 FAILED: {c['failed']}")
    print(f"\nmachine: {res['machine']['cores']} cores, {res['machine']['mem_gib']} GiB, kernel "
          f"{res['machine']['kernel']}; every process of the run shares those cores")
    write_json(res, path)
    print(f"results written to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps: checks that it runs")
    ap.add_argument("--gib", type=float, default=None, help="model size in GiB (default 2; --quick 0.06)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of part 1 (default 5; --quick 2)")
    ap.add_argument("--touch", choices=("page", "full"), default="page",
                    help="page: one byte per 4 KiB page (default); full: every byte")
    ap.add_argument("--nodes", type=int, default=4, help="nodes in part 2 (default 4)")
    ap.add_argument("--commits", type=int, default=None, help="commits timed in part 2 (default 50; --quick 10)")
    ap.add_argument("--cluster-mib", type=float, default=1, help="size of each part-2 version (default 1 MiB)")
    ap.add_argument("--skip-map", action="store_true", help="skip part 1")
    ap.add_argument("--tmpfs", default="/dev/shm",
                    help="tmpfs for the store and the baseline files (default /dev/shm)")
    ap.add_argument("--huge", action="store_true",
                    help="a private tmpfs with huge=within_size instead of --tmpfs (root)")
    ap.add_argument("--skip-commit", action="store_true", help="skip part 2")
    ap.add_argument("--json", default=str(REPO / "build" / "bench-engine.json"), help="where to write results")
    a = ap.parse_args()
    a.gib = a.gib if a.gib is not None else (0.0625 if a.quick else 2.0)
    a.reps = a.reps or (2 if a.quick else 5)
    a.commits = a.commits or (10 if a.quick else 50)

    for path, what in ((HWFS, "run make all"), (ENGINE, "build/hwfs-engine: run make all")):
        if not os.access(path, os.X_OK):
            sys.exit(f"bench-engine: {path} not found ({what})")
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        import hwfs  # noqa: F401
    except ImportError as e:
        sys.exit(f"bench-engine: {e} (numpy, safetensors, torch and tools/python/hwfs are needed)")
    need = int(a.gib * 2**30 * 2.6) + (1 << 30)
    huge_dir = None
    if a.huge:
        huge_dir = tempfile.mkdtemp(prefix="hwfsbe-huge-")
        r = run(["mount", "-t", "tmpfs", "-o", f"huge=within_size,size={need}", "tmpfs", huge_dir],
                check=False)
        if r.returncode != 0:
            os.rmdir(huge_dir)
            sys.exit(f"bench-engine: cannot mount a huge-page tmpfs: {r.stderr.strip()}")
        a.tmpfs = huge_dir
    if not a.skip_map and shutil.disk_usage(a.tmpfs).free < need:
        sys.exit(f"bench-engine: {a.tmpfs} needs {need / 2**30:.1f} GiB free")

    interrupt_on_term()

    ctx = {"work": tempfile.mkdtemp(dir=a.tmpfs, prefix="hwfsbe-"), "procs": [], "nodes": [], "engines": [],
           "files": [], "huge_dir": huge_dir}
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "command": " ".join(["python3", "tools/bench/bench_engine.py"] + sys.argv[1:]), "git": git_describe(),
           "machine": machine(), "tmpfs": "huge=within_size" if a.huge else a.tmpfs,
           "targets": {"map_vs_load_file": TARGET_MAP, "serve_p99_ms": TARGET_SERVE_P99_MS,
                       "bare_p99_ms": TARGET_BARE_P99_MS,
                       "pause_p99_us": TARGET_PAUSE_P99_US}}
    rc = 0
    try:
        if not a.skip_map:
            res["map"] = part_map(a, ctx)
        if not a.skip_commit:
            log(f"part 2: {a.nodes} nodes, {a.commits} commits ...")
            try:
                res["commit"] = part_commit(a, ctx)
            except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
                log(f"part 2 FAILED: {e}")
                for eng in ctx["engines"]:
                    log(f"  {eng.name} log: {eng.log_tail(5)}")
                res["commit"] = {"failed": str(e)}
                rc = 1
    except KeyboardInterrupt:
        log("interrupted; tearing down")
        rc = 130
    finally:
        ignore_interrupts()
        teardown(ctx)
    if rc != 130:
        report(res, a.json)
    return rc


if __name__ == "__main__":
    sys.exit(main())
