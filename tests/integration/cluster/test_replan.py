"""Re-planning around a relay that dies mid-transfer (coord_plan.c, plan_deaths()).

A chain P -> R1 -> R2 -> R3 -> R4 (join order, ``--topology chain``) pulls a version
published on P; a relay is killed -9 while it is receiving.  When the coordinator
notices (``node_dead_ms``), it re-plans only the dead relay's orphan, onto the dead
relay's own donors: the live relay upstream (itself still receiving: it serves what it
holds and forwards the rest cut-through), or P when the dead relay was P's only child.
Nobody else is re-planned, so P sends the version once (to R1).  The coordinator logs every such re-plan
(``coord: R3 lost a donor of v1: now pulls from R1, P (was R2, P)``), which is what the
test reads, beside the survivors ending sealed with P's digest and identical to the source.
"""

import re
import subprocess
import time

import pytest

from conftest import HWFS, TIMEOUT

from .conftest import assert_identical, random_model, ring

CHAIN = ["P", "R1", "R2", "R3", "R4"]
REPLAN = re.compile(r"coord: (\S+) lost a donor of (\S+): now pulls from (.*) \(was (.*)\)")


@pytest.mark.limit(180)
@pytest.mark.parametrize("victim,orphan,donors", [
    ("R2", "R3", "R1, P"),  # the second relay: its orphan goes to the relay before it
    ("R1", "R2", "P"),      # the publisher's only child: its orphan goes to the publisher
])
def test_relay_killed_mid_transfer_orphan_pulls_from_upstream(net, tmp_path, victim, orphan, donors):
    """kill -9 of a relay mid-transfer: its orphan is re-planned onto the live node upstream
    of it (not onto the complete holders); no other node is re-planned; the survivors end
    sealed with the publisher's digest."""
    ring(net, CHAIN, topology="chain")
    p, v = net["P"], net[victim]
    src = random_model(tmp_path / "big", 200 << 20, seed=202)

    pub = subprocess.Popen([HWFS, "publish", str(src), "v1", "-m", p.mnt], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    caught = None
    end = time.monotonic() + 30
    try:
        while time.monotonic() < end:  # as soon as the victim holds part of v1, kill it
            if v.visible("v1"):
                break
            if v.bytes_received() > 0:
                caught = "bytes_received > 0"
                break
            time.sleep(0.005)
        v_state = {"visible": v.visible("v1"), "bytes_received": v.bytes_received()}
        v.kill9_daemon()
    finally:
        out, err = pub.communicate(timeout=TIMEOUT)
    assert pub.returncode == 0, f"publish on P failed: {err}"
    digest = p.version("v1")["digest"]
    assert caught and not v_state["visible"], \
        f"{victim} was not caught mid-transfer ({v_state}); the kill tested nothing"

    survivors = [net[x] for x in CHAIN if x not in ("P", victim)]
    net.wait_version("v1", digest, nodes=survivors, timeout=90)
    for n in survivors:
        assert_identical(src, n, "v1")
    net.wait_dead(victim, viewer=p)

    # P fed R1 only: the orphan's bytes came from upstream relays, not from P
    sent = p.sent()
    if victim != "R1":
        assert sent < 1.25 * (200 << 20), f"P sent {sent} bytes for a 200 MiB version to R1 alone"
    replans = [m.groups() for m in REPLAN.finditer(net.coord.log_text())]
    assert replans == [(orphan, "v1", donors, f"{victim}, P")], (
        f"expected exactly one re-plan, {orphan} onto {donors}; the coordinator logged {replans}\n"
        f"{net.coord.log_tail(40)}")
    print(f"{victim} killed with {v_state}; P sent {sent} bytes; re-plans: {replans}")
