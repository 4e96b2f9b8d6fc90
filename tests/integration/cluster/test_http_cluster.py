"""The HTTP endpoints across a cluster commit (docs/operations.md).

While a cluster commit waits in PREPARE for an engine of A, A's /readyz says
"ready: updating" and hwfs_updating is 1; when the engine reports the version
loaded the commit completes, A is plainly ready again, and the counters tell
it: the node's prepare phase and committed outcome, the coordinator's
committed outcome and commit duration, one convergence per version.  A commit
the engine refuses counts as refused on both sides.
"""

import re
from pathlib import Path

from engine_proto import commit_async, engine, finish
from http_helpers import commit_seen_updating, get, samples, value
from .conftest import poll, random_model

HTTP_ANY = ["--http", "127.0.0.1:0"]


def test_cluster_commit_states_and_counters(net, tmp_path):
    c = net.start_coord(extra=HTTP_ANY)
    a = net.add("A", extra=HTTP_ANY + ["-o", "engine_deadline_ms=8000"])
    b = net.add("B")
    m = poll(lambda: re.search(r"coord: http on (\S+) ", Path(c.logpath).read_text()), timeout=10)
    assert m, c.log_tail()
    caddr, aaddr = m.group(1), a.status()["http"]
    for i, v in enumerate(("v1", "v2")):
        digest = net.publish("A", random_model(tmp_path / v, 1 << 20, seed=3300 + i), v)
        net.wait_version(v, digest, nodes=[b])
    assert poll(lambda: value(samples(get(caddr, "/metrics")[1]),
                              "hwfs_coord_version_converge_seconds_count") == 2, timeout=10)

    with engine(a, "sleepy") as e:
        commit_seen_updating(a, aaddr, e, "v1")
        assert poll(lambda: get(aaddr, "/readyz") == (200, "ready\n"), timeout=10)
        s = samples(get(aaddr, "/metrics")[1])
        assert value(s, "hwfs_updating") == 0
        assert value(s, "hwfs_commits_total", outcome="committed") == 1
        assert value(s, "hwfs_commit_duration_seconds_count", phase="prepare") == 1
        assert value(s, "hwfs_commit_duration_seconds_sum", phase="prepare") > 0
        assert value(s, "hwfs_current_info", version="v1") == 1

        # refused by the engine: refused on the node and at the coordinator (aborted)
        p = commit_async(a, "v2")
        assert poll(lambda: get(aaddr, "/readyz") == (200, "ready: updating\n"), timeout=10)
        e.send({"report": "refused", "version": "v2", "reason": "does not fit"})
        rc, out = finish(p)
        assert rc != 0 and "does not fit" in out, out
    s = samples(get(aaddr, "/metrics")[1])
    assert value(s, "hwfs_commits_total", outcome="refused") == 1
    assert value(s, "hwfs_engine_refusals_total") == 1
    assert poll(lambda: get(aaddr, "/readyz") == (200, "ready\n"), timeout=10)
    s = samples(get(caddr, "/metrics")[1])
    assert value(s, "hwfs_coord_commits_total", outcome="committed") == 1
    assert value(s, "hwfs_coord_commits_total", outcome="refused") == 1
    assert value(s, "hwfs_coord_commit_duration_seconds_count") == 2
    assert value(s, "hwfs_coord_nodes", state="alive") == 2
