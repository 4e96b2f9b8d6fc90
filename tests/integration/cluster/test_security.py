"""Keys (CURVE) and the refusal to listen on a non-loopback address without them.

Clusters come from the ``net`` fixture of cluster/conftest.py (a coordinator and nodes
started one at a time, all cleaned up after the test).
"""

import os
import shutil
import signal
import stat
import time

import pytest

import conftest as base  # tests/integration/conftest.py
from conftest import HWFS, assert_error_line, poll, sh, wait_dead

from .conftest import ANY_PORT
from .conftest import Coord, assert_identical, node_view, random_model

Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
REFUSAL = "refused a connection with unknown key"


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
    cp = d.run("status", "--cluster", "--json", check=False, timeout=30)
    took = time.monotonic() - t0
    assert cp.returncode != 0, f"status --cluster on D (unknown key) succeeded: {cp.stdout}"
    assert took <= 15, f"status --cluster on D took {took:.1f}s to fail (want <= ~15s)"

    cs = net["A"].try_cluster_status()
    assert node_view(cs, "D") is None, f"the coordinator lists D: {node_view(cs, 'D')}"
    assert {n["name"] for n in cs["nodes"] if n["alive"]} == set(members), cs
    assert poll(lambda: REFUSAL in net.coord.log_text(), timeout=5), \
        f"the coordinator log does not mention {REFUSAL!r}:\n{net.coord.log_tail()}"

    # The refused node still unmounts cleanly and its daemon exits by itself
    # (the fixture would kill a leftover daemon, which would hide a hang).
    d.umount()
    assert wait_dead(d.pid, 10), f"D's daemon (refused key) still runs 10 s after hwfs umount\n{d.log_tail()}"


def test_non_loopback_listen_needs_keys(tmp_path):
    """Without keys, a node or coordinator on a non-loopback address is refused before it starts."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    store = tmp_path / "store"
    coord = "tcp://127.0.0.1:1"  # never reached: refused before it starts

    cp = sh([HWFS, "mount", mnt, "--store", store, "--join", coord, "--node", "X",
             "--listen", "tcp://10.1.2.3:5000"], check=False)
    assert_error_line(cp, "keys")
    cp = sh([HWFS, "mount", mnt, "--store", store, "--coordinator", "tcp://10.1.2.3:5001", "--node", "X",
             "--listen", ANY_PORT], check=False)
    assert_error_line(cp, "keys")
    assert not os.path.ismount(mnt)

    cp = sh([HWFS, "coord", "--listen", "tcp://10.1.2.3:5000"], check=False)
    assert_error_line(cp, "keys")
    cp = sh([HWFS, "coord", "--listen", "tcp://10.1.2.3:5000", "-f"], check=False)
    assert_error_line(cp, "keys")

    # --insecure lifts the refusal: 10.1.2.3 is not ours, so binding fails, but not for want of keys.
    cp = sh([HWFS, "coord", "--listen", "tcp://10.1.2.3:5000", "--insecure"], check=False)
    if cp.returncode == 0:  # this machine has 10.1.2.3 after all: a coordinator runs; stop it
        os.kill(int(cp.stdout.split()[0]), signal.SIGTERM)
    else:
        assert "refusing" not in cp.stderr and "without keys" not in cp.stderr, cp.stderr


def test_insecure_coordinator_starts(tmp_path):
    """hwfs coord --listen tcp://127.0.0.1:P --insecure -f runs (and stops on SIGTERM)."""
    c = Coord(str(tmp_path), state=False, extra=["--insecure"])
    base._ACTIVE.append(c)  # the watchdog kills it if the test hangs
    try:
        c.start()  # fails the test unless the port accepts connections
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
