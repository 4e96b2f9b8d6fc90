"""A commit asked for the moment its version seals, on the publishing node, the way a
trainer drives it (hwfs.trl and the vLLM backend's trainer side: publish, then commit
through libhwfs at once).

The seal queues the version's ANNOUNCE for the node's agent and the commit queues a
COMMIT_REQ; when the agent thread is busy, both wait for the same pass of its loop, and
the coordinator refuses a commit of a version no node has announced.  The agent sends
the announcements first: every commit here must succeed, never "no node has announced
that version" (bench-rl's step 2 failed so once).  To make the window wide, node A is
kept busy receiving a large version published on B (its agent thread copies and hashes
the pieces) while the small versions seal and commit on A.
"""

import os
import sys
import threading

from conftest import REPO, poll, scaled

PYDIR = REPO / "tools" / "python"
os.environ.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
if str(PYDIR) not in sys.path:
    sys.path.insert(0, str(PYDIR))

import hwfs  # noqa: E402

BIG = 192 << 20      # the version A receives meanwhile
MIN_ROUNDS = 8       # small versions sealed and committed on A, at least


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_commit_at_once_after_seal_is_never_refused_as_unannounced(cluster):
    a, b = cluster["A"], cluster["B"]
    write(b.vpath("big", "w.bin"), os.urandom(BIG))
    refused, rounds, errors = [], [], []

    def seal_commit_on_a(stop):
        try:
            with hwfs.Mount(a.mnt) as m:
                i = 0
                while not stop.is_set() or i < MIN_ROUNDS:
                    name = f"cas{i}"
                    write(a.vpath(name, "w.bin"), os.urandom(4096))
                    r = m.call({"op": "seal", "version": name})
                    assert r.get("ok"), f"seal {name}: {r}"
                    r = m.call({"op": "commit", "version": name})
                    if not r.get("ok"):
                        refused.append((name, r.get("error")))
                    rounds.append(name)
                    i += 1
        except Exception as e:  # noqa: BLE001  (raised below)
            errors.append(e)

    stop = threading.Event()
    t = threading.Thread(target=seal_commit_on_a, args=(stop,))
    with hwfs.Mount(b.mnt) as mb:
        r = mb.call({"op": "seal", "version": "big"})
        assert r.get("ok"), f"seal big on B: {r}"
        t.start()
        try:
            assert poll(lambda: a.visible("big"), timeout=scaled(120)), "big never reached A"
        finally:
            stop.set()
            t.join(scaled(120))
    assert not t.is_alive(), "the seal/commit rounds on A hang"
    assert not errors, errors
    assert not refused, f"commits refused right after their seal ({len(rounds)} rounds): {refused}"
    last = rounds[-1]
    poll(lambda: all(n.current() == (f"versions/{last}", last) for n in cluster), timeout=scaled(30))
    assert all(n.current() == (f"versions/{last}", last) for n in cluster)
