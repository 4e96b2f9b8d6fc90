"""The HTTP endpoint against hostile clients and a hung mount (--http; docs/operations.md,
docs/security.md "The HTTP endpoint").

* Slow clients cannot shut /healthz and /metrics out: 32 connections from the prober's own
  address and 880 from 30 other loopback addresses (127.0.0.2..127.0.0.31), each a partial
  request that grows by a byte every 2 s and is reopened whenever the server closes it, while
  /healthz and /metrics are asked again and again: every answer comes within its deadline.
  A connection that has not sent its complete headers within http_header_ms (5 s) is closed,
  however steadily it trickles.
* A hung FUSE session: the mount runs one FUSE thread (`-o max_threads=1`) and that thread
  waits in the engine barrier of `ln -sfn v2 current` (an engine that does not answer), so
  every FUSE request waits behind it.  /healthz answers 503 within its deadline, again and
  again and from several clients at once, /metrics and /readyz answer, and /healthz is 200
  once the barrier ends.
* Only known names in `Host:` (against DNS rebinding): IP literals, localhost, the name
  given to --http and those of --http-host; others get 421, on every path of a node and of a
  coordinator (/api/status included); a request without Host (HTTP/1.0) is served.
"""

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import HWFS, TIMEOUT, make_tensors, poll, save_model, scaled, sh
from engine_proto import engine
from http_helpers import get, promtool_check, samples, standalone_coord, value

HTTP_ANY = ["--http", "127.0.0.1:0"]
HEADER_MS = 5000  # the default of the tunable http_header_ms
SKIP = ("arrived", "removed", "current")


def http_addr(m):
    """The HOST:PORT the node's daemon bound for --http (hwfs status --json "http")."""
    addr = m.status().get("http")
    assert addr and re.match(r"^127\.0\.0\.1:[1-9][0-9]*$", addr), f"status http: {addr!r}"
    return addr


def target(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def raw_get(addr, path, host=None, http10=False, timeout=10):
    """GET @path on a fresh connection with exactly the Host line @host (None: none), HTTP/1.0
    when @http10: (status, body).  A refused or failed connection raises."""
    lines = [f"GET {path} HTTP/1.{0 if http10 else 1}"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += ["Connection: close", "", ""]
    with socket.create_connection(target(addr), timeout=timeout) as s:
        s.sendall("\r\n".join(lines).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", head)
    assert m, f"not an HTTP answer: {data[:200]!r}"
    return int(m.group(1)), body.decode(errors="replace")


class Slow:
    """tests/integration/slow_clients.py attacking @addr from the (source address, count)
    pairs of @plan, in a process of its own; started once its first round is done."""

    def __init__(self, addr, plan):
        script = Path(__file__).resolve().parent / "slow_clients.py"
        self.p = subprocess.Popen([sys.executable, str(script), addr,
                                   *[f"{src}={n}" for src, n in plan]],
                                  stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        assert line[:1] == ["ready"], f"slow_clients.py: {line}"
        self.opened, self.reopened = int(line[1]), 0

    def close(self):
        """Stop it; its counts of connections opened and reopened."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        out, _ = self.p.communicate(timeout=TIMEOUT)
        words = out.split()
        if words[:1] == ["done"]:
            self.opened, self.reopened = int(words[1]), int(words[2])
        return self.opened, self.reopened


def answers(addr, path, deadline):
    """GET @path within @deadline seconds: (status, body), or the error as a string."""
    try:
        return get(addr, path, timeout=deadline)
    except OSError as e:
        return f"{type(e).__name__}: {e}"


@pytest.mark.limit(240)
def test_slow_connections_do_not_shut_out_health_and_scrapes(mount_factory):
    """912 slow connections, 32 of them from the prober's own address: /healthz and /metrics
    answer every time, within a deadline shorter than the header deadline, for longer than
    the idle timeout (10 s) would have let the old connections live."""
    m = mount_factory(extra=HTTP_ANY)
    addr = http_addr(m)
    assert get(addr, "/healthz") == (200, "ok\n")
    plan = [("127.0.0.1", 32)] + [(f"127.0.0.{i}", 880 // 30 + (1 if i - 2 < 880 % 30 else 0))
                                  for i in range(2, 32)]
    assert sum(n for _, n in plan) == 912
    attack = Slow(addr, plan)
    try:
        time.sleep(2)  # every connection sent its partial request by now
        deadline = scaled(4)
        t0 = time.monotonic()
        rounds = 0
        while rounds < 4 or time.monotonic() - t0 < 12:
            for path in ("/healthz", "/metrics"):
                got = answers(addr, path, deadline)
                assert isinstance(got, tuple) and got[0] == 200, (
                    f"GET {path} under 912 slow connections from 31 addresses, "
                    f"round {rounds}: {got!r}")
            rounds += 1
            time.sleep(1)
    finally:
        opened, reopened = attack.close()
    assert opened >= 912 and reopened > 0, (opened, reopened)  # the attack went on
    promtool_check(get(addr, "/metrics")[1])


def test_headers_must_complete_within_the_header_deadline(mount_factory):
    """A request trickled a byte every 0.5 s (which resets any idle timer) is cut off once
    http_header_ms has passed since the connection opened."""
    m = mount_factory(extra=HTTP_ANY)
    addr = http_addr(m)
    bound = HEADER_MS / 1000 + scaled(3)
    with socket.create_connection(target(addr), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        t0 = time.monotonic()
        closed = None
        while time.monotonic() - t0 < bound:
            r, _, _ = select.select([s], [], [], 0.5)
            if r:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    closed = time.monotonic() - t0
                    break
            try:
                s.send(b"a")
            except OSError:
                closed = time.monotonic() - t0
                break
        assert closed is not None, (f"a request still incomplete after {bound:.1f} s of "
                                    f"trickling was not cut off (http_header_ms {HEADER_MS})")
    # complete requests are unaffected
    assert get(addr, "/healthz") == (200, "ok\n")


# ------------------------------------------------------------------ a hung FUSE session


def publish(m, root, version, seed):
    d = Path(root) / f"{version}-{seed}"
    save_model(d / "model.safetensors", make_tensors(seed, n=3))
    m.run("publish", d, version)


def hung(path):
    """True when a getxattr of @path does not return within 1 s (left waiting in a thread)."""
    t = threading.Thread(target=lambda: os.getxattr(path, "user.hwfs.pid"), daemon=True)
    t.start()
    t.join(1)
    return t.is_alive()


@pytest.mark.limit(240)
def test_hung_fuse_session_healthz_fails_fast_and_metrics_answer(mount_factory, tmp_path):
    m = mount_factory(extra=HTTP_ANY + ["-o", "max_threads=1,engine_deadline_ms=300000"])
    addr = http_addr(m)
    assert get(addr, "/healthz") == (200, "ok\n")
    publish(m, tmp_path, "v1", seed=1)
    m.run("commit", "v1")
    publish(m, tmp_path, "v2", seed=2)
    e = engine(m, "stuck")
    p = subprocess.Popen(["ln", "-sfn", "v2", "current"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=m.mnt)
    try:
        assert e.event(skip=SKIP) == {"event": "prepare", "version": "v2"}
        assert hung(m.mnt), "the FUSE session still answers: the test hangs nothing"
        deadline = scaled(5)
        for _ in range(3):
            got = answers(addr, "/healthz", deadline)
            assert isinstance(got, tuple) and got[0] == 503, f"GET /healthz, FUSE hung: {got!r}"
            assert "FUSE not answering" in got[1], got
        # several at once, and the scrape and readiness beside them
        out = {}

        def ask(k, path):
            out[k] = answers(addr, path, deadline)

        ts = [threading.Thread(target=ask, args=(i, "/healthz")) for i in range(6)]
        ts += [threading.Thread(target=ask, args=("metrics", "/metrics")),
               threading.Thread(target=ask, args=("readyz", "/readyz"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(deadline + 5)
        assert all(isinstance(out.get(i), tuple) and out[i][0] == 503 for i in range(6)), out
        assert isinstance(out["metrics"], tuple) and out["metrics"][0] == 200, out["metrics"]
        promtool_check(out["metrics"][1])
        assert value(samples(out["metrics"][1]), "hwfs_versions") == 2
        assert out["readyz"] == (200, "ready: updating\n"), out["readyz"]
    finally:
        e.send({"report": "loaded", "version": "v2"})
        _, err = p.communicate(timeout=TIMEOUT)
        e.close()
    assert p.returncode == 0, err
    assert poll(lambda: answers(addr, "/healthz", scaled(5)) == (200, "ok\n"), timeout=10)
    assert m.status()["current"] == "v2"


# ------------------------------------------------------------------ Host


FOREIGN = ("evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
           "localhost.evil.example:{port}", "[::1].evil.example")


def check_hosts(addr, paths, allowed, refused):
    port = target(addr)[1]
    for path in paths:
        for host in allowed:
            code, body = raw_get(addr, path, host=host.format(port=port))
            assert code == 200, f"GET {path} with Host: {host}: {code} {body[:200]!r}"
        for host in refused:
            code, body = raw_get(addr, path, host=host.format(port=port))
            assert code == 421 and body.strip(), (
                f"GET {path} with Host: {host}: {code} {body[:200]!r}")
        # HTTP/1.0 without Host, and what a scraper sends (urllib: Host: 127.0.0.1:PORT)
        assert raw_get(addr, path, host=None, http10=True)[0] == 200
        assert get(addr, path)[0] == 200


def test_node_refuses_foreign_host_names(mount_factory):
    m = mount_factory(extra=HTTP_ANY)
    addr = http_addr(m)
    check_hosts(addr, ("/metrics", "/healthz", "/readyz"),
                allowed=("127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LocalHost.",
                         "[::1]:{port}", "10.1.2.3:9464"),
                refused=FOREIGN)


def test_node_http_host_adds_names(mount_factory):
    m = mount_factory(extra=HTTP_ANY + ["--http-host", "scrape.example",
                                        "--http-host", "node-1.internal,Node-2.internal"])
    addr = http_addr(m)
    check_hosts(addr, ("/metrics",),
                allowed=("scrape.example:{port}", "node-1.internal", "node-2.INTERNAL:{port}",
                         "127.0.0.1:{port}"),
                refused=FOREIGN + ("scrape.example.evil.example",))


def test_bad_http_host_fails_the_mount(tmp_path):
    store, mnt = tmp_path / "s", tmp_path / "m"
    mnt.mkdir()
    cp = sh([HWFS, "mount", mnt, "--store", store, "--http", "127.0.0.1:0",
             "--http-host", "a b"], check=False)
    assert cp.returncode != 0 and "--http-host" in cp.stderr, cp.stderr
    assert not os.path.ismount(mnt)


@contextmanager
def coordinator(tmp_path, *extra):
    """A stand-alone `hwfs coord --http 127.0.0.1:0 EXTRA`: its http address; stopped after."""
    with standalone_coord(tmp_path, *extra) as (addr, _):
        yield addr


def test_coordinator_refuses_foreign_host_names(tmp_path):
    with coordinator(tmp_path, "--http-host", "status.example") as addr:
        check_hosts(addr, ("/api/status", "/metrics", "/"),
                    allowed=("127.0.0.1:{port}", "localhost", "status.example:{port}"),
                    refused=FOREIGN)


def test_coordinator_without_http_host_refuses_names(tmp_path):
    with coordinator(tmp_path) as addr:
        check_hosts(addr, ("/api/status", "/metrics"), allowed=("127.0.0.1:{port}",),
                    refused=FOREIGN + ("status.example",))
