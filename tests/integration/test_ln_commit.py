"""A rename onto `current` through the mount is `hwfs commit` (docs/cli.md, "Committing
through the mount").

`ln -sfn V current` and `ln -sfn versions/V current` (coreutils: a symlink under a temporary
name, renamed onto `current`) and `ln -s V current` on a mount with no `current` yet commit V:
the engine barrier first, the syscall returning only once the commit is decided; `current`
then reads versions/V whatever form was given.  A refusal — an engine that refused V, a
version that does not exist, a link that names no version — fails the syscall with an errno,
leaves `current` where it was, and is in the daemon log and in `hwfs status` as the last
refused commit.  The engines are plain protocol clients (tests/integration/engine_proto.py).
"""

import errno
import os
import subprocess
from pathlib import Path

from conftest import TIMEOUT, make_tensors, readlink_or_none, save_model
from engine_proto import engine

SKIP = ("arrived", "removed", "current")


def publish(m, root, version, seed):
    d = Path(root) / f"{version}-{seed}"
    save_model(d / "model.safetensors", make_tensors(seed, n=3))
    m.run("publish", d, version)


def ln(m, *args):
    """`ln ARGS` run in the mount's root (so the last argument may be `current`)."""
    return subprocess.run(["ln", *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=m.mnt)


def ln_async(m, *args):
    return subprocess.Popen(["ln", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=m.mnt)


def refused(m):
    return m.status()["last_refused_commit"]


def test_ln_sfn_commits_in_both_forms(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=1101)
    publish(m, tmp_path, "v2", seed=1102)
    cp = ln(m, "-s", "v1", "current")  # no current yet: a plain symlink is the first commit
    assert cp.returncode == 0, cp.stderr
    assert readlink_or_none(m.path("current")) == "versions/v1"
    assert m.status()["current"] == "v1"
    for target, version in (("v2", "v2"), ("versions/v1", "v1"), ("./versions/v2/", "v2")):
        cp = ln(m, "-sfn", target, "current")
        assert cp.returncode == 0, f"ln -sfn {target} current: {cp.stderr}"
        assert readlink_or_none(m.path("current")) == f"versions/{version}", target
        assert m.status()["current"] == version, target
        # the link resolves: a reader of current/ sees the version's files
        assert os.path.exists(m.path("current", "model.safetensors"))
    assert sorted(os.listdir(m.mnt)) == ["current", "versions"], "ln left its temporary link behind"
    assert refused(m) is None


def test_ln_sfn_waits_for_the_engine_and_its_refusal_fails_it(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=1111)
    m.run("commit", "v1")
    publish(m, tmp_path, "v2", seed=1112)
    e = engine(m, "e1")
    try:
        p = ln_async(m, "-sfn", "v2", "current")
        assert e.event(skip=SKIP) == {"event": "prepare", "version": "v2"}
        assert p.poll() is None, "ln returned before the engine answered the barrier"
        why = "shape [8, 8] of layers.0.weight"
        e.send({"report": "refused", "version": "v2", "reason": why})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode != 0, "ln -sfn succeeded although the engine refused v2"
        assert os.strerror(errno.ECANCELED) in err, err
        assert readlink_or_none(m.path("current")) == "versions/v1"
        assert m.status()["current"] == "v1"
        last = refused(m)
        assert last["version"] == "v2" and why in last["reason"], last
        assert last["errno"] == errno.ECANCELED, last
        log = Path(m.store, "hwfs.log").read_text(errors="replace")
        assert "commit of v2 refused" in log and why in log, m.log_tail()
        # loaded this time: the same command commits
        p = ln_async(m, "-sfn", "versions/v2", "current")
        assert e.event(skip=SKIP) == {"event": "prepare", "version": "v2"}
        e.send({"report": "loaded", "version": "v2"})
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
        assert readlink_or_none(m.path("current")) == "versions/v2"
    finally:
        e.close()


def test_a_rename_onto_current_that_names_no_version_is_refused_and_says_why(mount, tmp_path):
    m = mount
    publish(m, tmp_path, "v1", seed=1121)
    m.run("commit", "v1")
    for target, err_no in (("/etc", errno.EINVAL), ("versions/v1/model.safetensors", errno.EINVAL),
                           ("nosuch", errno.ENOENT)):
        cp = ln(m, "-sfn", target, "current")
        assert cp.returncode != 0, f"ln -sfn {target} current succeeded"
        assert os.strerror(err_no) in cp.stderr, (target, cp.stderr)
        assert readlink_or_none(m.path("current")) == "versions/v1", target
        assert refused(m)["errno"] == err_no, (target, refused(m))
    log = Path(m.store, "hwfs.log").read_text(errors="replace")
    assert "its link must name versions/V or V, not \"/etc\"" in log, m.log_tail()
    assert sorted(os.listdir(m.mnt)) == ["current", "versions"], "ln left its temporary link behind"
