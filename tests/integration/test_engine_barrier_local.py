"""The engine barrier of a single node (docs/engines.md, "The barrier, exactly").

What an engine reported is about one version, not one name: after `hwfs rm v2` and a new
v2, neither a v2 loaded nor a v2 served counts for a commit of the new one.  A refusal from
an earlier commit does not fail the next one: the engine is asked again and its new answer
decides.  "current" events follow `current`, one per commit.  A daemon whose
engine_deadline_ms is not below commit_deadline_ms warns at start-up.
The engines are plain protocol clients (tests/integration/engine_proto.py).
"""

import os
from pathlib import Path

from conftest import make_tensors, poll, readlink_or_none, save_model
from engine_proto import Conn, commit_async, engine, engines_of, finish

SKIP = ("arrived", "removed")


def publish(m, root, version, seed):
    """Publish a small safetensors model made from @seed as @version."""
    d = Path(root) / f"{version}-{seed}"
    save_model(d / "model.safetensors", make_tensors(seed, n=3))
    m.run("publish", d, version)


def v1_current_v2_published(m, root, seed):
    """Publish v1 (seed) and commit it, then publish v2 (seed + 1)."""
    publish(m, root, "v1", seed=seed)
    m.run("commit", "v1")
    publish(m, root, "v2", seed=seed + 1)


def replace_v2(m, tmp_path, e):
    """`hwfs rm v2`, then publish another v2; @e sees both events."""
    m.run("rm", "v2")
    assert e.event() == {"event": "removed", "version": "v2"}
    publish(m, tmp_path, "v2", seed=903)
    assert e.event() == {"event": "arrived", "version": "v2"}


def test_a_loaded_version_removed_and_published_again_is_prepared_again(mount, tmp_path):
    m = mount
    v1_current_v2_published(m, tmp_path, seed=901)
    e = engine(m, "e1")
    e.send({"report": "swapped", "version": "v1", "pause_us": 0})
    e.send({"report": "loaded", "version": "v2"})
    assert poll(lambda: engines_of(m)["e1"]["state"] == "loaded")
    replace_v2(m, tmp_path, e)
    # the removed v2's shadow is forgotten
    st = engines_of(m)["e1"]
    assert st["shadow"] is None and st["state"] == "idle", st
    p = commit_async(m, "v2")
    ev = e.event(skip=SKIP)
    assert ev == {"event": "prepare", "version": "v2"}, \
        f"the engine got {ev} instead of a prepare of the new v2 (its old v2 counted)"
    assert readlink_or_none(m.path("current")) == "versions/v1"
    e.send({"report": "loaded", "version": "v2"})
    rc, out = finish(p)
    assert rc == 0, out
    assert e.event(skip=SKIP) == {"event": "current", "version": "v2"}
    e.close()


def test_a_served_version_removed_and_published_again_is_not_ready(mount, tmp_path):
    m = mount
    v1_current_v2_published(m, tmp_path, seed=911)
    e = engine(m, "e1")
    e.send({"report": "swapped", "version": "v2", "pause_us": 0})  # it serves v2 already
    assert poll(lambda: engines_of(m)["e1"]["serving"] == "v2")
    replace_v2(m, tmp_path, e)
    p = commit_async(m, "v2")
    ev = e.event(skip=SKIP)
    assert ev == {"event": "prepare", "version": "v2"}, \
        f"the engine got {ev} instead of a prepare of the new v2 (serving the old v2 counted)"
    e.send({"report": "loaded", "version": "v2"})
    rc, out = finish(p)
    assert rc == 0, out
    e.close()


def test_an_earlier_refusal_is_asked_again_and_the_new_answer_decides(mount, tmp_path):
    m = mount
    v1_current_v2_published(m, tmp_path, seed=921)
    e = engine(m, "e1")
    why = "out of GPU memory"
    p = commit_async(m, "v2")
    assert e.event(skip=SKIP) == {"event": "prepare", "version": "v2"}
    e.send({"report": "refused", "version": "v2", "reason": why})
    rc, out = finish(p)
    assert rc != 0 and f"engine e1 refused v2: {why}" in out, out
    # the next commit: prepare again, and the engine, which freed memory meanwhile, loads it
    p = commit_async(m, "v2")
    assert e.event(skip=SKIP) == {"event": "prepare", "version": "v2"}
    e.send({"report": "loaded", "version": "v2"})
    rc, out = finish(p)
    assert rc == 0, f"a refusal from the earlier commit failed this one: {out}"
    assert readlink_or_none(m.path("current")) == "versions/v2"
    # a refusal during a commit still decides it (not the deadline)
    publish(m, tmp_path, "v3", seed=923)
    p = commit_async(m, "v3")
    assert e.event(skip=SKIP + ("current",)) == {"event": "prepare", "version": "v3"}
    e.send({"report": "refused", "version": "v3", "reason": why})
    rc, out = finish(p)
    assert rc != 0 and f"engine e1 refused v3: {why}" in out, out
    e.close()


def test_an_earlier_refusal_not_answered_again_fails_at_the_deadline(mount_factory, tmp_path):
    m = mount_factory(extra=["-o", "engine_deadline_ms=300"])
    v1_current_v2_published(m, tmp_path, seed=931)
    e = engine(m, "e1")
    e.send({"report": "refused", "version": "v2", "reason": "shape [8, 8]"})
    assert poll(lambda: engines_of(m)["e1"]["state"] == "refused")
    rc, out = finish(commit_async(m, "v2"))
    assert rc != 0 and ("engine e1 did not report v2 loaded within 300 ms (it refused v2 before: "
                        "shape [8, 8])") in out, out
    assert e.event(skip=SKIP) == {"event": "prepare", "version": "v2"}
    assert readlink_or_none(m.path("current")) == "versions/v1"
    e.close()


def test_every_commit_is_announced_once_in_order(mount, tmp_path):
    """Each commit is one "current" event naming what `current` names, a commit of the
    version already current included (it retries a failed swap).  That two flips' hooks,
    which run after the namespace lock is released, never announce them out of order cannot
    be forced from outside: tests/unit/test_engines.c plays those hooks late and reversed."""
    m = mount
    publish(m, tmp_path, "v1", seed=941)
    publish(m, tmp_path, "v2", seed=942)
    with Conn(m.mnt, {"op": "watch"}) as w:
        assert w.line() == {"ok": True, "current": None}
        for v in ("v1", "v1", "v2", "v1", "v2", "v2"):
            m.run("commit", v)
            assert w.event(skip=SKIP) == {"event": "current", "version": v}
        os.symlink("versions/v1", m.path(".tmp-flip"))
        os.rename(m.path(".tmp-flip"), m.path("current"))
        assert w.event(skip=SKIP) == {"event": "current", "version": "v1"}
        with Conn(m.mnt, {"op": "watch"}) as w2:
            assert w2.line() == {"ok": True, "current": "v1"}
            m.run("commit", "v2")
            assert w2.event(skip=SKIP) == {"event": "current", "version": "v2"}
        assert w.event(skip=SKIP) == {"event": "current", "version": "v2"}


def test_an_engine_deadline_not_below_the_commit_deadline_is_warned(mount_factory):
    m = mount_factory(extra=["-o", "engine_deadline_ms=20000", "-o", "commit_deadline_ms=15000"])
    log = Path(m.store, "hwfs.log")
    want = "engine_deadline_ms (20000) is not below commit_deadline_ms (15000)"
    assert want in log.read_text(errors="replace"), m.log_tail()
    ok = mount_factory()
    assert "is not below commit_deadline_ms" not in Path(ok.store, "hwfs.log").read_text(
        errors="replace")
