"""The engine barrier across three nodes (docs/engines.md, "The barrier, exactly").

A cluster commit of V: every node answers PREPARE only once its registered engines report V
loaded; one engine's refusal aborts the commit on every node (nobody flips) and `hwfs commit`
names the engine, the node and the reason; with every engine loaded the commit succeeds, each
engine gets the "current" event, and `hwfs status --cluster --json` shows each node's engines.
The engines are plain protocol clients (tests/integration/engine_proto.py).
"""

import subprocess

import pytest

from conftest import HWFS, TIMEOUT, poll
from engine_proto import Conn


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
