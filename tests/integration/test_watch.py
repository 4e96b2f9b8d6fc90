"""`hwfs watch`: events, hooks and the hook-driven engine (docs/cli.md, "watch")."""

import json
import os
import re
import shutil
import signal
import threading

import numpy as np
import pytest

from conftest import (HWFS, REPO, assert_error_line, make_tensors, pid_alive, poll, readlink_or_none,
                      save_model, sh)
from engine_proc import WatchProc, engine_state, procs  # noqa: F401 (procs: fixture)


def publish(mount, src, version, tensors=None):
    save_model(src / version / "model.safetensors",
               tensors if tensors is not None else {"w": np.full((8, 8), len(version), np.float32)})
    mount.run("publish", src / version, version)


def read_env(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def test_watch_prints_events_and_exits_when_the_daemon_goes(mount, src, procs):
    # a committed v0 first: the watch prints `current v0` once it watches, so
    # v1 is never published before it subscribed (a slow start under load)
    publish(mount, src, "v0")
    mount.run("commit", "v0")
    w = WatchProc(mount.mnt).start()
    procs.append(w)
    w.wait_line("current v0")
    publish(mount, src, "v1")
    w.wait_line("arrived v1")
    mount.run("commit", "v1")
    w.wait_line("current v1")
    publish(mount, src, "v2")
    mount.run("commit", "v2")
    mount.run("rm", "v1")
    lines = w.wait_line("removed v1")
    assert lines == ["current v0", "arrived v1", "current v1", "arrived v2", "current v2",
                     "removed v1"], lines
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


def test_engine_names_are_checked_and_unique(mount, procs):
    w = WatchProc(mount.mnt, "--engine", "dup").start()
    procs.append(w)
    w.wait_line("registered as engine dup on " + mount.mnt)
    for name, words in (("dup", "an engine named dup is already registered"),
                        ("bad name!", "invalid engine name")):
        cp = mount.run("watch", "--engine", name, check=False, timeout=20)
        assert_error_line(cp, words)
    cp = mount.run("watch", "extra-argument", check=False)
    assert cp.returncode == 2 and cp.stderr.startswith("usage: hwfs watch"), cp


def test_prepare_of_a_version_that_arrived_before_the_watch_runs_on_arrive(mount, src, tmp_path, procs):
    publish(mount, src, "v1")  # before the engine: it never sees v1 arrive
    log = tmp_path / "hooks"
    w = WatchProc(mount.mnt, "--engine", "late", "--on-arrive", f"echo arrive $HWFS_VERSION >> {log}",
                  "--on-commit", f"echo commit $HWFS_VERSION >> {log}").start()
    procs.append(w)
    w.wait_line("registered as engine late on " + mount.mnt)
    mount.run("commit", "v1")
    w.wait_line("swapped v1 (pause ", prefix=True)
    assert w.lines[1:] == ["prepare v1", "loaded v1", "current v1"] + w.lines[4:], w.lines
    assert log.read_text() == "arrive v1\ncommit v1\n"
    st = engine_state(mount, "late")
    assert poll(lambda: (engine_state(mount, "late") or {}).get("serving") == "v1"), st


def test_a_commit_asks_again_an_on_arrive_that_refused_before(mount, src, tmp_path, procs):
    """A refusal reported before the barrier (at arrival) is not replayed: the
    prepare of a commit runs --on-arrive again and its new exit decides
    (docs/engines.md, "The barrier, exactly")."""
    marker, log = tmp_path / "ready", tmp_path / "hooks"
    hook = f'echo arrive $HWFS_VERSION >> {log}; [ -e {marker} ] || {{ echo "not ready yet" >&2; exit 4; }}'
    w = WatchProc(mount.mnt, "--engine", "retry", "--on-arrive", hook).start()
    procs.append(w)
    w.wait_line("registered as engine retry on " + mount.mnt)
    publish(mount, src, "v1")
    w.wait_line("refused v1: on-arrive hook exited 4: not ready yet")
    cp = mount.run("commit", "v1", check=False)  # refused again: the commit fails
    assert_error_line(cp, "engine retry", "not ready yet")
    assert log.read_text() == "arrive v1\n" * 2, log.read_text()
    assert readlink_or_none(mount.path("current")) is None
    marker.touch()  # the transient cause passed
    mount.run("commit", "v1")
    w.wait_line("loaded v1")
    assert os.readlink(mount.path("current")) == "versions/v1"
    assert log.read_text() == "arrive v1\n" * 3, log.read_text()
    assert poll(lambda: (engine_state(mount, "retry") or {}).get("serving") == "v1"), mount.status()
    assert w.stop() == 0


# --------------------------------------------------------------------------
# version names in hooks (docs/engines.md, "Recipes"; docs/cli.md, "watch")

# A version name a shell recipe that pastes $HWFS_PATH into a JSON body would
# turn into more JSON (hwfs accepts any name without '/' or control characters).
HOSTILE = 'v2", "load_format": "dummy", "method": "evil", "x": "'


def publish_named(mount, src, version, tensors=None):
    """publish() for any name, one that starts with '-' included."""
    save_model(src / "named" / "model.safetensors",
               tensors if tensors is not None else {"w": np.full((8, 8), 1, np.float32)})
    sh([HWFS, "publish", "-m", mount.mnt, "--", src / "named", version])


def test_hooks_do_not_run_for_a_version_name_not_safe_for_them(mount, src, tmp_path, procs):
    """Hooks run for names of A-Z a-z 0-9 . _ + @ = - (not starting with '-')
    only: another name is refused for that reason without running a hook, and
    a commit of it fails naming it; --any-name runs the hooks for any name."""
    log = tmp_path / "hooks"
    w = WatchProc(mount.mnt, "--engine", "careful", "--on-arrive", f'printf "%s\\n" "a $HWFS_VERSION" >> {log}',
                  "--on-commit", f'printf "%s\\n" "c $HWFS_VERSION" >> {log}').start()
    procs.append(w)
    w.wait_line("registered as engine careful on " + mount.mnt)
    for name in (HOSTILE, "-rf", "v 3", "v$(id)", "vé"):
        publish_named(mount, src, name)
        w.wait_line(f"refused {name}: version name not safe for hooks")
    cp = mount.run("commit", HOSTILE, check=False)
    assert_error_line(cp, "engine careful refused", "version name not safe for hooks")
    assert not os.path.lexists(mount.path("current"))
    fine = "v1.0+build@x=y_z-1"
    publish_named(mount, src, fine)
    w.wait_line(f"loaded {fine}")
    mount.run("commit", fine)
    w.wait_line(f"swapped {fine} (pause ", prefix=True)
    assert log.read_text() == f"a {fine}\nc {fine}\n"

    # --any-name: the hooks run, and get the name exactly
    w2 = WatchProc(mount.mnt, "--engine", "brave", "--any-name",
                   "--on-arrive", f'printf "%s\\n" "a $HWFS_VERSION" >> {log}.any').start()
    procs.append(w2)
    w2.wait_line(f"swapped {fine} (pause 0 us)")
    mount.run("rm", HOSTILE)
    publish_named(mount, src, HOSTILE)
    w2.wait_line(f"loaded {HOSTILE}")
    assert (tmp_path / "hooks.any").read_text() == f"a {fine}\na {HOSTILE}\n"


# The SGLang and vLLM recipes of docs/engines.md, run as written (the server's
# address aside) against a stub server that records every request.
RECIPE_HEADINGS = {"SGLang": "### SGLang: ", "vLLM": "### vLLM without the extension (fallback): "}


def recipe_hooks():
    """{section: [on-commit hook, ...]} of the SGLang recipe and the vLLM fallback
    recipe of docs/engines.md."""
    text = (REPO / "docs" / "engines.md").read_text()
    out = {}
    for section, heading in RECIPE_HEADINGS.items():
        body = text.split(heading, 1)[1].split("\n### ", 1)[0]
        out[section] = re.findall(r"--on-commit '(.*?)'\n", body, re.S)
    return out


class StubServer:
    """An HTTP server on 127.0.0.1 that records (method, path, body) and answers
    GET /weight_info with weight_version @served (vLLM), another GET with another
    model_path (SGLang's /get_model_info), a POST to a path in @fail with 500,
    every other POST with success."""

    def __init__(self, served="default", fail=()):
        import http.server

        self.requests = []
        self.served, self.fail = served, set(fail)
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, obj, code=200):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                stub.requests.append(("GET", self.path, b""))
                if self.path == "/weight_info":
                    self._answer({"weight_version": stub.served})
                else:
                    self._answer({"model_path": "/somewhere/else"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                stub.requests.append(("POST", self.path, self.rfile.read(n)))
                if self.path in stub.fail:
                    self._answer({"error": "stub failure"}, 500)
                else:
                    self._answer({"success": True, "message": "", "results": [None]})

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_recipes_send_json_bodies_whatever_the_version_name(mount, src, procs):
    """Every SGLang and vLLM on-commit hook of docs/engines.md posts exactly
    the documented JSON body, with the version's path as one string, for a
    version whose name is JSON itself (run with --any-name)."""
    if not shutil.which("curl") or not shutil.which("python3"):
        pytest.skip("the recipes need curl and python3")
    hooks = recipe_hooks()
    assert len(hooks["SGLang"]) == 1 and len(hooks["vLLM"]) == 1, hooks
    stub = StubServer()
    try:
        prev = None
        for i, (section, hook) in enumerate([(s, h) for s in hooks for h in hooks[s]]):
            hook = re.sub(r"http://127\.0\.0\.1:\d+", stub.url, hook)
            w = WatchProc(mount.mnt, "--engine", f"recipe{i}", "--any-name", "--on-commit", hook).start()
            procs.append(w)
            if prev:
                w.wait_line(f"swapped {prev} (pause 0 us)")  # the start-up pass, for the last one
            stub.requests.clear()
            name = f"{HOSTILE}{i}"
            publish_named(mount, src, name)
            mount.run("commit", name)
            w.wait_line(f"swapped {name} (pause ", prefix=True)
            path = mount.vpath(name)
            posts = [(p, json.loads(b) if b else None) for m, p, b in stub.requests if m == "POST"]
            want = {
                0: [("/update_weights_from_disk", {"model_path": path, "weight_version": name})],
                1: [("/pause?mode=wait", None),
                    ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}),
                    ("/reset_prefix_cache", None),
                    ("/update_weight_version", {"new_version": name}),
                    ("/resume", None)],
            }[i]
            assert posts == want, f"{section} hook {hook!r} posted {stub.requests}"
            assert w.stop() == 0
            prev = name
    finally:
        stub.close()


def test_vllm_recipe_skips_the_served_version_and_always_resumes(mount, src, procs):
    """The vLLM fallback hook of docs/engines.md: no request but GET /weight_info
    when the server already serves the version (the start-up pass after
    /update_weight_version); a reload that fails still resumes the server."""
    if not shutil.which("curl") or not shutil.which("python3"):
        pytest.skip("the recipes need curl and python3")
    hook = recipe_hooks()["vLLM"][0]
    publish(mount, src, "v1")
    mount.run("commit", "v1")
    stub = StubServer(served="v1", fail={"/collective_rpc"})
    try:
        hook = re.sub(r"http://127\.0\.0\.1:\d+", stub.url, hook)
        w = WatchProc(mount.mnt, "--engine", "vllm-0", "--on-commit", hook).start()
        procs.append(w)
        w.wait_line("swapped v1 (pause 0 us)")
        assert stub.requests == [("GET", "/weight_info", b"")], stub.requests

        stub.requests.clear()
        publish(mount, src, "v2")
        w.wait_line("loaded v2")
        mount.run("commit", "v2")  # the barrier passed; the swap itself fails
        w.wait_line("swap to v2 failed: ", prefix=True)
        posts = [p for m, p, b in stub.requests if m == "POST"]
        assert posts == ["/pause?mode=wait", "/collective_rpc", "/resume"], stub.requests
        assert (engine_state(mount, "vllm-0") or {}).get("serving") == "v1", mount.status()
        assert w.stop() == 0
    finally:
        stub.close()


# --------------------------------------------------------------------------
# hooks that do not end, or leave children behind


def kill_pid_in(path):
    """SIGKILL the process whose pid file @path names, if any (test cleanup)."""
    try:
        os.kill(int(path.read_text().split()[0]), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass


def test_a_hook_that_leaves_a_background_child_does_not_hang_the_watch(mount, src, tmp_path, procs):
    """A hook that starts a background process holding its stderr and exits 0
    is done when it exits: the version is reported loaded at once."""
    pidf = tmp_path / "bg.pid"
    hook = f'sleep 300 & echo $! > {pidf}; echo "arrive $HWFS_VERSION" >&2'
    w = WatchProc(mount.mnt, "--engine", "bg", "--on-arrive", hook).start()
    procs.append(w)
    try:
        w.wait_line("registered as engine bg on " + mount.mnt)
        publish(mount, src, "v1")
        w.wait_line("loaded v1")
        mount.run("commit", "v1")
        w.wait_line("swapped v1 (pause ", prefix=True)
        assert "arrive v1" in w.stderr or poll(lambda: "arrive v1" in w.stderr)
        assert w.stop() == 0
    finally:
        kill_pid_in(pidf)


def test_sigterm_ends_a_running_hook_and_its_children(mount, src, tmp_path, procs):
    """SIGTERM while a hook runs a child: the hook's whole process group gets
    it, and the watch exits 0."""
    pidf = tmp_path / "child.pid"
    hook = f"sh -c 'echo $$ > {pidf}; exec sleep 300'; echo after"
    w = WatchProc(mount.mnt, "--engine", "term", "--on-arrive", hook).start()
    procs.append(w)
    try:
        w.wait_line("registered as engine term on " + mount.mnt)
        publish(mount, src, "v1")
        assert poll(lambda: pidf.exists() and pidf.read_text().strip(), timeout=20)
        child = int(pidf.read_text())
        w.proc.send_signal(signal.SIGTERM)
        assert w.wait_exit() == 0, w.stderr
        assert poll(lambda: not pid_alive(child), timeout=10), "the hook's child survived the watch"
    finally:
        kill_pid_in(pidf)


def test_hook_timeout_refuses_the_version(mount, src, tmp_path, procs):
    """--hook-timeout: an on-arrive hook still running then is killed (its
    process group) and the version refused for that reason."""
    pidf = tmp_path / "slow.pid"
    hook = f"echo checking >&2; sh -c 'echo $$ > {pidf}; exec sleep 300'"
    w = WatchProc(mount.mnt, "--engine", "slow", "--hook-timeout", "1", "--on-arrive", hook).start()
    procs.append(w)
    try:
        w.wait_line("registered as engine slow on " + mount.mnt)
        publish(mount, src, "v1")
        w.wait_line("refused v1: on-arrive hook timed out after 1 s: checking")
        child = int(pidf.read_text())
        assert poll(lambda: not pid_alive(child), timeout=10), "the timed-out hook's child survived"
        cp = mount.run("commit", "v1", check=False)
        assert_error_line(cp, "engine slow refused v1", "timed out after 1 s")
        cp = mount.run("watch", "--hook-timeout", "x", check=False)
        assert cp.returncode == 2 and cp.stderr.startswith("usage: hwfs watch"), cp
    finally:
        kill_pid_in(pidf)
