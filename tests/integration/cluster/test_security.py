"""Keys (CURVE), the refusal to run keyless without --insecure, and what the coordinator
takes from peers that have not joined (or joined under another key).

Clusters come from the ``net`` fixture of cluster/conftest.py (a coordinator and nodes
started one at a time, all cleaned up after the test).
"""

import json
import os
import shutil
import signal
import stat
import time

import pytest

import conftest as base  # tests/integration/conftest.py
from conftest import HWFS, assert_error_line, poll, scaled, sh, wait_dead

from .conftest import ANY_PORT
from .conftest import Coord, Rogue, assert_identical, node_view, random_model, ring, version_view

Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
REFUSAL = "refused a connection with unknown key"
STATUS_WAIT_S = 10  # status_wait_ms's default (fs/common/tunables.h): status --cluster's deadline


def keygen(d):
    cp = sh([HWFS, "keygen", d])
    return cp.stdout.strip()


def pub(d):
    with open(os.path.join(d, "key.pub")) as f:
        return f.read().strip()


def authorize(d, name, other):
    """Let the holder of key dir @other in: copy its key.pub to @d/authorized/@name.pub."""
    shutil.copyfile(os.path.join(other, "key.pub"), os.path.join(d, "authorized", f"{name}.pub"))


@pytest.mark.limit(150)
def test_keys_admit_the_authorized_and_refuse_an_unknown_node(net, tmp_path):
    """Coordinator + A, B, C with mutually authorized keys converge; D, whose key nobody
    authorized, never receives the version, its status --cluster fails, the coordinator logs it."""
    kd = {x: str(tmp_path / f"keys-{x}") for x in ("coord", "A", "B", "C", "D")}
    for d in kd.values():
        keygen(d)
    members = ("A", "B", "C")
    for x in members:
        authorize(kd["coord"], x, kd[x])
        for y in members:
            if y != x:
                authorize(kd[x], y, kd[y])
    for x in (*members, "D"):
        shutil.copyfile(os.path.join(kd["coord"], "key.pub"), os.path.join(kd[x], "coordinator.pub"))
        authorize(kd[x], "coordinator", kd["coord"])
    for y in members:  # D trusts everyone; nobody trusts D
        authorize(kd["D"], y, kd[y])

    net.start_coord(keys=kd["coord"])
    for x in members:
        net.add(x, keys=kd[x])
    net.wait_alive(list(members), viewer=net["A"])
    d = net.add("D", keys=kd["D"], wait=False)

    src = random_model(tmp_path / "m", 12 << 20, seed=601)
    digest = net.publish("A", src, "v1")
    net.wait_version("v1", digest, nodes=[net[x] for x in members], timeout=60)
    for x in members:
        assert_identical(src, net[x], "v1")

    end = time.monotonic() + 5
    while time.monotonic() < end:
        assert os.listdir(d.path("versions")) == [], \
            f"D (unknown key) got versions: {os.listdir(d.path('versions'))}"
        time.sleep(0.2)

    t0 = time.monotonic()
    cp = d.run("status", "--cluster", "--json", check=False)
    took = time.monotonic() - t0
    assert cp.returncode != 0, f"status --cluster on D (unknown key) succeeded: {cp.stdout}"
    # it fails within the daemon's own deadline (status_wait_ms), give or take a (scaled) margin
    bound = STATUS_WAIT_S + scaled(5)
    assert took <= bound, f"status --cluster on D took {took:.1f}s to fail (want <= {bound:.0f}s)"

    cs = net["A"].try_cluster_status()
    assert node_view(cs, "D") is None, f"the coordinator lists D: {node_view(cs, 'D')}"
    assert {n["name"] for n in cs["nodes"] if n["alive"]} == set(members), cs
    assert poll(lambda: REFUSAL in net.coord.log_text(), timeout=5), \
        f"the coordinator log does not mention {REFUSAL!r}:\n{net.coord.log_tail()}"

    # The refused node still unmounts cleanly and its daemon exits by itself
    # (the fixture would kill a leftover daemon, which would hide a hang).
    d.umount()
    assert wait_dead(d.pid, scaled(10)), \
        f"D's daemon (refused key) still runs {scaled(10):.0f} s after hwfs umount\n{d.log_tail()}"


def test_keyless_needs_insecure_even_on_loopback(tmp_path):
    """Without --keys, a node (--join, --coordinator, --listen) or a coordinator is refused
    before it starts unless --insecure, on a loopback address too."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    store = tmp_path / "store"
    coord = "tcp://127.0.0.1:1"  # never reached: refused before it starts

    def mount(*args):
        cp = sh([HWFS, "mount", mnt, "--store", store, *args], check=False)
        if os.path.ismount(mnt):  # it was not refused: do not leave it behind
            sh([HWFS, "umount", mnt], check=False)
        return cp

    def coord_bg(listen):
        cp = sh([HWFS, "coord", "--listen", listen], check=False)
        if cp.returncode == 0:  # it was not refused: stop the coordinator it started
            os.kill(int(cp.stdout.split()[0]), signal.SIGTERM)
        return cp

    for listen in ("tcp://10.1.2.3:5000", ANY_PORT):
        assert_error_line(mount("--join", coord, "--node", "X", "--listen", listen), "keys", "--insecure")
    for embedded in ("tcp://10.1.2.3:5001", ANY_PORT):
        assert_error_line(mount("--coordinator", embedded, "--node", "X",
                                "--listen", ANY_PORT), "keys", "--insecure")
    assert not os.path.ismount(mnt)

    for listen in ("tcp://10.1.2.3:5000", ANY_PORT, "ipc:///tmp/hwfs-x"):
        assert_error_line(coord_bg(listen), "keys", "--insecure")
    cp = sh([HWFS, "coord", "--listen", "tcp://10.1.2.3:5000", "-f"], check=False)
    assert_error_line(cp, "keys", "--insecure")

    # --insecure lifts the refusal: 10.1.2.3 is not ours, so binding fails, but not for want of keys.
    cp = sh([HWFS, "coord", "--listen", "tcp://10.1.2.3:5000", "--insecure"], check=False)
    if cp.returncode == 0:  # this machine has 10.1.2.3 after all: a coordinator runs; stop it
        os.kill(int(cp.stdout.split()[0]), signal.SIGTERM)
    else:
        assert "refusing" not in cp.stderr and "without keys" not in cp.stderr, cp.stderr
        assert "cannot listen on tcp://10.1.2.3:5000" in cp.stderr, cp.stderr  # it got as far as binding


def refused(cs):
    return (cs or {}).get("refused_messages", 0)


@pytest.mark.limit(120)
def test_unjoined_peer_cannot_commit_announce_or_take_a_name(net, tmp_path):
    """A raw DEALER that never joined sends COMMIT_REQ, HAVE (blaming A) and a HELLO claiming
    to be A: no node flips, nothing about A changes, the peer gets no answer, and the
    coordinator counts and logs the refusals."""
    ring(net, ["A", "B", "C"])
    a = net["A"]
    m1 = random_model(tmp_path / "m1", 4 << 20, seed=701)
    m2 = random_model(tmp_path / "m2", 4 << 20, seed=702)
    net.wait_version("v1", net.publish("A", m1, "v1"))
    a.run("commit", "v1")
    d2 = net.publish("A", m2, "v2")
    net.wait_version("v2", d2)
    at_v1 = {n: ("versions/v1", "v1") for n in "ABC"}
    before = node_view(a.try_cluster_status(), "A")

    with Rogue(net.coord.url, "rogue") as r:
        r.send("COMMIT_REQ", req=1, version="v2", deadline_ms=5000)
        r.send("HAVE", version="v2", digest=d2, complete=True, bytes_held=0, bytes_needed=0,
               bad_donor="A")
        r.send("HELLO", node="A", listen="tcp://127.0.0.1:1", versions=[], current=None)

        def settled():  # all three refused, or (the failure) some node flipped
            if net.currents() != at_v1:
                return "flipped"
            cs = a.try_cluster_status()
            return cs if refused(cs) >= 3 else None

        cs = poll(settled, timeout=15, interval=0.2)
        replies = r.received(500)
    assert net.currents() == at_v1, f"a peer that never joined flipped current: {net.currents()}"
    assert cs, f"the coordinator did not count 3 refused messages: {a.try_cluster_status()}"
    assert cs["committed"] == "v1", cs
    assert replies == [], f"the coordinator answered a peer that never joined: {replies}"
    now = node_view(cs, "A")
    assert (now["addr"], now["bad_shards"]) == (before["addr"], before["bad_shards"]), (before, now)
    assert node_view(cs, "rogue") is None, cs
    assert "rogue" in net.coord.log_text() and "not joined" in net.coord.log_text(), net.coord.log_tail()


@pytest.mark.limit(150)
def test_a_name_is_bound_to_its_key(net, tmp_path):
    """With keys, A's name belongs to A's key: after A leaves, a peer holding another
    authorized key (B's) cannot join as A, nor as a second name while B is alive;
    A itself rejoins with its own key (a new session) and is welcomed."""
    kd = {x: str(tmp_path / f"keys-{x}") for x in ("coord", "A", "B")}
    for d in kd.values():
        keygen(d)
    for x in ("A", "B"):
        authorize(kd["coord"], x, kd[x])
        authorize(kd[x], "A" if x == "B" else "B", kd["A" if x == "B" else "B"])
        shutil.copyfile(os.path.join(kd["coord"], "key.pub"), os.path.join(kd[x], "coordinator.pub"))
        authorize(kd[x], "coordinator", kd["coord"])
    net.start_coord(keys=kd["coord"])
    a = net.add("A", keys=kd["A"])
    b = net.add("B", keys=kd["B"])
    cs = net.wait_alive(["A", "B"], viewer=b)
    a_addr = node_view(cs, "A")["addr"]

    a.umount()
    assert wait_dead(a.pid, scaled(10)), "A's daemon still runs after hwfs umount"
    net.wait_dead("A", viewer=b)
    n0 = refused(b.try_cluster_status())
    with Rogue(net.coord.url, "A", keys=kd["B"], server_key=pub(kd["coord"])) as r1, \
            Rogue(net.coord.url, "B2", keys=kd["B"], server_key=pub(kd["coord"])) as r2:
        hello = dict(listen="tcp://127.0.0.1:1", versions=[], current=None, session="f" * 32)
        r1.send("HELLO", node="A", **hello)
        r2.send("HELLO", node="B2", **hello)
        cs = poll(lambda: (lambda c: c if refused(c) >= n0 + 2 or (node_view(c, "A") or {}).get("alive")
                           or node_view(c, "B2") else None)(b.try_cluster_status()), timeout=15, interval=0.2)
        replies = r1.received(300) + r2.received(300)
    assert cs, f"the coordinator did not count the two HELLOs as refused: {b.try_cluster_status()}"
    assert not node_view(cs, "A")["alive"] and node_view(cs, "A")["addr"] == a_addr, \
        f"another key took over A's name: {node_view(cs, 'A')}"
    assert node_view(cs, "B2") is None, f"B's key joined a second time as B2: {node_view(cs, 'B2')}"
    assert replies == [], f"the coordinator answered the impostors: {replies}"
    assert "bound to another key" in net.coord.log_text(), net.coord.log_tail()

    a.mount()  # the same key, a new session: a restarted node rejoins
    net.wait_alive(["A", "B"], viewer=b)


@pytest.mark.limit(120)
def test_departed_nodes_versions_expire(net, tmp_path):
    """A publishes v1 alone and leaves; B joins.  v1 (held by no live node) and A leave the
    cluster view once A has been gone node_expiry_s (2 s here)."""
    net.start_coord(tunables={"node_expiry_s": 2})
    a = net.add("A")
    net.publish("A", random_model(tmp_path / "m1", 2 << 20, seed=711), "v1")
    assert poll(lambda: version_view(a.try_cluster_status(), "A", "v1"), timeout=10), \
        "the coordinator never listed v1 on A"
    a.umount()
    assert wait_dead(a.pid, scaled(10))
    b = net.add("B")

    def gone():
        cs = b.try_cluster_status()
        if cs is None:
            return None
        held = [(n["name"], v["name"]) for n in cs["nodes"] for v in n["versions"]]
        return cs if ("A", "v1") not in held and node_view(cs, "A") is None else None

    cs = poll(gone, timeout=20, interval=0.3)
    assert cs, f"A and its v1 are still in the cluster view 20 s after A left: {b.try_cluster_status()}"
    assert "forgotten" in net.coord.log_text(), net.coord.log_tail()


def test_insecure_coordinator_starts(tmp_path):
    """hwfs coord --listen tcp://127.0.0.1:* --insecure -f runs (and stops on SIGTERM)."""
    c = Coord(str(tmp_path), state=False)  # keyless: Coord.args() passes --insecure
    base._ACTIVE.append(c)  # the watchdog kills it if the test hangs
    try:
        c.start()  # fails the test unless it logs the endpoint it listens on
        assert c.alive()
    finally:
        try:
            c.stop()
        finally:
            base._ACTIVE.remove(c)
    assert c.proc.returncode == 0, f"exit {c.proc.returncode} after SIGTERM\n{c.log_tail()}"


def test_keygen(tmp_path):
    """keygen: DIR/key is 0600, key.pub holds 40 Z85 characters, a second keygen refuses."""
    d = str(tmp_path / "k")
    printed = keygen(d)
    st = os.stat(os.path.join(d, "key"))
    assert stat.S_IMODE(st.st_mode) == 0o600, f"DIR/key mode {oct(stat.S_IMODE(st.st_mode))}"
    p = pub(d)
    assert len(p) == 40 and set(p) <= Z85, f"key.pub is not 40 Z85 characters: {p!r}"
    assert printed == p, f"keygen printed {printed!r}, key.pub holds {p!r}"
    with open(os.path.join(d, "authorized", "self.pub")) as f:
        assert f.read().strip() == p
    with open(os.path.join(d, "key")) as f:
        lines = f.read().split()
    assert lines[0] == p and len(lines[1]) == 40 and set(lines[1]) <= Z85, "DIR/key is not PUBLIC\\nSECRET"

    before = open(os.path.join(d, "key")).read()
    cp = sh([HWFS, "keygen", d], check=False)
    assert_error_line(cp, "exists")
    assert open(os.path.join(d, "key")).read() == before, "a second keygen changed DIR/key"
    assert keygen(str(tmp_path / "k2")) != p, "two keygens made the same key"


@pytest.mark.limit(90)
def test_a_joined_peer_cannot_announce_a_manifest_that_is_not_the_versions(net, tmp_path):
    """A peer that joined a keyless (--insecure) cluster announces "v9" with v1's manifest,
    then "v8" with a real manifest but a made-up digest: nodes would refuse either plan, and
    the first announcer of a name must not poison it, so the coordinator ignores both (logs
    why) and neither name enters the cluster view."""
    ring(net, ["A", "B"])
    a = net["A"]
    d1 = net.publish("A", random_model(tmp_path / "m1", 1 << 20, seed=731), "v1")
    net.wait_version("v1", d1)
    manifest = a.run("manifest", "v1").stdout.encode()
    with Rogue(net.coord.url, "rogue") as r:
        r.send("HELLO", node="rogue", listen="tcp://127.0.0.1:1", versions=[], current=None)
        assert any(x["t"] == "WELCOME" for x in r.received(5000)), "the rogue was not welcomed"
        r.send("ANNOUNCE", payload=manifest, version="v9", digest=d1)
        r.send("ANNOUNCE", payload=manifest, version="v1", digest="0" * 32)
        r.send("ANNOUNCE", payload=manifest.replace(b'"v1"', b'"v8"', 1), version="v8", digest="1" * 32)
        ignored = poll(lambda: net.coord.log_text().count("ignored") >= 3 or None, timeout=10)
    log = net.coord.log_text()
    assert ignored, f"the coordinator did not refuse the three announcements:\n{net.coord.log_tail()}"
    assert "with the manifest of v1" in log and "but its manifest's is" in log, net.coord.log_tail()
    cs = a.try_cluster_status()
    assert "v9" not in json.dumps(cs) and "v8" not in json.dumps(cs), cs
    assert node_view(cs, "A") is not None, cs
