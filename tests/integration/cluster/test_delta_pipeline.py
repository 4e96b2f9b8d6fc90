"""Deltas at link speed (docs/delta.md, "Codec workers", "Encode ahead", "Cut-through
deltas"): the publisher encodes a sealed version's deltas ahead of demand, relays forward
delta pieces as they arrive while their codec workers rebuild, and a bad delta is still
caught by every node's own hash check — a relay that caught one never passes it on whole.

Order is made deterministic with SIGSTOP rather than timing: a relay stopped while its
puller's GETs queue up, the publisher stopped while its relays' GETs wait, so the GETs of
the next hop are waiting at each relay when the deltas start to flow; and a ptrace stop of
one thread, the codec worker, holds every encode while the rest of the daemon runs.  The
status counters (replication.delta: ahead_encoded, ahead_hits, ahead_cancelled, forwarded,
whole, sent) say what happened.  Clusters come from the ``net`` fixture of cluster/conftest.py.
"""

import contextlib
import ctypes
import os
import platform
import re
import signal
import time

import pytest

from conftest import poll, scaled

from .conftest import Rogue, assert_identical, random_model
from .test_delta import (TENSORS, bad_shards, bf16_model, corrupt_tensor, grew, log_text, model_dir,
                         replication, rl_step, rl_versions, shard_map, start)

# the stopped nodes must not be declared dead, nor their pullers fail over from them
COORD = {"tunables": {"node_dead_ms": 60000}}
NODE_OPTS = ["-o", "donor_silence_ms=60000"]


def planned(node, version):
    return f"{version}: {TENSORS} shard(s) can come as deltas against v1" in log_text(node)


def flow_through_stopped_chain(net, v2, before_a, version="v2"):
    """Publish @v2 on A with B stopped until C (fed by B) planned it and asked B, and A
    stopped (once it encoded v2's deltas ahead: A's delta counters were @before_a) while
    B's own GETs wait: so B, and C after it, hold their pullers' requests when A's deltas
    start to flow.  Returns v2's digest once every node has it."""
    a, b, c = net["A"], net["B"], net["C"]
    a_pid, b_pid = int(a.status()["pid"]), int(b.status()["pid"])
    stopped = []
    try:
        os.kill(b_pid, signal.SIGSTOP)
        stopped.append(b_pid)
        digest = net.publish("A", v2, version)
        # A has sealed it and encodes ahead; C asked B, which sleeps
        assert poll(lambda: planned(c, version), timeout=15, interval=0.05), c.log_tail()
        assert poll(lambda: grew(before_a, replication(a), "delta", "ahead_encoded") >= TENSORS,
                    timeout=30, interval=0.05), replication(a)["delta"]
        os.kill(a_pid, signal.SIGSTOP)
        stopped.append(a_pid)
        os.kill(b_pid, signal.SIGCONT)
        stopped.remove(b_pid)
        assert poll(lambda: planned(b, version), timeout=15, interval=0.05), b.log_tail()
        # C's GETs that B answered MISSING before its plan came are asked again; a
        # second under a sanitizer's slowness was not always enough (scaled)
        time.sleep(scaled(1.0))
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    net.wait_version(version, digest, timeout=60)
    return digest


@pytest.mark.limit(150)
def test_chain_relays_forward_deltas_cut_through(net, tmp_path):
    """A -> B -> C -> D.  A encodes v2's deltas when v2 is sealed (before any GET): every
    delta it encodes is made ahead and the GETs are served from those (ahead_hits).  B and
    C pass A's deltas on to their pullers as they came, and encode nothing: forwarded as
    the pieces arrive, before their own rebuild of each shard is done (cut-through), for
    the GETs they hold when A's deltas start to flow; a GET that reached them only after
    the rebuild (a re-ask that came late: TSan on a loaded machine) gets the kept delta.
    v2 is identical everywhere and no delta failed."""
    start(net, ["A", "B", "C", "D"], coord=COORD, extra=NODE_OPTS)
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    before = {n: replication(net[n]) for n in "ABCD"}

    flow_through_stopped_chain(net, v2, before["A"])
    after = {n: replication(net[n]) for n in "ABCD"}
    for n in "BCD":
        assert_identical(v2, net[n], "v2")
        assert grew(before[n], after[n], "delta", "received") >= TENSORS, after[n]["delta"]
    da = {k: grew(before["A"], after["A"], "delta", k) for k in after["A"]["delta"]}
    print("A:", da)
    assert da["ahead_encoded"] >= TENSORS and da["encoded"] == da["ahead_encoded"], \
        f"A encoded on demand, not ahead: {da}"
    assert da["ahead_hits"] >= TENSORS, f"A's GETs were not served from the deltas made ahead: {da}"
    for n in "BC":
        d = {k: grew(before[n], after[n], "delta", k) for k in after[n]["delta"]}
        print(f"{n}:", d)
        assert d["sent"] >= TENSORS and d["forwarded"] >= 1, \
            f"{n} did not pass the deltas on cut-through: {d}"
        assert d["encoded"] == 0, f"{n} re-encoded deltas it received: {d}"
    for n in "ABCD":
        assert after[n]["delta"]["failed"] == 0, f"{n}: {after[n]['delta']}"


@pytest.mark.limit(150)
def test_relay_that_catches_a_bad_delta_does_not_pass_it_on(net, tmp_path):
    """A's copy of one tensor of v1 is corrupt, so its delta of that tensor is against a
    wrong base.  B forwards it to C as it arrives but holds its last byte until its own
    rebuild is checked: the check fails, C gets MISSING for it (never the whole bad delta)
    and B asks A for the shard whole; C gets it whole from B.  B counts the failed delta
    and reports A; C counts none and nobody reports B or C.  Every other tensor still went
    cut-through, and v2 is identical on B, C and D.  The arenas are preallocated: the
    relays rebuild straight into their staged ranges, and B's bad one is given back."""
    net.start_coord(**COORD)
    for name in "ABCD":
        net.add(name, capacity="256M", extra=NODE_OPTS + ["--preallocate"])
    net.wait_alive(list("ABCD"), viewer=net["A"])
    a, b, c = net["A"], net["B"], net["C"]
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    assert corrupt_tensor(a, os.path.join(v1, "model.safetensors"), "layers.3.weight") == 1
    before = {n: replication(net[n]) for n in "ABCD"}
    bad0 = bad_shards(b, "A")

    flow_through_stopped_chain(net, v2, before["A"])
    after = {n: replication(net[n]) for n in "ABCD"}
    for n in "BCD":
        assert_identical(v2, net[n], "v2")
        assert net[n].run("verify", "v2", check=False).returncode == 0, f"{n}'s v2 does not verify"
    assert grew(before["B"], after["B"], "delta", "failed") >= 1, after["B"]["delta"]
    assert f"bad delta from {a.url} for v2" in log_text(b), b.log_tail()
    assert grew(before["B"], after["B"], "delta", "forwarded") >= TENSORS - 1, after["B"]["delta"]
    for n in "CD":
        assert grew(before[n], after[n], "delta", "failed") == 0, \
            f"{n} was passed the bad delta whole: {after[n]['delta']}"
    assert poll(lambda: (bad_shards(b, "A") or 0) > bad0, timeout=10, interval=0.2), \
        f"the coordinator counts no bad shard against A ({bad0} before): {b.try_cluster_status()}"
    assert bad_shards(b, "B") == 0 and bad_shards(b, "C") == 0


@pytest.mark.limit(150)
def test_downstream_check_catches_what_the_relay_could_not(net, tmp_path):
    """C's own copy of one tensor of v1 is corrupt: the delta B forwards cut-through is
    good (B rebuilt it and checked it), but what C rebuilds from it against its damaged
    base is not.  C's check catches it: nothing of it is interned, C says its base is
    damaged and asks for the shard whole; v2 ends identical on C and on D after it."""
    start(net, ["A", "B", "C", "D"], coord=COORD, extra=NODE_OPTS)
    c = net["C"]
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    assert corrupt_tensor(c, os.path.join(v1, "model.safetensors"), "layers.5.weight") == 1
    before = {n: replication(net[n]) for n in "ABCD"}

    flow_through_stopped_chain(net, v2, before["A"])
    after = {n: replication(net[n]) for n in "ABCD"}
    for n in "BCD":
        assert_identical(v2, net[n], "v2")
    assert c.run("verify", "v2", check=False).returncode == 0, "C's v2 does not verify"
    assert "the base of a shard of v2 is damaged here" in log_text(c), c.log_tail()
    assert grew(before["B"], after["B"], "delta", "forwarded") >= TENSORS, after["B"]["delta"]
    for n in "ABCD":
        assert grew(before[n], after[n], "delta", "failed") == 0, f"{n}: {after[n]['delta']}"


@pytest.mark.limit(120)
def test_version_removed_while_its_deltas_are_encoded_ahead(net, tmp_path):
    """A alone, one codec thread, a large v2: A starts encoding v2's deltas ahead at its
    seal; v2 is removed at once.  The run is cancelled (ahead_cancelled, logged) before it
    encoded every delta, the daemon stays healthy, and a v3 published after is encoded
    ahead in full."""
    n_tensors = 64
    start(net, ["A"], extra=["-o", "codec_threads=1", "-o", "delta_level=3"])
    a = net["A"]
    w1 = bf16_model(1, n=n_tensors)
    w2 = rl_step(w1, 0.02, 2)
    v1 = model_dir(str(tmp_path / "v1"), w1)
    v2 = model_dir(str(tmp_path / "v2"), w2)
    a.run("publish", v1, "v1")
    before = replication(a)

    a.run("publish", v2, "v2")
    # rm once the run has started: the agent takes the seal from its queue
    # after publish returns, and a version removed before that is not encoded
    # ahead at all (nothing to cancel)
    started = re.compile(r"v2: encoding \d+ delta\(s\) against v1 ahead of demand")
    assert poll(lambda: started.search(log_text(a)), timeout=30, interval=0.01), a.log_tail()
    a.run("rm", "v2")
    assert not a.visible("v2")
    assert poll(lambda: "v2 went: encoding ahead stopped" in log_text(a), timeout=30,
                interval=0.05), a.log_tail()
    mid = replication(a)
    d = {k: grew(before, mid, "delta", k) for k in mid["delta"]}
    print("A after rm:", d)
    assert d["ahead_cancelled"] == 1, d
    assert d["ahead_encoded"] < n_tensors, f"nothing was cancelled: {d}"
    assert a.healthy()

    a.run("publish", v2, "v3")
    done = re.compile(r"v3: \d+ delta\(s\) against v1 encoded ahead of demand")
    assert poll(lambda: done.search(log_text(a)), timeout=60, interval=0.1), a.log_tail()
    end = replication(a)
    assert grew(mid, end, "delta", "ahead_cancelled") == 0, end["delta"]
    # v3 is v2: what the cancelled run made is kept, the rest was made now
    assert grew(before, end, "delta", "ahead_encoded") >= n_tensors, end["delta"]


ENCODE_WAIT_MAX = 4096  # replicator/agent_i.h: requests waiting on encodes; more go whole

# ptrace(2) requests, and waitpid()'s __WALL (a thread of another process is waited for)
PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 17, 0x4206, 0x4207, 0x40000000
# futex(2), the system call a thread asleep on a condition variable is in
FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())


def _ptrace(request, tid):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(request, tid, None, None) < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"ptrace({request:#x}, {tid}): {os.strerror(e)}")


def asleep_on_a_condition(pid):
    """The threads of process @pid but its main one that sleep in futex(2) now
    (/proc/PID/task/TID/syscall).  A node started with codec_threads=1, delta_ahead=0 and
    no HTTP or engine socket has one: its codec worker (the agent thread sleeps in poll(),
    the ZeroMQ ones in epoll_wait(), the FUSE ones in read(), the control one in accept())."""
    assert FUTEX is not None, f"futex(2)'s system call number on {platform.machine()} unknown"
    tids = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/syscall") as f:
                nr = f.read().split()[0]
        except OSError:
            continue
        if int(t) != pid and nr == str(FUTEX):
            tids.append(int(t))
    return tids


@contextlib.contextmanager
def threads_held(tids):
    """Threads @tids held in a ptrace stop (only they: the rest of their process runs on)
    until the block ends."""
    seized = []
    try:
        for tid in tids:
            _ptrace(PTRACE_SEIZE, tid)
            seized.append(tid)
            _ptrace(PTRACE_INTERRUPT, tid)
            os.waitpid(tid, WALL)  # it is stopped
        yield
    finally:
        for tid in seized:
            _ptrace(PTRACE_DETACH, tid)


@pytest.mark.limit(120)
def test_a_get_flood_naming_bases_is_bounded(net, tmp_path):
    """A puller (a raw ZeroMQ peer on the --insecure data port) sends 5 GETs of 1024
    entries each, every one naming a base for a shard of v2, while A's one codec worker is
    held (a ptrace stop: no encode can end, so no request stops waiting meanwhile): exactly
    ENCODE_WAIT_MAX (4096) requests wait on encodes and the other 1024 are answered with the
    whole (small) shard at once (delta.whole), before anything is encoded.  Once the worker
    runs again the 4096 get their deltas, each of the 8 deltas encoded once for all who
    asked; every request is answered and A stays healthy."""
    start(net, ["A"], extra=["-o", "delta_ahead=0", "-o", "codec_threads=1"])
    a = net["A"]
    w1 = bf16_model(1, n=TENSORS, nbytes=64 << 10)  # small shards: the whole answers stay small
    v1 = model_dir(str(tmp_path / "v1"), w1)
    v2 = model_dir(str(tmp_path / "v2"), rl_step(w1, 0.02, 2))
    a.run("publish", v1, "v1")
    a.run("publish", v2, "v2")
    m1 = shard_map(a.run("manifest", "v1").stdout.encode(), "")
    m2 = shard_map(a.run("manifest", "v2").stdout.encode(), "")
    at1 = {(p, off): h for h, (p, off, _) in m1.items()}
    small = [(h, at1[(p, off)]) for h, (p, off, n) in m2.items()
             if (p, off) in at1 and at1[(p, off)] != h and n == 64 << 10]
    assert len(small) == TENSORS, small
    n_get, per_get = 5, 1024
    total = n_get * per_get
    pid = int(a.status()["pid"])
    codec = asleep_on_a_condition(pid)
    assert codec, "no thread of A sleeps on a condition: its codec worker not found"
    before = replication(a)
    with Rogue(a.url, "flood") as r:
        with threads_held(codec):
            for g in range(n_get):
                sel = [small[(g * per_get + i) % len(small)] for i in range(per_get)]
                r.send("GET", req=g + 1, hashes=[h for h, _ in sel], bases=[b for _, b in sel],
                       widths=[2] * per_get)
            # then one naming no base (answered whole, not counted in delta.whole): A takes
            # a peer's GETs in order, so once it counts this one it took all the others
            r.send("GET", req=n_get + 1, hashes=[small[0][0]])
            assert poll(lambda: grew(before, replication(a), "requests_received") >= total + 1,
                        timeout=30, interval=0.05), replication(a)
            held = replication(a)
            d = {k: grew(before, held, "delta", k) for k in held["delta"]}
            print("A, its codec worker held:", d)
            assert d["encoded"] == 0 and d["sent"] == 0, f"an encode ended: the worker ran: {d}"
            assert d["whole"] == total - ENCODE_WAIT_MAX, \
                f"{d['whole']} of {total} requests answered whole at once, not the " \
                f"{total - ENCODE_WAIT_MAX} beyond ENCODE_WAIT_MAX ({ENCODE_WAIT_MAX}) waiting: {d}"
        assert poll(lambda: grew(before, replication(a), "delta", "sent") >= ENCODE_WAIT_MAX,
                    timeout=30, interval=0.1), replication(a)["delta"]
        r.received(timeout_ms=100)  # (what reached it: a ROUTER drops past its high-water mark)
    after = replication(a)
    d = {k: grew(before, after, "delta", k) for k in after["delta"]}
    print("A:", d)
    assert d["sent"] == ENCODE_WAIT_MAX and d["whole"] == total - ENCODE_WAIT_MAX, \
        f"the requests that waited were not all answered with their delta: {d}"
    assert d["encoded"] == len(small), f"the waiting requests did not share the encodes: {d}"
    assert a.healthy()


@pytest.mark.limit(120)
def test_zmq_io_threads_reach_the_replication_context(net, tmp_path):
    """The zmq_io_threads tunable is the number of ZeroMQ I/O threads of a node's
    replication sockets (read back from the context: status replication.io_threads), by
    default one per two online CPUs, at least 2 and at most 8; a chain A -> B -> C whose relay B runs 3 and whose tail C runs 1 moves v1 and
    v2's deltas as before."""
    net.start_coord()
    net.add("A")
    net.add("B", extra=["-o", "zmq_io_threads=3"])
    net.add("C", extra=["-o", "zmq_io_threads=1"])
    net.wait_alive(["A", "B", "C"], viewer=net["A"])
    got = {n: replication(net[n]).get("io_threads") for n in "ABC"}
    default = max(2, min(8, os.sysconf("SC_NPROCESSORS_ONLN") // 2))
    assert got == {"A": default, "B": 3, "C": 1}, got
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    net.wait_version("v2", net.publish("A", v2, "v2"))
    for n in "BC":
        assert_identical(v2, net[n], "v2")
        assert replication(net[n])["delta"]["failed"] == 0, replication(net[n])["delta"]


@pytest.mark.limit(120)
def test_replication_cpu_is_counted_per_role(net, tmp_path):
    """Status replication.cpu holds each node's own thread clocks (agent thread, ZeroMQ
    I/O threads, codec workers) and, of the agent thread's, receiving, forwarding and
    serving, so CPU per byte can be had per role: in a chain A -> B -> C of a 24 MiB model
    sent in 64 KiB pieces (so B passes pieces on while they arrive, the piece just
    received by reference), the publisher A receives nothing and spends agent time
    serving, the relay B receives and sends, the leaf C receives and forwards nothing; a
    node's receiving never exceeds its agent thread's CPU; C holds the model unchanged."""
    net.start_coord()
    opts = ["-o", "piece_bytes=65536"]
    for n in "ABC":
        net.add(n, extra=opts)
    net.wait_alive(["A", "B", "C"], viewer=net["A"])
    src = random_model(tmp_path / "m", 24 << 20, seed=2929)
    net.wait_version("v1", net.publish("A", src, "v1"))
    for n in "BC":
        assert_identical(src, net[n], "v1")
    rep = {n: replication(net[n]) for n in "ABC"}
    cpu = {n: rep[n]["cpu"] for n in "ABC"}
    print(cpu)
    for n in "ABC":
        assert set(cpu[n]) == {"agent_s", "io_s", "codec_s", "receive_s", "forward_s", "serve_s"}, cpu[n]
        assert cpu[n]["agent_s"] >= cpu[n]["receive_s"] + cpu[n]["forward_s"] + cpu[n]["serve_s"] - 1e-3, \
            f"{n}: the agent thread's parts exceed its clock: {cpu[n]}"
        assert cpu[n]["io_s"] > 0, f"{n}: no ZeroMQ I/O thread CPU counted: {cpu[n]}"
    assert rep["A"]["bytes_received"] == 0 and cpu["A"]["receive_s"] == 0, (rep["A"], cpu["A"])
    assert rep["A"]["bytes_sent"] >= 24 << 20 and cpu["A"]["serve_s"] + cpu["A"]["forward_s"] > 0, cpu["A"]
    assert rep["B"]["bytes_received"] >= 24 << 20 and cpu["B"]["receive_s"] > 0, cpu["B"]
    assert rep["B"]["bytes_sent"] >= 24 << 20 and cpu["B"]["forward_s"] + cpu["B"]["serve_s"] > 0, cpu["B"]
    assert rep["C"]["bytes_received"] >= 24 << 20 and cpu["C"]["receive_s"] > 0, cpu["C"]
    assert rep["C"]["bytes_sent"] == 0 and cpu["C"]["forward_s"] == 0, (rep["C"], cpu["C"])
    human = {n: net[n].run("status").stdout for n in "AC"}
    line = {n: next((ln for ln in human[n].splitlines() if ln.startswith("cpu:")), "") for n in "AC"}
    assert "s/GiB received" in line["C"] and "s/GiB sent" not in line["C"], human["C"]
    assert "s/GiB sent" in line["A"] and "s/GiB received" not in line["A"], human["A"]
