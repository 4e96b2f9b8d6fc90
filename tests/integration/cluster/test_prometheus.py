"""A real Prometheus scraping two nodes and the coordinator (docs/operations.md).

Debian's `prometheus` (tools/install/install-deps.sh) scrapes the three --http
endpoints every second; after a version has replicated from A to B and been
committed, PromQL must give back what really happened:
sum(hwfs_replication_wire_bytes_received_total) equals the wire bytes the
nodes' `hwfs status` counted (and A sent), every target is up, and both nodes
report the same hwfs_current_info.  Every query of the Grafana dashboard
(tools/dashboards/grafana-hwfs.json) is valid PromQL to that Prometheus and names only
metrics the endpoints serve.  Prometheus is asked for port 0 and read back
from its "Listening on" log line.

Runs once in `make test` (the plain pass): the sanitizer passes leave it out
(the Makefile's ONCE_TESTS), as it tests the exposition, not the daemon's
memory.
"""

import json
import re
import shutil
import signal
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from http_helpers import get, promtool_check
from .conftest import assert_identical, poll, random_model

HTTP_ANY = ["--http", "127.0.0.1:0"]


def coord_http(c):
    m = poll(lambda: re.search(r"coord: http on (\S+) ", Path(c.logpath).read_text()), timeout=10)
    assert m, c.log_tail()
    return m.group(1)


class Prometheus:
    def __init__(self, workdir, targets):
        tool = shutil.which("prometheus")
        assert tool, "prometheus not found (Debian package prometheus; tools/install/install-deps.sh)"
        self.dir = Path(workdir)
        cfg = self.dir / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                       "scrape_configs:\n  - job_name: hwfs\n    static_configs:\n"
                       f"      - targets: {json.dumps(targets)}\n")
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen([tool, f"--config.file={cfg}",
                                      f"--storage.tsdb.path={self.dir / 'data'}",
                                      "--web.listen-address=127.0.0.1:0"],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        m = poll(lambda: self.proc.poll() is None and re.search(
            r'msg="Listening on" address=(127\.0\.0\.1:\d+)',
            (self.dir / "prometheus.log").read_text()), timeout=30)
        assert m, f"prometheus did not start:\n{self.text_log()}"
        self.addr = m.group(1)
        # it listens before its storage is open: 503 until /-/ready says so
        assert poll(lambda: get(self.addr, "/-/ready")[0] == 200, timeout=30), \
            f"prometheus never became ready:\n{self.text_log()}"

    def text_log(self):
        return (self.dir / "prometheus.log").read_text()[-3000:]

    def query(self, q):
        """The instant vector of PromQL @q: [(labels, float value)]."""
        code, body = get(self.addr, "/api/v1/query?query=" + urllib.parse.quote(q))
        assert code == 200, body
        r = json.loads(body)
        assert r["status"] == "success", r
        return [(x["metric"], float(x["value"][1])) for x in r["data"]["result"]]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.mark.limit(240)
def test_prometheus_sees_the_bytes_that_moved(net, tmp_path):
    c = net.start_coord(extra=HTTP_ANY)
    a = net.add("A", extra=HTTP_ANY)
    b = net.add("B", extra=HTTP_ANY)
    targets = [a.status()["http"], b.status()["http"], coord_http(c)]
    for t in targets:  # every endpoint passes promtool before Prometheus sees it
        promtool_check(get(t, "/metrics")[1])
    src = random_model(tmp_path / "m", 6 << 20, seed=1811)
    digest = net.publish("A", src, "v1")
    net.wait_version("v1", digest, nodes=[b])
    assert_identical(src, b, "v1")
    b.run("commit", "v1")
    moved = sum(int(n.status()["replication"]["wire_bytes_received"]) for n in (a, b))
    assert moved >= 6 << 20  # B received at least the model (A nothing)
    assert moved == int(a.status()["replication"]["wire_bytes_sent"])
    p = Prometheus(tmp_path, targets)
    try:
        def scraped():
            up = p.query('up{job="hwfs"}')
            got = p.query("sum(hwfs_replication_wire_bytes_received_total)")
            return len(up) == 3 and all(v == 1 for _, v in up) and got and got[0][1] == moved

        assert poll(scraped, timeout=60, interval=0.5), \
            (f"Prometheus: up {p.query('up')}, wire bytes "
             f"{p.query('sum(hwfs_replication_wire_bytes_received_total)')}, want {moved}\n"
             f"{p.text_log()}")
        cur = p.query("hwfs_current_info")
        assert sorted((m["version"], v) for m, v in cur) == [("v1", 1.0), ("v1", 1.0)], cur
        assert p.query("sum(hwfs_commits_total{outcome=\"committed\"})")[0][1] == 2
        assert p.query("hwfs_coord_commits_total{outcome=\"committed\"}")[0][1] == 1
        assert p.query("hwfs_coord_version_converge_seconds_count")[0][1] == 1
        assert p.query("hwfs_coord_nodes{state=\"alive\"}")[0][1] == 2
        arrived = p.query("hwfs_version_arrival_seconds_count")
        assert sorted(v for _, v in arrived) == [0.0, 1.0], arrived  # B received v1, A made it
        served = set()
        for t in targets:
            served |= set(re.findall(r"^(hwfs_[a-z_]+)", get(t, "/metrics")[1], re.M))
        dash = json.loads((Path(__file__).parents[3] / "tools/dashboards/grafana-hwfs.json").read_text())
        exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
        assert len(exprs) > 10
        for e in exprs:
            q = e.replace("$__rate_interval", "10s").replace("$job", "hwfs")
            p.query(q)  # valid PromQL (fails the test otherwise)
            for name in re.findall(r"\b(hwfs_[a-z_]+)", q):
                assert name in served, f"the dashboard's {e!r} names {name}, which nobody serves"
    finally:
        p.stop()
