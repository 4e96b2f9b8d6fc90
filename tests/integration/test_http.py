"""The HTTP endpoint of a node and of a coordinator (--http HOST:PORT; docs/operations.md).

/metrics passes `promtool check metrics` and counts what really happened (a
publish, a commit, FUSE reads: the values are checked against `hwfs status`
and the bytes read); /healthz and /readyz answer 200 or 503 with one line,
"updating" while a commit waits for an engine; a hostile client (1000
connections, huge headers, a slow sender) never holds up a publish, a commit
or FUSE reads, and the server answers again once it is gone.  Every daemon
asks for port 0 and the test reads the bound address back (`hwfs status
--json` "http", the coordinator's "coord: http on" log line).
"""

import json
import os
import re
import resource
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import HWFS, poll, random_file, scaled, sh
from engine_proto import engine
from http_helpers import commit_seen_updating, get, promtool_check, samples, standalone_coord, value

HTTP_ANY = ["--http", "127.0.0.1:0"]


def http_addr(m):
    """The HOST:PORT the node's daemon bound for --http (hwfs status --json "http")."""
    addr = m.status().get("http")
    assert addr and re.match(r"^127\.0\.0\.1:[1-9][0-9]*$", addr), f"status http: {addr!r}"
    return addr


def publish(m, root, version, size, seed):
    d = Path(root) / version
    random_file(d / "w.bin", size, seed=seed)
    m.run("publish", d, version)
    return d / "w.bin"


def test_node_metrics_pass_promtool_and_count_what_happened(mount_factory, tmp_path):
    m = mount_factory(extra=HTTP_ANY)
    addr = http_addr(m)
    code, text = get(addr, "/metrics")
    assert code == 200
    promtool_check(text)
    s = samples(text)
    assert value(s, "hwfs_versions") == 0
    assert not [k for k in s if k[0] == "hwfs_current_info"], "current_info without a current"
    build = [(dict(k[1]), v) for k, v in s.items() if k[0] == "hwfs_build_info"]
    assert len(build) == 1 and build[0][1] == 1 and build[0][0]["version"], build

    publish(m, tmp_path, "v1", 3 * 1024 * 1024 + 5, seed=1)
    publish(m, tmp_path, "v2", 1024 * 1024, seed=2)
    m.run("commit", "v1")
    with open(m.path("current", "w.bin"), "rb") as f:
        nread = len(f.read())
    code, text = get(addr, "/metrics")
    promtool_check(text)
    s = samples(text)
    st = m.status()
    assert value(s, "hwfs_versions") == 2
    assert value(s, "hwfs_current_info", version="v1") == 1
    assert len([k for k in s if k[0] == "hwfs_current_info"]) == 1
    assert value(s, "hwfs_store_used_bytes") == st["store"]["used_bytes"]
    assert value(s, "hwfs_store_capacity_bytes") == st["store"]["capacity_bytes"]
    assert value(s, "hwfs_commits_total", outcome="committed") == 1
    assert value(s, "hwfs_commit_duration_seconds_count", phase="flip") == 1
    assert value(s, "hwfs_commit_duration_seconds_bucket", phase="flip", le="+Inf") == 1
    assert value(s, "hwfs_publish_duration_seconds_count") == 2
    assert value(s, "hwfs_publish_duration_seconds_sum") > 0
    assert value(s, "hwfs_fuse_read_bytes_total") >= nread == 3 * 1024 * 1024 + 5
    assert value(s, "hwfs_fuse_requests_total", op="read") >= 1
    # a refused commit (no such version) counts as refused, not as committed
    assert m.run("commit", "nope", check=False).returncode != 0
    s = samples(get(addr, "/metrics")[1])
    assert value(s, "hwfs_commits_total", outcome="committed") == 1
    assert value(s, "hwfs_commits_total", outcome="refused") == 1
    m.run("rm", "v2")
    assert value(samples(get(addr, "/metrics")[1]), "hwfs_versions") == 1
    assert get(addr, "/nope")[0] == 404


def test_healthz_and_readyz_states(mount_factory, tmp_path):
    m = mount_factory(extra=HTTP_ANY + ["-o", "engine_deadline_ms=20000"])
    addr = http_addr(m)
    assert get(addr, "/healthz") == (200, "ok\n")
    assert get(addr, "/readyz") == (200, "ready\n")
    publish(m, tmp_path, "v1", 1 << 20, seed=3)
    # a commit waiting for an engine's "loaded": updating, still ready
    with engine(m, "sleepy") as e:
        commit_seen_updating(m, addr, e, "v1")
    assert poll(lambda: get(addr, "/readyz") == (200, "ready\n"))
    s = samples(get(addr, "/metrics")[1])
    assert value(s, "hwfs_updating") == 0
    assert value(s, "hwfs_commit_duration_seconds_count", phase="prepare") == 1
    assert value(s, "hwfs_engine_load_duration_seconds_count") == 0  # no "loading" report
    m.umount()
    with pytest.raises(OSError):  # the server went with the daemon
        get(addr, "/healthz", timeout=2)


def test_readyz_says_when_the_coordinator_is_unreachable(mount_factory):
    # a coordinator address nobody listens on (the port held by an unlistened socket)
    with socket.socket() as hold:
        hold.bind(("127.0.0.1", 0))
        port = hold.getsockname()[1]
        m = mount_factory(extra=HTTP_ANY + ["--join", f"tcp://127.0.0.1:{port}", "--node", "n1",
                                            "--listen", "tcp://127.0.0.1:*", "--insecure"])
        addr = http_addr(m)
        assert get(addr, "/healthz") == (200, "ok\n")
        assert poll(lambda: get(addr, "/readyz") == (503, "coordinator unreachable\n"),
                    timeout=10)
        promtool_check(get(addr, "/metrics")[1])


def test_bad_http_address_fails_the_mount(tmp_path):
    store, mnt = tmp_path / "s", tmp_path / "m"
    mnt.mkdir()
    cp = sh([HWFS, "mount", mnt, "--store", store, "--http", "not-an-address"], check=False)
    assert cp.returncode != 0 and "--http not-an-address: not HOST:PORT" in cp.stderr, cp.stderr
    assert not os.path.ismount(mnt)


class Hostile:
    """1000 idle connections, a sender of huge headers, and a one-byte-a-second client."""

    def __init__(self, addr, n=1000):
        host, port = addr.rsplit(":", 1)
        self.target = (host, int(port))
        self.socks, self.stop = [], threading.Event()
        self.huge_status = None
        self.slow = None
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < n + 200:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1000), hard))
        # the huge headers first, alone: the connection limits must not be what stops them
        self.huge()
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(self.target)  # the server may refuse: past its limits, that is right
            self.socks.append(s)
        self.threads = [threading.Thread(target=self.huge, daemon=True),
                        threading.Thread(target=self.trickle, daemon=True)]
        for t in self.threads:
            t.start()

    def huge(self):
        """Headers far past the per-connection memory: answered with an error or cut, never
        served (the first answer is kept in huge_status)."""
        with socket.create_connection(self.target, timeout=10) as s:
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 << 20))
                s.sendall(b"\r\n\r\n")
            except OSError:
                pass
            try:
                got = s.recv(64)
            except OSError as e:
                got = repr(e).encode()
            if self.huge_status is None:
                self.huge_status = got

    def trickle(self):
        with socket.create_connection(self.target, timeout=30) as s:
            self.slow = s
            for c in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n":
                if self.stop.is_set():
                    return
                try:
                    s.send(bytes([c]))
                except OSError:
                    return
                self.stop.wait(0.5)

    def close(self):
        self.stop.set()
        for s in self.socks:
            s.close()
        for t in self.threads:
            t.join(timeout=15)


def publish_commit_read(m, root, version, seed):
    """Publish an 8 MiB version, commit it, read it back through `current`: the seconds
    that took, and the file published."""
    t0 = time.monotonic()
    src = publish(m, root, version, 8 << 20, seed=seed)
    m.run("commit", version, timeout=scaled(30))
    with open(m.path("current", "w.bin"), "rb") as f:
        assert f.read() == src.read_bytes()
    return time.monotonic() - t0, src


@pytest.mark.limit(180)
def test_hostile_http_clients_never_hold_up_publish_commit_or_reads(mount_factory, tmp_path):
    """Publish + commit + read of v2 under the HTTP attack take no longer than
    max(10 s, 5x the same work for v1 without it), the 10 s times HWFS_TIME_SCALE: a
    server that let the attack hold the daemon up would take as long as the slow client
    (about 20 s) or forever."""
    m = mount_factory(extra=HTTP_ANY)
    addr = http_addr(m)
    quiet, f1 = publish_commit_read(m, tmp_path, "v1", seed=5)
    h = Hostile(addr)
    try:
        time.sleep(1)  # the connections are accepted or queued by now
        took, _ = publish_commit_read(m, tmp_path, "v2", seed=6)
        bound = max(scaled(10), 5 * quiet)
        assert took < bound, (f"publish + commit + read took {took:.1f} s under the HTTP attack "
                              f"(bound {bound:.1f} s; {quiet:.2f} s without it)")
        assert m.status()["current"] == "v2"
        assert poll(lambda: h.huge_status is not None, timeout=20), "huge headers never answered"
        assert not h.huge_status.startswith(b"HTTP/1.1 200"), h.huge_status
    finally:
        h.close()
    # gone: the server answers again, and counted everything
    assert poll(lambda: _ok(addr), timeout=30), "the HTTP server did not recover"
    s = samples(get(addr, "/metrics")[1])
    assert value(s, "hwfs_commits_total", outcome="committed") == 2
    assert f1.exists()


def _ok(addr):
    try:
        return get(addr, "/healthz", timeout=2)[0] == 200
    except OSError:
        return False


# ------------------------------------------------------------------ coordinator


@pytest.fixture
def coord(tmp_path):
    """A stand-alone `hwfs coord --http 127.0.0.1:0`: (http address, state dir); stopped after."""
    with standalone_coord(tmp_path) as c:
        yield c


def test_coordinator_metrics_and_health(coord):
    addr, _ = coord
    assert get(addr, "/healthz") == (200, "ok\n")
    assert get(addr, "/readyz") == (200, "ready\n")
    code, text = get(addr, "/metrics")
    assert code == 200
    promtool_check(text)
    s = samples(text)
    assert value(s, "hwfs_coord_commits_total", outcome="committed") == 0
    assert value(s, "hwfs_coord_commit_duration_seconds_count") == 0
    assert poll(lambda: get(addr, "/api/status")[0] == 200, timeout=5)
    st = json.loads(get(addr, "/api/status")[1])
    assert st["nodes"] == [] and st["committed"] is None and st["commits"] == [], st
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", st["coordinator"]), st
    s = samples(get(addr, "/metrics")[1])
    assert value(s, "hwfs_coord_nodes", state="alive") == 0
    code, page = get(addr, "/")
    assert code == 200 and page.startswith("<!DOCTYPE html>") and "/api/status" in page


def test_coordinator_bad_http_address_is_one_line(tmp_path):
    cp = sh([HWFS, "coord", "--listen", "tcp://127.0.0.1:0", "--insecure", "--http", "nowhere"],
            check=False)
    assert cp.returncode != 0
    assert cp.stderr.strip() == "hwfs: error: --http nowhere: not HOST:PORT", cp.stderr
