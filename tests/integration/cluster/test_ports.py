"""Ports chosen by the daemons themselves (`tcp://HOST:*`), read back by the fixtures.

The fixtures used to pick a "free" port by binding port 0 and closing it, then
hand it to a daemon: another process could take it in between.  Now every
coordinator and node is asked for `tcp://127.0.0.1:*` and the fixtures read the
bound endpoint back (the coordinator's log line, `hwfs status --json` "listen").
An embedded coordinator on `*` is test_latejoin.py's test_embedded_coordinator.
"""

import re
from pathlib import Path

from .conftest import assert_identical, random_model

HERE = Path(__file__).resolve().parent


def test_fixtures_do_not_pick_ports_themselves():
    for p in [HERE / "conftest.py", *HERE.glob("test_*.py")]:
        if p.name == "test_ports.py":
            continue
        assert not re.search(r"\bfree_port\b", p.read_text()), f"{p.name} still uses free_port"


def test_daemons_asked_for_port_0_get_distinct_working_ports(net, tmp_path):
    c = net.start_coord()
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", c.url) and not c.url.endswith(":0"), c.url
    a = net.add("A")
    b = net.add("B")
    ports = set()
    for n in (a, b):
        st = n.status()
        assert st["coordinator"] == c.url, st
        m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", st["listen"])
        assert m and int(m.group(1)) > 0, st["listen"]
        ports.add(int(m.group(1)))
    assert len(ports) == 2, ports
    # working: B pulls A's version from A's reported port
    src = random_model(tmp_path / "m", 4 << 20, seed=901)
    digest = net.publish("A", src, "v1")
    net.wait_version("v1", digest, nodes=[b])
    assert_identical(src, b, "v1")
    cs = b.try_cluster_status()
    addrs = sorted(n["addr"] for n in cs["nodes"])
    assert addrs == sorted([a.url, b.url]), cs
