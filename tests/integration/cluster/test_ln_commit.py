"""`ln -sfn V current` on a joined node is the cluster's commit (docs/cli.md, "Committing
through the mount").

The rename reaches the node's daemon, which asks the coordinator for the two phases on every
node, and returns only once they are decided: an engine that refuses V on another node fails
`ln` with ECANCELED and no node flips (the refusal is in the asking node's `hwfs status` as
its last refused commit); once that engine has V loaded, the same `ln` returns 0 and every
node's `current` names V, as does the coordinator's committed version.
"""

import errno
import os
import subprocess

import pytest

from conftest import TIMEOUT

from .test_engine_barrier import engine, prepare_of


def ln_async(node, target):
    return subprocess.Popen(["ln", "-sfn", target, "current"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=node.mnt)


@pytest.mark.limit(150)
def test_ln_sfn_on_one_node_commits_every_node_or_none(cluster, models):
    cluster.ensure_version("v1", models)
    cluster.ensure_committed("v1")
    cluster.ensure_version("v2", models)
    a, b = cluster["A"], cluster["B"]
    eb = engine(b, "eng-b")
    try:
        p = ln_async(a, "v2")
        prepare_of(eb, "v2")
        assert p.poll() is None, "ln returned before B's engine answered"
        eb.send({"report": "refused", "version": "v2", "reason": "out of GPU memory"})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode != 0, "ln -sfn succeeded although B's engine refused v2"
        assert os.strerror(errno.ECANCELED) in err, err
        for n in cluster:
            assert n.current() == ("versions/v1", "v1"), f"{n.name} flipped: {n.current()}"
        last = a.status()["last_refused_commit"]
        assert last["version"] == "v2" and "out of GPU memory" in last["reason"], last
        assert sorted(os.listdir(a.mnt)) == ["current", "versions"], "ln left its temporary link"

        p = ln_async(a, "versions/v2")
        prepare_of(eb, "v2")
        eb.send({"report": "loaded", "version": "v2"})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, out + err
        for n in cluster:
            assert n.current() == ("versions/v2", "v2"), f"{n.name}: {n.current()}"
        assert a.cluster_status()["committed"] == "v2"
    finally:
        eb.close()
    cluster["A"].run("commit", "v1")  # leave the cluster as the other tests expect it
