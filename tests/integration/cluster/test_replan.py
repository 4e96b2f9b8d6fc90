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

import os
import re
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest

from conftest import HWFS, TIME_SCALE, TIMEOUT, poll

from .conftest import assert_identical, publish_killing, random_model, ring

CHAIN = ["P", "R1", "R2", "R3", "R4"]
REPLAN = re.compile(r"coord: (\S+) lost a donor of (\S+): now pulls from (.*) \(was (.*)\)")
STAMP = re.compile(r"^(\S+Z) ")


class Duty:
    """How long a throttled daemon runs, then stops, in turn (seconds; changeable).  The
    running time is stretched by TIME_SCALE: a sanitizer build does the same work in that
    much more time, and a daemon that cannot answer one heartbeat in node_dead_ms is
    declared dead (what the test must not see of R1)."""

    def __init__(self, run_s, stop_s):
        self.stop_s = stop_s
        self.set_run(run_s)

    def set_run(self, run_s):
        self.run_s = run_s * TIME_SCALE


@contextmanager
def throttled(node, duty):
    """Slow @node's daemon down (no link shaping here): SIGSTOP / SIGCONT it in turn,
    running duty.run_s of every duty.run_s + duty.stop_s seconds, so a transfer through
    it stays in flight for seconds.  Keep duty.stop_s well under node_dead_ms: its
    heartbeats still go out while it runs.  It ends running."""
    pid = int(node.status()["pid"])
    done = threading.Event()

    def cycle():
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(duty.stop_s)
            os.kill(pid, signal.SIGCONT)
            time.sleep(duty.run_s)

    t = threading.Thread(target=cycle, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=5)
        os.kill(pid, signal.SIGCONT)


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
    come (cut-through); the orphan keeps what it had.  R1 is slowed down (SIGSTOP duty
    cycle, slower still once R2 is killed) so that it is still pulling node_dead_ms
    after R2 is killed."""
    ring(net, CHAIN, topology="chain")
    p, r1, r2 = net["P"], net["R1"], net["R2"]
    src = random_model(tmp_path / "big", 200 << 20, seed=303)

    duty = Duty(0.004, 0.2)
    with throttled(r1, duty):
        pub = subprocess.Popen([HWFS, "publish", str(src), "v1", "-m", p.mnt], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + 60 * TIME_SCALE
            while time.monotonic() < end and r2.bytes_received() == 0 and not r2.visible("v1"):
                time.sleep(0.01)
            r2_state = {"visible": r2.visible("v1"), "bytes_received": r2.bytes_received()}
            duty.set_run(0.002)  # R1 to ~1/250 speed until R3 is re-planned
            duty.stop_s = 0.5
            r2.kill9_daemon()
        finally:
            out, err = pub.communicate(timeout=TIMEOUT)
        assert pub.returncode == 0, f"publish on P failed: {err}"
        assert r2_state["bytes_received"] > 0 and not r2_state["visible"], \
            f"R2 was not caught mid-transfer ({r2_state}); the kill tested nothing"
        # keep R1 slow until the coordinator has re-planned R3
        assert poll(lambda: REPLAN.search(net.coord.log_text()), timeout=30, interval=0.1), \
            f"no re-plan logged 30 s after R2 was killed\n{net.coord.log_tail(30)}"
    digest = p.version("v1")["digest"]

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
    assert sent < 1.25 * (200 << 20), f"P sent {sent} bytes for a 200 MiB version to R1 alone"
    print(f"R2 killed with {r2_state}; R3 re-planned onto R1 at {replanned_at}, R1 complete at "
          f"{r1_done_at}; P sent {sent} bytes")
