"""Each node's `current` as the coordinator sees it (its heartbeats), and a node whose
`current` is not the cluster's committed version flagged wherever the cluster is shown:
`hwfs status --cluster` (text and --json), the coordinator's /api/status and /metrics
(hwfs_coord_node_current, hwfs_coord_node_diverged).  Node C is made to diverge by
`hwfs commit --local --force` (this node only, past the barrier), then brought back by a
cluster commit.
"""

import json
import re
from pathlib import Path

from conftest import poll
from http_helpers import get, samples

from .conftest import random_model

HTTP_ANY = ["--http", "127.0.0.1:0"]


def node(cs, name):
    return next(n for n in cs["nodes"] if n["name"] == name)


def test_a_node_off_the_committed_version_is_flagged(net, tmp_path):
    c = net.start_coord(extra=HTTP_ANY)
    for name in "ABC":
        net.add(name)
    m = poll(lambda: re.search(r"coord: http on (\S+) ", Path(c.logpath).read_text()), timeout=10)
    assert m, c.log_tail()
    addr = m.group(1)
    a, cn = net["A"], net["C"]
    for v, seed in (("v1", 4401), ("v2", 4402)):
        net.wait_version(v, net.publish("A", random_model(tmp_path / v, 1 << 20, seed=seed), v))
    a.run("commit", "v1")

    cn.run("commit", "v2", "--local", "--force")  # C alone, off the cluster's v1

    def seen():  # the coordinator learns each node's current from its next heartbeat
        cs = json.loads(a.run("status", "--cluster", "--json").stdout)
        now = {n["name"]: n.get("current") for n in cs["nodes"]}
        return cs if now == {"A": "v1", "B": "v1", "C": "v2"} else None

    cs = poll(seen, timeout=15, interval=0.2)
    assert cs, a.run("status", "--cluster", "--json").stdout
    assert cs["committed"] == "v1"
    assert {n["name"]: (n["current"], n["diverged"]) for n in cs["nodes"]} == \
        {"A": ("v1", False), "B": ("v1", False), "C": ("v2", True)}, cs["nodes"]
    text = a.run("status", "--cluster").stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("C "))
    assert "current: v2" in line and "DIVERGED" in line, text
    assert all("DIVERGED" not in ln for ln in text.splitlines() if ln[:2] in ("A ", "B ")), text

    def api():
        code, body = get(addr, "/api/status")
        st = json.loads(body) if code == 200 else {}
        return st if st.get("nodes") and node(st, "C").get("diverged") else None

    st = poll(api, timeout=10)
    assert st and node(st, "C")["current"] == "v2" and not node(st, "A")["diverged"], st

    def scraped():
        code, body = get(addr, "/metrics")
        s = samples(body) if code == 200 else {}
        return s if s.get(("hwfs_coord_node_diverged", frozenset({("node", "C")}))) == 1 else None

    s = poll(scraped, timeout=10)
    assert s, get(addr, "/metrics")[1]
    assert s[("hwfs_coord_node_diverged", frozenset({("node", "A")}))] == 0
    assert s[("hwfs_coord_node_current", frozenset({("node", "C"), ("version", "v2")}))] == 1
    assert s[("hwfs_coord_node_current", frozenset({("node", "B"), ("version", "v1")}))] == 1

    a.run("commit", "v2")  # the cluster catches up with C: nobody diverges

    def healed():
        cs = json.loads(a.run("status", "--cluster", "--json").stdout)
        return cs if cs["committed"] == "v2" and not any(n["diverged"] for n in cs["nodes"]) else None

    assert poll(healed, timeout=15, interval=0.2), a.run("status", "--cluster", "--json").stdout
