"""Late joins (striped over every complete holder), the embedded coordinator, topologies.

Clusters come from the ``net`` fixture of cluster/conftest.py (a coordinator and nodes
started one at a time, all cleaned up after the test).
"""

import re

import pytest

from .conftest import ANY_PORT
from .conftest import assert_identical, random_model, ring, version_view


@pytest.mark.limit(150)
def test_late_join_stripes_over_all_holders(net, tmp_path):
    """A, B, C hold v1 (60 MiB); D joins later and pulls it from several of them at once."""
    ring(net, ["A", "B", "C"])
    src = random_model(tmp_path / "m", 60 << 20, seed=701)
    digest = net.publish("A", src, "v1")
    net.wait_version("v1", digest)
    holders = [net[x] for x in "ABC"]
    sent = {n.name: n.sent() for n in holders}

    d = net.add("D")
    net.wait_version("v1", digest, nodes=[d], timeout=60)
    assert_identical(src, d, "v1")

    grew = {n.name: n.sent() - sent[n.name] for n in holders}
    assert sum(1 for g in grew.values() if g > 0) >= 2, f"D was not served by at least two holders: {grew}"
    cs = d.try_cluster_status()
    shard_bytes = version_view(cs, "A", "v1")["bytes_held"]
    assert shard_bytes >= 60 << 20, f"A's complete v1 holds {shard_bytes} bytes"
    got = d.bytes_received()
    assert abs(got - shard_bytes) <= 0.05 * shard_bytes, \
        f"D received {got} bytes for v1, whose shards hold {shard_bytes} (want within 5%)"
    assert abs(sum(grew.values()) - got) <= 0.05 * shard_bytes, \
        f"the holders sent {grew} (sum {sum(grew.values())}) but D received {got}"
    print(f"holders sent {grew}; D received {got} of {shard_bytes}")
    dv = version_view(cs, "D", "v1")
    assert dv and dv["complete"] is True and dv["bytes_needed"] == 0, f"coordinator's view of D: {dv}"


@pytest.mark.limit(120)
def test_embedded_coordinator(net, tmp_path):
    """A runs the coordinator (--coordinator tcp://127.0.0.1:*); B and C join it at the port
    it bound; publish on B reaches A and C; commit works."""
    a = net.add("A", embedded=ANY_PORT)
    st = a.status()
    url = st["coordinator"]  # the port the embedded coordinator bound
    assert st["node"] == "A" and re.fullmatch(r"tcp://127\.0\.0\.1:\d+", url), st
    net.add("B", coord_url=url, viewer=a)
    c = net.add("C", coord_url=url, viewer=a)
    net.wait_alive(["A", "B", "C"], viewer=c)

    src = random_model(tmp_path / "m", 12 << 20, seed=801)
    digest = net.publish("B", src, "v1")
    net.wait_version("v1", digest, nodes=[a, c])
    for n in (a, c):
        assert_identical(src, n, "v1")
    c.run("commit", "v1")
    assert net.currents() == {x: ("versions/v1", "v1") for x in "ABC"}, net.currents()
    assert a.try_cluster_status()["committed"] == "v1"


@pytest.mark.limit(120)
@pytest.mark.parametrize("topology", ["tree:2", "star"])
def test_topology_converges(net, tmp_path, topology):
    """4 nodes under --topology tree:2 / star: v1 published on A reaches B, C, D intact."""
    ring(net, ["A", "B", "C", "D"], topology=topology)
    src = random_model(tmp_path / "m", 24 << 20, seed=901)
    digest = net.publish("A", src, "v1")
    net.wait_version("v1", digest)
    for n in net.others("A"):
        assert_identical(src, n, "v1")
    # Who served whom (coord.c plans receivers in join order under A):
    # star: everyone pulls from A; tree:2: B and C from A, D from B.
    sent = {n.name: n.sent() for n in net}
    servers = {x for x, s in sent.items() if s > 0}
    want = {"star": {"A"}, "tree:2": {"A", "B"}}[topology]
    assert servers == want, f"{topology}: bytes_sent {sent}, expected only {sorted(want)} to serve"
    net["D"].run("commit", "v1")
    assert net.currents() == {x: ("versions/v1", "v1") for x in "ABCD"}, net.currents()
