"""The commit barrier across a cluster, with a C engine (build/hwfs-engine) on each node
(docs/engines.md).

Each test builds its own cluster (``net``: a coordinator and nodes A, B, C mounted with
``-o engine_deadline_ms=ENGINE_DEADLINE_MS``), commits v1 and starts engine ``e-X`` on
every node X, serving v1.  Engines are stopped by pid at teardown (``procs``).
"""

import re
import shutil
import signal

import numpy as np
import pytest

from conftest import poll
from engine_proc import engine_state, procs, start_engine  # noqa: F401 (procs: fixture)

from .conftest import node_view

NODES = ("A", "B", "C")
ENGINE_DEADLINE_MS = 3000  # well below commit_deadline_ms (10 s)


def node_engine(net, procs, tmp_path, name, **kw):
    """Engine e-@name on node @name, started (see engine_proc.start_engine)."""
    return start_engine(procs, net[name].mnt, f"e-{name}", tmp_path, **kw)


def engine_cluster(net, procs, tmp_path, models):
    """A, B, C with v1 committed and an engine on each serving it; returns {node: engine}."""
    net.start_coord()
    for name in NODES:
        net.add(name, extra=["-o", f"engine_deadline_ms={ENGINE_DEADLINE_MS}"])
    net.wait_alive(list(NODES), viewer=net["A"])
    d1 = net.publish("A", models["v1"].path, "v1")
    net.wait_version("v1", d1)
    net["B"].run("commit", "v1")
    engines = {name: node_engine(net, procs, tmp_path, name) for name in NODES}
    for e in engines.values():
        assert e.wait_serving("v1")["digest"] == d1
    return engines


def bad_model(models, root):
    """v2 of the models with one tensor of another shape (the engines refuse it)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(models["v2"].path, root)
    path = root / "model-00001-of-00002.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = np.ascontiguousarray(tensors[name][: tensors[name].shape[0] // 2])
    save_file(tensors, str(path), metadata={"format": "np"})
    return root, name


def committed_on(cp):
    """The node names of the `committed on: A, B` line of `hwfs commit`."""
    for line in cp.stdout.splitlines():
        if line.startswith("committed on:"):
            return sorted(n.strip() for n in line.split(":", 1)[1].split(","))
    return []


def currents(net):
    return {n.name: n.current()[0] for n in net}


@pytest.mark.limit(90)
def test_commit_reaches_every_engine(net, procs, tmp_path, models):
    engines = engine_cluster(net, procs, tmp_path, models)
    d2 = net.publish("A", models["v2"].path, "v2")
    net.wait_version("v2", d2)
    cp = net["C"].run("commit", "v2")
    assert committed_on(cp) == list(NODES), cp.stdout
    for e in engines.values():
        assert e.wait_serving("v2")["digest"] == d2
    for name in NODES:
        st = engine_state(net[name], f"e-{name}")
        assert st["serving"] == "v2" and st["swaps"] >= 1 and st["last_swap_pause_us"] >= 1, st

    # every node's engine as the coordinator shows it (from the nodes' heartbeats), and
    # the text of `hwfs status --cluster`
    def served():
        cs = net["A"].try_cluster_status()
        return cs and all([e.get("serving") for e in (node_view(cs, n) or {}).get("engines", [])] == ["v2"]
                          for n in NODES)
    assert poll(served, timeout=10), net["A"].try_cluster_status()
    text = net["B"].run("status", "--cluster").stdout
    for name in NODES:
        assert f"engine:  e-{name} (pid {engines[name].pid}): serving v2" in text, text


@pytest.mark.limit(90)
def test_refusing_engine_aborts_the_commit_everywhere(net, procs, tmp_path, models):
    engines = engine_cluster(net, procs, tmp_path, models)
    # only C keeps an engine: its refusal alone must stop every node
    for name in ("A", "B"):
        assert engines[name].stop() == 0
        assert poll(lambda: engine_state(net[name], f"e-{name}") is None)
    src, tensor = bad_model(models, tmp_path / "bad")
    d = net.publish("A", src, "vbad")
    net.wait_version("vbad", d)
    engines["C"].wait_log("refused vbad")
    cp = net["A"].run("commit", "vbad", check=False)
    assert cp.returncode == 1, cp
    assert re.search(rf"node C is not ready: engine e-C refused vbad: tensor {re.escape(tensor)}: "
                     rf"shape \[\d+, 256\] does not match the model's \[\d+, 256\]", cp.stderr), cp.stderr
    assert currents(net) == {n: "versions/v1" for n in NODES}
    assert engines["C"].ask()["version"] == "v1"


@pytest.mark.limit(90)
def test_hung_engine_aborts_the_commit_at_the_deadline(net, procs, tmp_path, models):
    engines = engine_cluster(net, procs, tmp_path, models)
    engines["C"].signal(signal.SIGSTOP)
    try:
        d2 = net.publish("A", models["v2"].path, "v2")
        net.wait_version("v2", d2)
        cp = net["B"].run("commit", "v2", check=False)
        assert cp.returncode == 1, cp
        assert (f"node C is not ready: engine e-C did not report v2 loaded within "
                f"{ENGINE_DEADLINE_MS} ms") in cp.stderr, cp.stderr
        assert currents(net) == {n: "versions/v1" for n in NODES}
    finally:
        engines["C"].signal(signal.SIGCONT)
    # awake again, it loads v2, and the next commit goes through
    assert poll(lambda: (engine_state(net["C"], "e-C") or {}).get("state") == "loaded", timeout=20)
    net["B"].run("commit", "v2")
    for e in engines.values():
        assert e.wait_serving("v2")["digest"] == d2


@pytest.mark.limit(90)
def test_engine_killed_mid_load_does_not_block_the_next_commit(net, procs, tmp_path, models):
    engines = engine_cluster(net, procs, tmp_path, models)
    assert engines["C"].stop() == 0
    # an engine that takes a minute to load anything new
    slow = node_engine(net, procs, tmp_path, "C", load_delay_ms=60000)
    slow.wait_serving("v1")
    d2 = net.publish("A", models["v2"].path, "v2")
    net.wait_version("v2", d2)
    slow.wait_log("loading v2")
    assert (engine_state(net["C"], "e-C") or {}).get("state") == "loading"
    slow.kill9()
    cp = net["B"].run("commit", "v2")
    assert committed_on(cp) == list(NODES), cp.stdout
    assert currents(net) == {n: "versions/v2" for n in NODES}
    for name in ("A", "B"):
        engines[name].wait_serving("v2")


@pytest.mark.limit(90)
def test_restarted_engine_loads_current(net, procs, tmp_path, models):
    engines = engine_cluster(net, procs, tmp_path, models)
    engines["B"].kill9()
    assert poll(lambda: engine_state(net["B"], "e-B") is None)
    d2 = net.publish("A", models["v2"].path, "v2")
    net.wait_version("v2", d2)
    net["A"].run("commit", "v2")
    again = node_engine(net, procs, tmp_path, "B")
    assert again.wait_serving("v2")["digest"] == d2
    st = engine_state(net["B"], "e-B")
    assert st["serving"] == "v2" and st["pid"] == again.pid, st


@pytest.mark.limit(90)
def test_cluster_status_shows_a_swap_before_the_next_heartbeat(net, procs, tmp_path, models):
    """Heartbeats every 60 s: what `status --cluster` shows of the engines can only come
    from the early HELLO a node sends when one of its engines reports."""
    slow = {"heartbeat_ms": 60000, "coord_silence_ms": 180000}
    net.start_coord(tunables={"node_dead_ms": 180000})
    for name in ("A", "B"):
        net.add(name, extra=[x for k, v in slow.items() for x in ("-o", f"{k}={v}")])
    net.wait_alive(["A", "B"], viewer=net["A"])
    d1 = net.publish("A", models["v1"].path, "v1")
    net.wait_version("v1", d1)
    net["B"].run("commit", "v1")
    d2 = net.publish("A", models["v2"].path, "v2")
    net.wait_version("v2", d2)
    engines = {name: node_engine(net, procs, tmp_path, name) for name in ("A", "B")}
    for e in engines.values():
        assert e.wait_serving("v1")["digest"] == d1

    def serving(v):
        cs = net["A"].try_cluster_status()
        return cs and all([e.get("serving") for e in (node_view(cs, n) or {}).get("engines", [])]
                          == [v] for n in ("A", "B"))
    assert poll(lambda: serving("v1"), timeout=10), net["A"].try_cluster_status()
    net["A"].run("commit", "v2")
    assert poll(lambda: serving("v2"), timeout=10), net["A"].try_cluster_status()
