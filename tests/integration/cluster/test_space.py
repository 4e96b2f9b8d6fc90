"""A node short of space (docs/cli.md, status "waiting for space"): it pulls only what it
can keep, and a version that does not fit there blocks no other.

C (capacity 40M) holds v1 (24 MiB); v2 (24 MiB more) does not fit.  C asks for none of
v2 — no bytes fetched only to be dropped, however many times it looks again
(space_retry_ms is 50 ms here) — and says it waits for space.  v3 (6 MiB) fits: it reaches
C while v2 waits, and a cluster commit of v3 goes through on every node.  `hwfs rm v1` on C
makes room and v2 arrives.
"""

import pytest

from conftest import poll

from .conftest import assert_identical, random_model, ring


def wire_rx(node):
    return int(node.status()["replication"]["wire_bytes_received"])


def pull_of(node, version):
    for p in node.status()["replication"].get("pulls", []):
        if p.get("version") == version:
            return p
    return None


@pytest.mark.limit(150)
def test_a_version_that_does_not_fit_is_not_pulled_and_blocks_no_other(net, tmp_path):
    ring(net, ["A", "B"])
    net.add("C", capacity="40M", extra=["-o", "space_retry_ms=50", "-o", "space_retry_max_ms=100"])
    a, b, c = net["A"], net["B"], net["C"]
    d1 = net.publish("A", random_model(tmp_path / "m1", 24 << 20, seed=851), "v1")
    net.wait_version("v1", d1)
    rx0 = wire_rx(c)

    m2 = random_model(tmp_path / "m2", 24 << 20, seed=852)
    d2 = net.publish("A", m2, "v2")
    net.wait_version("v2", d2, nodes=[a, b])
    w = poll(lambda: (p := pull_of(c, "v2")) and "waiting for space" in (p.get("waiting") or "") and p,
             timeout=20, interval=0.1)
    assert w, f"C's status does not say v2 waits for space: {c.status()['replication']}"
    assert w["need_bytes"] > w["free_bytes"], w

    m3 = random_model(tmp_path / "m3", 6 << 20, seed=853)
    d3 = net.publish("A", m3, "v3")
    net.wait_version("v3", d3)  # v3 fits on C although v2 waits there
    assert_identical(m3, c, "v3")
    a.run("commit", "v3")
    for n in (a, b, c):
        assert n.current() == ("versions/v3", "v3"), f"{n.name}: {n.current()}"
    log = (c.store and open(f"{c.store}/hwfs.log", errors="replace").read())
    assert "v2 does not fit here" in log, c.log_tail()
    got = wire_rx(c) - rx0
    assert got <= (6 << 20) * 1.1, \
        f"C received {got} wire bytes while v2 did not fit, for the 6 MiB of v3 only"
    assert not c.visible("v2")

    c.run("rm", "v1")
    net.wait_version("v2", d2, nodes=[c], timeout=30)
    assert_identical(m2, c, "v2")
