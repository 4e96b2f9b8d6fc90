"""The engine barrier across three nodes (docs/engines.md, "The barrier, exactly").

A cluster commit of V: every node answers PREPARE only once its registered engines report V
loaded; one engine's refusal aborts the commit on every node (nobody flips) and `hwfs commit`
names the engine, the node and the reason; with every engine loaded the commit succeeds, each
engine gets the "current" event, and `hwfs status --cluster --json` shows each node's engines
(which the coordinator takes from the nodes' heartbeats, checked: a hostile peer's claims are
bounded and sanitised, control characters blanked in what `hwfs commit` and `hwfs status
--cluster` print).  A node re-checks the version before it answers READY after waiting for its
engines, and sends an early heartbeat only when its engines' list changed.
The engines are plain protocol clients (tests/integration/engine_proto.py).
"""

import json
import subprocess
import threading
import time

import pytest

from conftest import HWFS, TIMEOUT, poll, scaled
from engine_proto import Conn, call

from .conftest import CHUNK, Rogue, corrupt_chunk, node_view, random_model, ring


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
def test_coordinator_refusals_carry_errno_through_the_node(cluster, models):
    """The coordinator's refusals reach the client with an errno (docs/libhwfs.md,
    "Errors"): a commit while another one is in progress is EBUSY, an aborted one
    ECANCELED, relayed by the node as it got them."""
    import errno as E

    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v2", models)
    eb, ec = engine(cluster["B"], "eng-b"), engine(cluster["C"], "eng-c")
    first = {}
    t = threading.Thread(target=lambda: first.update(call(cluster["A"].mnt, {"op": "commit",
                                                                            "version": "v2"},
                                                          timeout=TIMEOUT)))
    t.start()
    try:
        prepare_of(ec, "v2")
        busy = call(cluster["C"].mnt, {"op": "commit", "version": "v2"})
        assert busy["ok"] is False and busy.get("errno") == E.EBUSY, busy
        assert "another commit is in progress" in busy["error"], busy
        ec.send({"report": "loaded", "version": "v2"})
        prepare_of(eb, "v2")
        eb.send({"report": "refused", "version": "v2", "reason": "out of GPU memory"})
        t.join(TIMEOUT)
        assert first.get("ok") is False and first.get("outcome") == "aborted", first
        assert first.get("errno") == E.ECANCELED, first
    finally:
        t.join(TIMEOUT)
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


def hello_with_engines(net, rogue, engines):
    """Send the joined peer @rogue's HELLO claiming @engines until the coordinator shows
    them (as node A sees it); returns that node view, or None after 15 s."""
    def seen():
        rogue.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None,
                   engines=engines)
        n = node_view(net["A"].try_cluster_status(), "rogue")
        return n if n and n.get("alive") and n.get("engines") else None

    return poll(seen, timeout=15, interval=0.3)


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
        n = hello_with_engines(net, r, hostile)
    assert n, net["A"].try_cluster_status()
    eng = n["engines"]
    assert len(eng) == 64, len(eng)
    assert eng[0] == {"name": "ok-1", "pid": None, "serving": None, "shadow": None, "state": None,
                      "reason": None, "last_swap_pause_us": None, "swaps": None}, eng[0]
    assert eng[1] == {"name": "ok-2", "pid": 7, "serving": "v1", "shadow": None, "state": "loaded",
                      "reason": None, "last_swap_pause_us": 3, "swaps": 1}, eng[1]
    assert [e["name"] for e in eng[2:]] == [f"e{i}" for i in range(62)]
    assert net.coord.alive()


def control_chars(text):
    """The C0, DEL and C1 control characters in @text (a terminal may obey any of them)."""
    return [c for c in text if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f]


HOSTILE = "bad\x1b[31m red\x07\u009b end\x1b]0;owned\x07"
BLANKED = "bad [31m red   end ]0;owned "


@pytest.mark.limit(90)
def test_coordinator_blanks_control_characters_of_engine_reasons(net):
    """A peer's engine reason with terminal escapes (C0, DEL, C1) is shown with each control
    character turned into a space, in `status --cluster --json` and in its text form."""
    ring(net, ["A"])
    eng = [{"name": "e1", "pid": 1, "serving": None, "shadow": "v1", "state": "refused",
            "reason": HOSTILE, "last_swap_pause_us": None, "swaps": 0}]
    with Rogue(net.coord.url, "rogue") as r:
        n = hello_with_engines(net, r, eng)
        assert n, net["A"].try_cluster_status()
        assert n["engines"][0]["reason"] == BLANKED, n["engines"][0]
        text = net["A"].run("status", "--cluster").stdout
        assert "rogue" in text and not control_chars(text.replace("\n", "")), repr(text)
    # a node name with control characters is not joined at all
    with Rogue(net.coord.url, "evil\x1b[2J") as r:
        def dropped():
            r.send("HELLO", node="evil\x1b[2J", listen="tcp://127.0.0.1:1", versions=[],
                   current=None)
            return "its node name holds control characters" in net.coord.log_text()

        assert poll(dropped, timeout=15, interval=0.3), net.coord.log_text()[-2000:]
    assert not any("evil" in n["name"] for n in net["A"].try_cluster_status()["nodes"])


@pytest.mark.limit(90)
def test_coordinator_blanks_control_characters_of_ready_and_ack_reasons(net, tmp_path):
    """A peer answers PREPARE not ready, then a failed flip (ACK), with terminal escapes in
    its reasons: the commit's answer, which `hwfs commit` prints, carries them blanked."""
    ring(net, ["A"])
    a = net["A"]
    net.publish("A", random_model(tmp_path / "v1", CHUNK, seed=71), "v1")
    with Rogue(net.coord.url, "rogue") as r:
        def joined():
            r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None)
            return node_view(a.try_cluster_status(), "rogue") or {}

        assert poll(lambda: joined().get("alive"), timeout=15, interval=0.3)

        def commit_answering(kind):
            """Commit v1 from A; the rogue answers its PREPARE (and COMMIT) as @kind says."""
            r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None)
            r.received(0)
            res = {}
            t = threading.Thread(target=lambda: res.update(
                call(a.mnt, {"op": "commit", "version": "v1"}, timeout=TIMEOUT)))
            t.start()
            try:
                end = time.monotonic() + scaled(15)
                answered = set()
                while time.monotonic() < end and len(answered) < (1 if kind == "READY" else 2):
                    for m in r.received(200):
                        if m["t"] == "PREPARE" and "PREPARE" not in answered:
                            answered.add("PREPARE")
                            r.send("READY", txid=m["txid"], version="v1", ok=kind != "READY",
                                   reason=HOSTILE)
                        elif m["t"] == "COMMIT" and "COMMIT" not in answered:
                            answered.add("COMMIT")
                            r.send("ACK", txid=m["txid"], version="v1", ok=False, reason=HOSTILE)
            finally:
                t.join(TIMEOUT)
            return res

        for kind in ("READY", "ACK"):
            res = commit_answering(kind)
            assert res and res["ok"] is False, res
            assert res["failed"].get("rogue") == BLANKED, res
            assert not control_chars(json.dumps(res, ensure_ascii=False)), res
            assert BLANKED in res["error"] or kind == "ACK", res


@pytest.mark.limit(150)
def test_a_version_damaged_while_the_engines_load_it_is_not_ready(net, tmp_path):
    """B's engine gets PREPARE of v2; meanwhile v2 is found damaged on B (`hwfs verify`);
    then the engine reports v2 loaded.  B re-checks v2 before it answers READY: not ready,
    the commit aborts and no node flips (not a partial commit with B unable to flip).
    The deadlines are long: the corruption and `hwfs verify` happen inside the barrier, and
    under a sanitizer on a loaded machine they took longer than the default 8 s engine
    deadline, which aborts the commit for another reason."""
    net.start_coord(tunables={"commit_deadline_ms": 40000})
    for name in ("A", "B"):
        net.add(name, extra=["-o", "engine_deadline_ms=30000", "-o", "commit_deadline_ms=40000"])
    net.wait_alive(["A", "B"], viewer=net["A"])
    src = {v: random_model(tmp_path / v, 3 * CHUNK, seed=s) for v, s in (("v1", 81), ("v2", 82))}
    for v in ("v1", "v2"):
        net.wait_version(v, net.publish("A", src[v], v))
        if v == "v1":
            net["A"].run("commit", "v1")
    eb = engine(net["B"], "eng-b")
    try:
        p = commit_async(net["A"], "v2")
        prepare_of(eb, "v2")
        corrupt_chunk(net["B"], src["v2"] / "model.bin", 1)
        net["B"].run("verify", "v2", check=False)
        assert net["B"].version("v2")["state"] == "damaged"
        eb.send({"report": "loaded", "version": "v2"})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode != 0, out + err
        assert "node B is not ready: version v2 is damaged" in err, out + err
        for n in net:
            assert n.current() == ("versions/v1", "v1"), f"{n.name} flipped: {n.current()}"
    finally:
        eb.close()


@pytest.mark.limit(90)
def test_an_early_hello_only_when_the_engines_changed(net, tmp_path):
    """A node joined to a stand-in coordinator (a ZeroMQ ROUTER that only listens), with a
    heartbeat of an hour: only an engine change may send a HELLO.  An engine that repeats a
    report that changes nothing, spaced past the 50 ms gap of early HELLOs, sends none; the
    next real change sends one."""
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        node = net.add("A", wait=False, coord_url=f"tcp://127.0.0.1:{port}",
                       extra=["-o", "heartbeat_ms=3600000"])
        net.publish("A", random_model(tmp_path / "v1", CHUNK, seed=91), "v1")

        def hellos(timeout_ms):
            """The engines of each HELLO that arrived (after up to @timeout_ms for the first)."""
            out = []
            while sock.poll(timeout_ms if not out else 0):
                hdr = json.loads(sock.recv_multipart()[1])
                if hdr["t"] == "HELLO":
                    out.append(hdr.get("engines"))
            return out

        def until_hello(pred):
            """HELLOs until one whose engines satisfy @pred; all of them."""
            got, end = [], time.monotonic() + scaled(15)
            while time.monotonic() < end and not (got and pred(got[-1])):
                got += hellos(500)
            assert got and pred(got[-1]), got
            return got

        e = engine(node, "e1")
        try:
            e.send({"report": "swapped", "version": "v1", "pause_us": 0})
            until_hello(lambda en: en and en[0]["serving"] == "v1")
            for _ in range(12):  # each report past the early-HELLO gap: one HELLO each before
                e.send({"report": "swapped", "version": "v1", "pause_us": 0})
                time.sleep(0.08)
            e.send({"report": "loaded", "version": "v1"})
            got = until_hello(lambda en: en and en[0]["state"] == "loaded")
            assert len(got) == 1, f"{len(got) - 1} HELLO(s) for reports that changed nothing: {got}"
        finally:
            e.close()
    finally:
        sock.close(0)
        ctx.term()
