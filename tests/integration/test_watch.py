"""`hwfs watch`: events, hooks and the hook-driven engine (docs/cli.md, "watch")."""

import os
import signal

import numpy as np

from conftest import assert_error_line, make_tensors, poll, save_model
from engine_proc import WatchProc, engine_state, procs  # noqa: F401 (procs: fixture)


def publish(mount, src, version, tensors=None):
    save_model(src / version / "model.safetensors",
               tensors if tensors is not None else {"w": np.full((8, 8), len(version), np.float32)})
    mount.run("publish", src / version, version)


def read_env(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def test_watch_prints_events_and_exits_when_the_daemon_goes(mount, src, procs):
    w = WatchProc(mount.mnt).start()
    procs.append(w)
    publish(mount, src, "v1")
    w.wait_line("arrived v1")
    mount.run("commit", "v1")
    w.wait_line("current v1")
    publish(mount, src, "v2")
    mount.run("commit", "v2")
    mount.run("rm", "v1")
    lines = w.wait_line("removed v1")
    assert lines == ["arrived v1", "current v1", "arrived v2", "current v2", "removed v1"], lines
    mount.umount()
    assert w.wait_exit() == 1
    assert "hwfs: error:" in w.stderr and "closed the event stream" in w.stderr, w.stderr


def test_watch_exits_0_on_sigterm_and_sigint(mount, src, procs):
    publish(mount, src, "v1")
    mount.run("commit", "v1")
    for sig in (signal.SIGTERM, signal.SIGINT):
        w = WatchProc(mount.mnt).start()
        procs.append(w)
        w.wait_line("current v1")  # it prints `current` once it watches
        w.proc.send_signal(sig)
        assert w.wait_exit() == 0, w.stderr


def test_hooks_get_the_version_path_and_mount(mount, src, tmp_path, procs):
    out = tmp_path / "hooks"
    out.mkdir()
    # each hook records its environment and what it sees at HWFS_PATH
    hook = f'env | grep ^HWFS_ > {out}/$HWFS_EVENT-$HWFS_VERSION; ls "$HWFS_PATH" > {out}/ls-$HWFS_VERSION'
    publish(mount, src, "v1")
    mount.run("commit", "v1")
    w = WatchProc(mount.mnt, "--on-arrive", hook, "--on-commit", hook).start()
    procs.append(w)
    # at start, `current` goes through both hooks
    w.wait_line("swapped v1 (pause 0 us)")
    publish(mount, src, "v2")
    w.wait_line("loaded v2")
    mount.run("commit", "v2")
    w.wait_line("swapped v2 (pause ", prefix=True)  # the on-commit hook has finished
    for ev in ("arrived", "current"):
        for v in ("v1", "v2"):
            env = {k: x for k, x in read_env(out / f"{ev}-{v}").items()
                   if k in ("HWFS_VERSION", "HWFS_PATH", "HWFS_MOUNT", "HWFS_EVENT")}
            assert env == {"HWFS_VERSION": v, "HWFS_PATH": mount.vpath(v), "HWFS_MOUNT": mount.mnt,
                           "HWFS_EVENT": ev}, env
        assert "model.safetensors" in (out / f"ls-{v}").read_text()


def test_failing_on_arrive_refuses_a_local_commit(mount, src, tmp_path, procs):
    hook = 'case "$HWFS_VERSION" in bad*) echo "checking $HWFS_VERSION" >&2; ' \
           'echo "bad weights in $HWFS_VERSION" >&2; exit 3;; esac'
    on_commit = f'echo "$HWFS_VERSION" >> {tmp_path}/served'
    w = WatchProc(mount.mnt, "--engine", "hooked", "--on-arrive", hook, "--on-commit", on_commit).start()
    procs.append(w)
    w.wait_line("registered as engine hooked on " + mount.mnt)
    publish(mount, src, "good1")
    w.wait_line("loaded good1")
    mount.run("commit", "good1")
    w.wait_line("current good1")
    assert poll(lambda: (engine_state(mount, "hooked") or {}).get("serving") == "good1"), mount.status()
    assert (tmp_path / "served").read_text() == "good1\n"

    publish(mount, src, "bad2", make_tensors(seed=9, n=2))
    w.wait_line("refused bad2: on-arrive hook exited 3: bad weights in bad2")
    cp = mount.run("commit", "bad2", check=False)
    assert_error_line(cp, "engine hooked refused bad2", "on-arrive hook exited 3: bad weights in bad2")
    assert os.readlink(mount.path("current")) == "versions/good1"
    assert (tmp_path / "served").read_text() == "good1\n"
    st = engine_state(mount, "hooked")
    assert st["serving"] == "good1" and st["state"] == "refused", st
    assert "bad weights in bad2" in st["reason"], st
    assert w.stop() == 0
    assert poll(lambda: engine_state(mount, "hooked") is None)
