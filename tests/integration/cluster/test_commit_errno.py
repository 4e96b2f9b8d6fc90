"""Every replication reply that can fail carries an errno (docs/protocol.md, "errno"), and
the coordinator relays the refusing node's to the commit's answer: `hwfs commit` and libhwfs
callers see why a commit failed as a number, not only as a sentence.

A real coordinator and a real node A; a rogue peer joined as node "rogue" (a raw ZeroMQ
DEALER, tests/integration/cluster/conftest.py) answers the PREPAREs as each test says:

- READY not ok with ENOSPC: `hwfs commit` fails with ENOSPC and the node's reason;
- no READY at all: the coordinator's prepare deadline aborts the commit with ETIMEDOUT;
- READY not ok with a hostile errno (a string, zero, out of range, an object): EPROTO, the
  coordinator and the node unharmed.

ECANCELED stays the errno of a node that refuses without one (a peer that predates it) and of
an engine's refusal (test_engine_barrier.py).
"""

import errno
import json
import subprocess
import threading
import time

import pytest

from conftest import HWFS, TIMEOUT, poll, scaled

from .conftest import CHUNK, Rogue, node_view, random_model

DEADLINE_MS = 2000  # A's commit_deadline_ms: the coordinator's prepare deadline here


def join(net, r):
    """The rogue joins as node "rogue" (alive in A's view of the cluster)."""
    def joined():
        r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None)
        return (node_view(net["A"].try_cluster_status(), "rogue") or {}).get("alive")

    assert poll(joined, timeout=15, interval=0.3), net["A"].try_cluster_status()


def commit_json(net, r, answer):
    """`hwfs commit --json v1` on A while the rogue answers its PREPARE with @answer(txid)
    (a dict of READY fields, or None: no answer).  Returns (exit code, reply, stderr)."""
    r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None)
    r.received(0)
    p = subprocess.Popen([HWFS, "commit", "--json", "v1", "-m", net["A"].mnt],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}

    def pump():
        end = time.monotonic() + scaled(20)
        while time.monotonic() < end and p.poll() is None:
            for m in r.received(200):
                if m["t"] == "PREPARE" and "ready" not in out:
                    out["ready"] = answer(m["txid"])
                    if out["ready"] is not None:
                        r.send("READY", txid=m["txid"], version="v1", **out["ready"])
            # stay alive for the coordinator while the commit runs
            r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None)

    t = threading.Thread(target=pump)
    t.start()
    try:
        stdout, stderr = p.communicate(timeout=TIMEOUT)
    finally:
        t.join(TIMEOUT)
    assert "ready" in out, "the rogue got no PREPARE"
    return p.returncode, json.loads(stdout), stderr


@pytest.fixture
def rogue_net(net, tmp_path):
    net.start_coord()
    net.add("A", extra=["-o", f"commit_deadline_ms={DEADLINE_MS}",
                        "-o", f"engine_deadline_ms={DEADLINE_MS // 2}"])
    net.wait_alive(["A"], viewer=net["A"])
    net.publish("A", random_model(tmp_path / "v1", CHUNK, seed=29), "v1")
    with Rogue(net.coord.url, "rogue") as r:
        join(net, r)
        yield net, r


@pytest.mark.limit(90)
def test_a_node_refusal_carries_its_errno_to_hwfs_commit(rogue_net):
    net, r = rogue_net
    rc, res, err = commit_json(net, r, lambda txid: {"ok": False, "errno": errno.ENOSPC,
                                                     "reason": "no room for the shadow copy"})
    assert rc != 0, res
    assert res["outcome"] == "aborted", res
    assert errno.errorcode[res["errno"]] == "ENOSPC", res
    assert "node rogue is not ready: no room for the shadow copy" in err, err
    assert res["failed"] == {"rogue": "no room for the shadow copy"}, res
    assert net["A"].try_cluster_status().get("committed") != "v1", "v1 committed although aborted"
    last = net["A"].status()["last_refused_commit"]
    assert last["version"] == "v1" and last["errno"] == errno.ENOSPC, last


@pytest.mark.limit(90)
def test_a_prepare_that_times_out_is_etimedout(rogue_net):
    net, r = rogue_net
    rc, res, err = commit_json(net, r, lambda txid: None)  # the rogue never answers
    assert rc != 0, res
    assert res["outcome"] == "aborted", res
    assert errno.errorcode[res["errno"]] == "ETIMEDOUT", res
    assert "deadline passed waiting for rogue" in err, err
    assert "rogue" in res["unknown"], res


@pytest.mark.limit(120)
def test_a_hostile_errno_is_eproto_and_harms_nobody(rogue_net):
    net, r = rogue_net
    for bad in ("ENOSPC", 0, -28, 4096, 2 ** 62, 28.0, True, [28], {"errno": 28}):
        rc, res, err = commit_json(net, r, lambda txid: {"ok": False, "errno": bad,
                                                         "reason": "hostile"})
        assert rc != 0, (bad, res)
        assert res["outcome"] == "aborted", (bad, res)
        assert errno.errorcode[res["errno"]] == "EPROTO", (bad, res)
        assert "node rogue is not ready: hostile" in err, (bad, err)
    # a refusal without an errno (a peer that predates it) stays ECANCELED
    rc, res, err = commit_json(net, r, lambda txid: {"ok": False, "reason": "old peer"})
    assert errno.errorcode[res["errno"]] == "ECANCELED", res
    assert net.coord.alive()
    # and a ready answer still commits
    rc, res, err = commit_json(net, r, lambda txid: {"ok": True, "reason": "ready"})
    # the rogue sends no ACK: the decision stands, the outcome is partial (EINPROGRESS)
    assert res["outcome"] == "partial" and res["committed"] == ["A"], res
    assert errno.errorcode[res["errno"]] == "EINPROGRESS", res
    assert net["A"].current()[1] == "v1"
