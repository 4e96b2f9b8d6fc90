"""Replication across three nodes A, B, C joined to one coordinator.

The tests share the module's cluster (see conftest.py) but not their
preconditions: each one asks for the versions and commits it needs.  Models are
about 30 MiB; v2..v5 each replace 2 of v1's 20 tensors with values of their own.
"""

import os

import pytest

from conftest import assert_error_line, assert_tree_equal, poll, sh

from conftest import find_all, flip_byte

from .conftest import Inotify, readlink


@pytest.mark.limit(150)
def test_publish_converges_on_every_node(cluster, models):
    """1. publish v1 on A -> within 60 s every node lists v1 sealed, same digest, same bytes."""
    m = models["v1"]
    assert not cluster["A"].version("v1"), "v1 exists before the test published it"
    digest = cluster.publish("A", m)
    cluster.wait_version("v1", digest, timeout=60)
    cluster.digests["v1"] = digest
    for node in cluster:
        v = node.version("v1")
        assert v["state"] == "sealed" and v["digest"] == digest, f"{node.name}: {v}"
        assert_tree_equal(m.path, node.vpath("v1"))
        assert node.status()["store"]["preallocated"] is node.preallocate, node.name


@pytest.mark.limit(120)
def test_delta_sends_only_changed_tensors(cluster, models):
    """2. v2 changes 10% of v1's tensors: each receiver gets those bytes, not much more."""
    cluster.ensure_version("v1", models)
    assert not cluster["A"].version("v2"), "v2 was published by an earlier test; run the module in file order"
    m = models["v2"]
    changed = m.changed_bytes
    receivers = cluster.others("A")
    before = {n.name: n.bytes_received() for n in receivers}
    digest = cluster.publish("A", m)
    cluster.wait_version("v2", digest)
    cluster.digests["v2"] = digest
    limit = int(1.05 * changed) + 64 * 1024
    for n in receivers:
        got = n.bytes_received() - before[n.name]
        assert changed <= got <= limit, (
            f"{n.name} received {got} bytes for v2; its changed tensors {m.changed} hold {changed} bytes "
            f"(allowed {changed}..{limit})")
        assert_tree_equal(m.path, n.vpath("v2"))


@pytest.mark.limit(120)
def test_arrival_is_seen_through_the_mount(cluster, models):
    """3. inotifywait -m C/versions started before publishing sees v3 arrive, complete."""
    cluster.ensure_version("v1", models)  # so v3 travels as a delta
    m = models["v3"]
    c = cluster["C"]
    assert not c.visible("v3")
    with Inotify(c.path("versions")) as ino:
        digest = cluster.publish("A", m)
        cluster.wait_version("v3", digest)
        cluster.digests["v3"] = digest
        ino.wait_for(("MOVED_TO", "CREATE"), "v3")
    assert_tree_equal(m.path, c.vpath("v3"))


@pytest.mark.limit(120)
def test_commit_flips_every_node(cluster, models):
    """4. hwfs commit v1 on B flips current on every node before it returns."""
    cluster.ensure_version("v1", models)
    nodes = list(cluster)
    watches = []
    try:
        for n in nodes:
            watches.append(Inotify(n.mnt).__enter__())
        cluster["B"].run("commit", "v1")
        for n in nodes:
            assert readlink(n.path("current")) == "versions/v1", f"{n.name}: current -> {readlink(n.path('current'))}"
            assert n.status()["current"] == "v1", f"{n.name}: status current {n.status()['current']}"
        for n, w in zip(nodes, watches):
            w.wait_for(("MOVED_TO",), "current")
    finally:
        for w in watches:
            w.__exit__(None, None, None)
    assert cluster["A"].cluster_status()["committed"] == "v1"


@pytest.mark.limit(120)
def test_commit_record_says_where_the_time_went(cluster, models):
    """4b. The coordinator's record of a commit (status --cluster "commits") breaks its time down:
    each node's READY and ACK (seconds from the request) and its own prepare and flip time (us),
    the decision's time and how long recording it took (docs/benchmarks.md, "Commit latency")."""
    cluster.ensure_version("v1", models)
    cluster.ensure_version("v3", models)
    cluster["B"].run("commit", "v3")
    cluster["C"].run("commit", "v1")
    rec = cluster["A"].cluster_status()["commits"][-1]
    names = sorted(n.name for n in cluster)
    assert rec["version"] == "v1" and rec["outcome"] == "committed", rec
    for key in ("ready_s", "ack_s", "prepare_us", "flip_us"):
        assert sorted(rec.get(key, {})) == names, f"{key}: {rec.get(key)}"
    assert all(isinstance(x, int) and x >= 0 for x in rec["prepare_us"].values()), rec["prepare_us"]
    assert all(isinstance(x, int) and x > 0 for x in rec["flip_us"].values()), rec["flip_us"]
    # the order of events, as the coordinator saw them
    assert max(rec["ready_s"].values()) <= rec["decided_s"] <= min(rec["ack_s"].values()), rec
    assert max(rec["ack_s"].values()) <= rec["duration_s"], rec
    assert 0 <= rec["record_s"] <= rec["decided_s"], rec


@pytest.mark.limit(120)
def test_commit_aborts_when_a_node_refuses(cluster, models):
    """5. v2 damaged on C: hwfs commit v2 on A aborts and no node's current moves."""
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v2", models)
    c = cluster["C"]
    m = models["v2"]
    victim = max(m.changed, key=lambda n: m.tensors[n].nbytes)  # occurs in no other version
    raw = m.tensors[victim].tobytes()
    mid = len(raw) // 2
    arena = os.path.join(c.store, "arena")
    hits = find_all(arena, raw[mid:mid + 4096])
    assert hits, f"could not find v2's tensor {victim} in C's {arena}"
    for off in hits:
        flip_byte(arena, off + 1000)
    assert c.run("verify", "v2", check=False).returncode == 1, "hwfs verify v2 on C did not find the damage"
    assert c.version("v2")["state"] == "damaged"

    cp = cluster["A"].run("commit", "v2", check=False)
    moved = {n.name: n.current() for n in cluster if n.current() != ("versions/v1", "v1")}
    assert not moved, (f"current moved on {moved} although C refused v2; commit exited {cp.returncode}, "
                       f"stderr {cp.stderr!r}")
    assert_error_line(cp, "abort")
    assert cluster["B"].cluster_status()["committed"] == "v1"


@pytest.mark.limit(120)
def test_commit_local_flips_only_that_node(cluster, models):
    """6. hwfs commit v4 --local on A flips A; B and C keep v1."""
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v4", models)  # on every node, so a cluster-wide flip could happen
    a = cluster["A"]
    a.run("commit", "v4", "--local")
    assert a.current() == ("versions/v4", "v4"), f"A: {a.current()}"
    others = cluster.others("A")
    moved = poll(lambda: [n.name for n in others if n.current() != ("versions/v1", "v1")], timeout=2.0)
    assert not moved, f"commit --local on A moved current on {moved}: {[n.current() for n in others]}"


@pytest.mark.limit(120)
def test_status_cluster(cluster, models):
    """7. status --cluster: 3 alive nodes, v1 complete on each; node status has node/coordinator/replication."""
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    for n in cluster:
        st = n.status()
        assert st["node"] == n.name
        assert st["coordinator"] == cluster.coord.url
        rep = st["replication"]
        assert isinstance(rep["bytes_received"], int) and rep["bytes_received"] >= 0, rep
        assert isinstance(rep["bytes_sent"], int) and rep["bytes_sent"] >= 0, rep
    for viewer in cluster:
        cs = viewer.cluster_status()
        assert cs["coordinator"] == cluster.coord.url, cs
        assert cs["committed"] == "v1", cs
        nodes = {n["name"]: n for n in cs["nodes"]}
        assert sorted(nodes) == ["A", "B", "C"], cs
        held = set()
        for name, n in nodes.items():
            assert n["alive"] is True, f"{viewer.name} sees {name} as not alive: {n}"
            v1 = [v for v in n["versions"] if v["name"] == "v1"]
            assert len(v1) == 1, f"{viewer.name}'s view of {name} has no single v1: {n}"
            v1 = v1[0]
            assert v1["complete"] is True and v1["bytes_needed"] == 0, f"{name}: {v1}"
            assert isinstance(v1["bytes_held"], int) and v1["bytes_held"] > 0, f"{name}: {v1}"
            held.add(v1["bytes_held"])
        assert len(held) == 1, f"complete copies of v1 hold different byte counts: {cs}"


@pytest.mark.limit(120)
def test_seal_on_another_node_replicates(cluster, models):
    """8. mkdir + cp + hwfs seal on B: v5 reaches A and C."""
    cluster.ensure_version("v1", models)
    m = models["v5"]
    b = cluster["B"]
    os.mkdir(b.vpath("v5"))
    sh(["cp", *m.files, b.vpath("v5")])
    b.run("seal", "v5")
    v = b.version("v5")
    assert v["state"] == "sealed", v
    cluster.wait_version("v5", v["digest"])
    cluster.digests["v5"] = v["digest"]
    for n in cluster:
        assert_tree_equal(m.path, n.vpath("v5"))
