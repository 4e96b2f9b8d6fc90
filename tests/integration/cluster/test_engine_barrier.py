"""The engine barrier across three nodes (docs/engines.md, "The barrier, exactly").

A cluster commit of V: every node answers PREPARE only once its registered engines report V
loaded; one engine's refusal aborts the commit on every node (nobody flips) and `hwfs commit`
names the engine, the node and the reason; with every engine loaded the commit succeeds, each
engine gets the "current" event, and `hwfs status --cluster --json` shows each node's engines
(which the coordinator takes from the nodes' heartbeats, checked: a hostile peer's claims are
bounded and sanitised).
The engines are plain protocol clients (tests/integration/engine_proto.py).
"""

import subprocess

import pytest

from conftest import HWFS, TIMEOUT, poll
from engine_proto import Conn

from .conftest import Rogue, node_view, ring


def engine(node, name):
    c = Conn(node.mnt, {"op": "engine", "name": name})
    first = c.line()
    assert first and first.get("ok"), f"engine {name} on {node.name}: {first}"
    return c


def commit_async(node, version):
    return subprocess.Popen([HWFS, "commit", version, "-m", node.mnt], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def prepare_of(e, version):
    """The next prepare event (other events skipped), checked to be for @version."""
    ev = e.event(timeout=15, skip=("arrived", "current", "removed"))
    assert ev == {"event": "prepare", "version": version}, ev
    return ev


@pytest.mark.limit(120)
def test_an_engine_refusal_aborts_the_cluster_commit(cluster, models):
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v2", models)
    eb, ec = engine(cluster["B"], "eng-b"), engine(cluster["C"], "eng-c")
    try:
        p = commit_async(cluster["A"], "v2")
        prepare_of(ec, "v2")
        ec.send({"report": "loaded", "version": "v2"})
        prepare_of(eb, "v2")
        eb.send({"report": "refused", "version": "v2", "reason": "out of GPU memory"})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode != 0, out + err
        assert "node B is not ready: engine eng-b refused v2: out of GPU memory" in err, out + err
        for n in cluster:
            assert n.current() == ("versions/v1", "v1"), f"{n.name} flipped: {n.current()}"
    finally:
        eb.close()
        ec.close()


@pytest.mark.limit(120)
def test_loaded_engines_let_the_commit_through_and_see_it(cluster, models):
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v2", models)
    engines = {n.name: engine(n, f"eng-{n.name.lower()}") for n in cluster}
    try:
        for e in engines.values():  # each serves v1 already
            e.send({"report": "swapped", "version": "v1", "pause_us": 0})
        p = commit_async(cluster["B"], "v2")
        for e in engines.values():
            prepare_of(e, "v2")
            e.send({"report": "loaded", "version": "v2"})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, out + err
        for name, e in engines.items():
            assert e.event(skip=("arrived",)) == {"event": "current", "version": "v2"}, name
            e.send({"report": "swapped", "version": "v2", "pause_us": 42})
            assert cluster[name].current() == ("versions/v2", "v2")

        def shown():  # the nodes' heartbeats carry their engines to the coordinator
            cs = cluster["A"].cluster_status()
            got = {n["name"]: n.get("engines") for n in cs.get("nodes", [])}
            return all(got.get(name) and got[name][0]["serving"] == "v2" and got[name][0]["swaps"] == 1
                       for name in engines) and got

        got = poll(shown, timeout=10, interval=0.2)
        assert got, cluster["A"].cluster_status()
        for name in engines:
            assert got[name] == [{"name": f"eng-{name.lower()}", "pid": got[name][0]["pid"],
                                  "serving": "v2", "shadow": None, "state": "idle", "reason": None,
                                  "last_swap_pause_us": 42, "swaps": 1}], got[name]
    finally:
        for e in engines.values():
            e.close()
    cluster["A"].run("commit", "v1")  # leave the cluster as the other tests expect it


@pytest.mark.limit(120)
def test_an_engine_that_goes_away_stops_holding_the_commit(cluster, models):
    """C's engine gets PREPARE and disconnects without a report: C's agent, woken by the
    disconnect, answers READY, and the commit goes through on every node."""
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v2", models)
    ec = engine(cluster["C"], "eng-gone")
    try:
        p = commit_async(cluster["A"], "v2")
        prepare_of(ec, "v2")
        assert p.poll() is None, "the commit did not wait for C's engine"
    finally:
        ec.close()
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, out + err
    for n in cluster:
        assert n.current() == ("versions/v2", "v2"), f"{n.name}: {n.current()}"
    cluster["A"].run("commit", "v1")


@pytest.mark.limit(90)
def test_coordinator_keeps_only_sane_engine_reports(net):
    """A joined peer's HELLO claims engines with hostile values: the coordinator keeps at most
    64, leaves out entries without a valid engine name, and shows every bad field as null."""
    ring(net, ["A"])
    hostile = [{"name": "ok-1", "pid": -5, "serving": "x" * 300, "shadow": "a\u0001b",
                "state": "exploded", "reason": "r" * 600, "last_swap_pause_us": "lots",
                "swaps": 2 ** 60},
               {"name": "bad name", "state": "idle"}, {"name": 5}, "not an object", None,
               {"name": "ok-2", "pid": 7, "serving": "v1", "shadow": None, "state": "loaded",
                "reason": None, "last_swap_pause_us": 3, "swaps": 1}]
    hostile += [{"name": f"e{i}", "state": "idle"} for i in range(100)]
    with Rogue(net.coord.url, "rogue") as r:
        def seen():
            r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None,
                   engines=hostile)
            n = node_view(net["A"].try_cluster_status(), "rogue")
            return n if n and n.get("alive") and n.get("engines") else None

        n = poll(seen, timeout=15, interval=0.3)
    assert n, net["A"].try_cluster_status()
    eng = n["engines"]
    assert len(eng) == 64, len(eng)
    assert eng[0] == {"name": "ok-1", "pid": None, "serving": None, "shadow": None, "state": None,
                      "reason": None, "last_swap_pause_us": None, "swaps": None}, eng[0]
    assert eng[1] == {"name": "ok-2", "pid": 7, "serving": "v1", "shadow": None, "state": "loaded",
                      "reason": None, "last_swap_pause_us": 3, "swaps": 1}, eng[1]
    assert [e["name"] for e in eng[2:]] == [f"e{i}" for i in range(62)]
    assert net.coord.alive()
