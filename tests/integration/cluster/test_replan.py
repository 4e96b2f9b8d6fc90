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

import pytest

from conftest import TIME_SCALE, poll

from .conftest import assert_identical, publish_killing, random_model, ring, shaped_from

CHAIN = ["P", "R1", "R2", "R3", "R4"]
REPLAN = re.compile(r"coord: (\S+) lost a donor of (\S+): now pulls from (.*) \(was (.*)\)")
STAMP = re.compile(r"^(\S+Z) ")


def log_time(text, pattern):
    """The timestamp (ISO string, comparable) of the first log line of @text matching @pattern."""
    for line in text.splitlines():
        if re.search(pattern, line):
            m = STAMP.match(line)
            return m.group(1) if m else None
    return None


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

    digest = publish_killing(p, v, src, "v1")

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
    print(f"P sent {sent} bytes; re-plans: {replans}")


@pytest.mark.limit(180)
def test_orphan_replanned_onto_relay_still_receiving(net, tmp_path):
    """The live relay upstream is itself still receiving when the orphan is re-planned
    onto it: it serves the shards it holds, defers the rest and forwards them as they
    come (cut-through); the orphan keeps what it had.  P's sends are shaped (tc on
    loopback, 64 Mbit/s, a quarter of that under TSan's HWFS_TIME_SCALE), so R1 cannot
    hold the 100 MiB version before about 13 s have passed, while node_dead_ms (3 s) after
    R2's kill the coordinator re-plans R3; the shaping stays until that re-plan is logged
    and R1 is checked incomplete then.  Every daemon runs at full speed meanwhile, so none
    misses a heartbeat (the SIGSTOP duty cycle this replaces made R1 look dead on a loaded
    machine, under TSan)."""
    # R1 asks for two shards at a time, so it holds whole shards (and R2 gets bytes) from
    # the first second on, while the rest of the version keeps trickling in
    net.start_coord(topology="chain")
    for name in CHAIN:
        net.add(name, extra=["-o", f"pull_window_bytes={8 << 20}"] if name == "R1" else ())
    net.wait_alive(CHAIN, viewer=net["P"])
    p, r1 = net["P"], net["R1"]
    size = 100 << 20
    src = random_model(tmp_path / "big", size, seed=303)

    with shaped_from(p, f"{max(1, int(64 / TIME_SCALE))}mbit"):
        digest = publish_killing(p, net["R2"], src, "v1")
        assert poll(lambda: REPLAN.search(net.coord.log_text()), timeout=30, interval=0.1), \
            f"no re-plan logged 30 s after R2 was killed\n{net.coord.log_tail(30)}"
        assert not r1.visible("v1"), "R1 was complete before R3 was re-planned onto it"

    survivors = [net[x] for x in ("R1", "R3", "R4")]
    net.wait_version("v1", digest, nodes=survivors, timeout=120)
    for n in survivors:
        assert_identical(src, n, "v1")

    coord_log = net.coord.log_text()
    replans = [m.groups() for m in REPLAN.finditer(coord_log)]
    assert replans == [("R3", "v1", "R1, P", "R2, P")], f"the coordinator logged {replans}"
    replanned_at = log_time(coord_log, r"R3 lost a donor of v1")
    r1_done_at = log_time(r1.log_tail(1000), r"agent: v1 complete")
    assert replanned_at and r1_done_at and replanned_at < r1_done_at, \
        f"R1 was complete ({r1_done_at}) before R3 was re-planned onto it ({replanned_at}): " \
        f"the partial-donor path was not tested"
    sent = p.sent()
    assert sent < 1.25 * size, f"P sent {sent} bytes for a 100 MiB version to R1 alone"
    print(f"R3 re-planned onto R1 at {replanned_at}, R1 complete at {r1_done_at}; P sent {sent} bytes")
