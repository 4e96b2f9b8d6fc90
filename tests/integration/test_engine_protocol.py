"""The daemon side of engines (docs/engines.md), spoken directly over the control socket.

map: the arena's bytes through the passed read-only descriptor are the version's bytes, the
lease keeps them (after `hwfs rm`, gc, and new versions that would reuse the space) until the
connection closes or its process dies.  watch: arrived / current / removed events.  engine:
the local commit barrier (loaded, refused, silent, gone), names, reports, status.  Who may do
what, and hostile clients (garbage, huge lines, clients that never read).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import (TIMEOUT, find_all, flip_byte, make_tensors, pid_alive, poll,
                      random_file, readlink_or_none, save_model, wait_dead)
from engine_proto import (Conn, Mapping, call, commit_async, engine, engines_of,
                          finish, tensor_bytes_of)

NOBODY = 65534
HERE = Path(__file__).resolve().parent


def publish_model(m, root, version, seed, n=4, extra_file=False):
    """Publish a safetensors model (make_tensors(@seed, @n)) as @version; its tensors."""
    t = make_tensors(seed, n=n)
    d = Path(root) / version
    save_model(d / "model.safetensors", t)
    if extra_file:
        random_file(d / "blob.bin", 3 * 1024 * 1024 + 17, seed=seed)
    m.run("publish", d, version)
    return t, d


def v1_current_v2_published(m, root, seed, n=4):
    """v1 (seed @seed) published and committed, v2 (seed @seed + 1) published; v2's tensors."""
    publish_model(m, root, "v1", seed=seed, n=n)
    m.run("commit", "v1")
    return publish_model(m, root, "v2", seed=seed + 1, n=n)[0]


# ---------------------------------------------------------------------- map


def test_map_gives_the_versions_bytes(mount, tmp_path):
    m = mount
    t, src = publish_model(m, tmp_path, "v1", seed=11, extra_file=True)
    with Mapping(m.mnt, "v1") as mp:
        assert mp.ok, mp.reply
        r = mp.reply
        assert r["version"] == "v1" and r["digest"] == m.version("v1")["digest"]
        assert r["page_size"] == os.sysconf("SC_PAGE_SIZE")
        assert sorted(f["path"] for f in r["files"]) == ["blob.bin", "model.safetensors"]
        for f in r["files"]:
            # extents sorted by file offset, covering the file exactly
            pos = 0
            for foff, flen, aoff in f["extents"]:
                assert foff == pos and flen > 0 and 0 <= aoff and aoff + flen <= r["arena_size"]
                pos += flen
            assert pos == f["size"] == os.path.getsize(src / f["path"])
            assert mp.read(f["path"], 0, f["size"]) == (src / f["path"]).read_bytes()
        st = mp.file("model.safetensors")["tensors"]
        assert sorted(x["name"] for x in st) == sorted(t)
        for name, arr in t.items():
            meta, data = mp.tensor("model.safetensors", name)
            assert data == tensor_bytes_of(arr), name
            assert meta["dtype"] == "F32" and meta["shape"] == list(arr.shape)
            assert meta["len"] == arr.nbytes and len(meta["hash"]) == 32
        assert mp.file("blob.bin")["tensors"] == []
        # the descriptor is read-only: the arena cannot be written through it
        fd = mp.conn.fds[0]
        with pytest.raises(OSError):
            os.pwrite(fd, b"x", 0)
        assert m.status()["leases"] == [{"version": "v1", "pid": os.getpid()}]
    assert poll(lambda: m.status()["leases"] == []), m.status()["leases"]


def test_map_refuses_what_is_not_sealed_and_intact(mount_factory, tmp_path):
    m = mount_factory(capacity="64M")  # a small arena to search for the bytes to damage
    t, _ = publish_model(m, tmp_path, "v1", seed=12)
    os.mkdir(m.vpath("open1"))
    for version, words in (("nope", "no such version"), ("open1", "open"),
                           (".hwfs-x", "reserved")):
        r = call(m.mnt, {"op": "map", "version": version})
        assert r["ok"] is False and words in r["error"], (version, r)
    assert call(m.mnt, {"op": "map"})["error"] == "map: missing version"
    # damage one tensor's bytes in the arena: verify marks v1 damaged, map refuses it
    arena = os.path.join(m.store, "arena")
    needle = tensor_bytes_of(next(iter(t.values())))[:4096]
    hits = find_all(arena, needle)
    assert hits, "tensor bytes not found in the arena"
    flip_byte(arena, hits[0] + 100)
    m.run("verify", "v1", check=False)
    assert m.version("v1")["state"] == "damaged"
    r = call(m.mnt, {"op": "map", "version": "v1"})
    assert r["ok"] is False and "damaged" in r["error"], r


# Names no version can have: control characters (C0, DEL, C1 CSI), '/', empty, "..".
INVALID_NAMES = ["a\nb", "v\x1b[2Jx", "tab\there", "del\x7f", "c1\u009b2J", "a/b", "", ".."]


def raw_reply(mnt, req):
    """The daemon's answer line to @req as bytes, read from the socket as it is."""
    with Conn(mnt, req) as c:
        while b"\n" not in c.buf:
            data = c.s.recv(1 << 16)
            if not data:
                break
            c.buf += data
        return c.buf.split(b"\n", 1)[0]


def test_map_refuses_an_invalid_version_name(mount, tmp_path):
    """`map` of a name with a control character (or '/', "", "..") is EINVAL
    "invalid version name", as the CLI says, not "no such version" with the
    name echoed: its C1 CSI went back raw in the reply (JSON leaves C1 as it
    is).  Every op that names a version shares the check (daemon_op_call)."""
    import errno as E

    publish_model(mount, tmp_path, "v1", seed=14)
    ops = [("map", "version"), ("seal", "version"), ("commit", "version"), ("verify", "version"),
           ("rm", "version"), ("manifest", "version"), ("diff", "a"), ("diff", "b"),
           ("load", "version"), ("unload", "version"), ("gpumap", "version")]
    for bad in INVALID_NAMES:
        for op, key in ops:
            req = {"op": op, "a": "v1", "b": "v1", key: bad}
            line = raw_reply(mount.mnt, req)
            assert not [b for b in line if b < 0x20 or b == 0x7f], (op, bad, line)
            assert not any(0x80 <= line[i + 1] <= 0x9f for i in range(len(line) - 1)
                           if line[i] == 0xc2), (op, bad, line)
            r = json.loads(line)
            assert r["ok"] is False and r["errno"] == E.EINVAL, (op, bad, r)
            assert r["error"].startswith(f"{op}: invalid version name"), (op, bad, r)
    assert mount.version("v1")["state"] == "sealed"


def test_lease_keeps_bytes_after_rm_and_reuse(mount_factory, tmp_path):
    m = mount_factory(capacity="48M")
    t2 = v1_current_v2_published(m, tmp_path, seed=21, n=6)
    used_before = m.used_bytes()
    with Mapping(m.mnt, "v2") as mp:
        assert mp.ok, mp.reply
        want = {n: tensor_bytes_of(a) for n, a in t2.items()}

        def intact():
            return all(mp.tensor("model.safetensors", n)[1] == b for n, b in want.items())

        m.run("rm", "v2")
        assert "v2" not in os.listdir(m.path("versions"))
        assert intact(), "bytes changed after rm"
        assert m.used_bytes() == used_before, "rm of a leased version freed its shards"
        # new versions now take free space: never the leased shards' ranges
        for i, seed in enumerate((23, 24)):
            publish_model(m, tmp_path, f"v{3 + i}", seed=seed, n=6)
        m.run("gc", "--keep", "0")
        assert intact(), "bytes changed after new versions and gc"
        assert m.status()["leases"] == [{"version": "v2", "pid": os.getpid()}]
        with_lease = m.used_bytes()
    # the lease ended with the connection: v2's shards go
    assert poll(lambda: m.used_bytes() < with_lease), (with_lease, m.used_bytes())
    assert m.status()["leases"] == []


# A client process holding one map/watch/engine connection: prints "ok" or the daemon's
# error, then holds the connection until stdin closes or it is killed.  Standard library
# only: it also runs as an unprivileged user, under the system's python3.
CLIENT = textwrap.dedent("""
    import json, os, socket, sys
    what, mnt, arg = sys.argv[1:4]
    req = {"op": what}
    if what == "map":
        req["version"] = arg
    elif what == "engine":
        req["name"] = arg
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.getxattr(mnt, "user.hwfs.control").decode())
    s.sendall((json.dumps(req) + "\\n").encode())
    buf, fds = b"", []
    while b"\\n" not in buf:
        data, f, _, _ = socket.recv_fds(s, 1 << 20, 4)
        if not data:
            break
        buf, fds = buf + data, fds + f
    r = json.loads(buf.split(b"\\n")[0])
    print("ok" if r.get("ok") else r["error"], flush=True)
    sys.stdin.read()
""")


def client(m, what, arg="", user=None):
    """A CLIENT process (as @user when given); (Popen, its first output line)."""
    py = sys.executable
    cmd = [py, "-c", CLIENT, what, m.mnt, arg]
    if user is not None:  # our interpreter may live where that user cannot reach
        py = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
               py, "-c", CLIENT, what, m.mnt, arg]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd="/")
    line = p.stdout.readline().strip()
    return p, line


def test_lease_ends_when_the_client_is_killed(mount, tmp_path):
    m = mount
    publish_model(m, tmp_path, "v1", seed=31)
    publish_model(m, tmp_path, "v2", seed=32)
    m.run("commit", "v1")
    p, line = client(m, "map", "v2")
    try:
        assert line == "ok", (line, p.stderr.read() if p.poll() is not None else "")
        assert m.status()["leases"] == [{"version": "v2", "pid": p.pid}]
        m.run("rm", "v2")
        held = m.used_bytes()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert poll(lambda: m.status()["leases"] == []), m.status()["leases"]
    assert m.used_bytes() < held


def test_unprivileged_caller_may_watch_but_not_map_or_register(mount, tmp_path):
    m = mount
    publish_model(m, tmp_path, "v1", seed=41)
    for what, arg, word in (("map", "v1", "permission denied: map needs root"),
                            ("engine", "e1", "permission denied: engine needs root")):
        p, line = client(m, what, arg, user=NOBODY)
        p.stdin.close()
        p.wait(timeout=10)
        assert word in line, (what, line, p.stderr.read())
    assert m.status()["engines"] == [] and m.status()["leases"] == []
    p, line = client(m, "watch", user=NOBODY)
    try:
        assert line == "ok", (line, p.stderr.read() if p.poll() is not None else "")
    finally:
        p.stdin.close()
        p.wait(timeout=10)


# ---------------------------------------------------------------------- watch


def test_watch_reports_arrived_current_removed(mount, tmp_path):
    m = mount
    with Conn(m.mnt, {"op": "watch"}) as w:
        assert w.line() == {"ok": True, "current": None}
        publish_model(m, tmp_path, "v1", seed=51)
        assert w.line() == {"event": "arrived", "version": "v1"}
        m.run("commit", "v1")
        assert w.line() == {"event": "current", "version": "v1"}
        os.mkdir(m.vpath("v2"))
        Path(m.vpath("v2", "x.bin")).write_bytes(b"x" * 5000)
        m.run("seal", "v2")
        assert w.line() == {"event": "arrived", "version": "v2"}
        m.run("commit", "v2")
        assert w.line() == {"event": "current", "version": "v2"}
        m.run("rm", "v1")
        assert w.line() == {"event": "removed", "version": "v1"}
        publish_model(m, tmp_path, "v3", seed=53)
        assert w.line() == {"event": "arrived", "version": "v3"}
        m.run("gc", "--keep", "0")
        assert w.line() == {"event": "removed", "version": "v3"}
        # a manual commit through the mount is an event too
        os.symlink("versions/v2", m.path(".tmp-flip"))
        os.rename(m.path(".tmp-flip"), m.path("current"))
        assert w.line() == {"event": "current", "version": "v2"}
    with Conn(m.mnt, {"op": "watch"}) as w2:
        assert w2.line() == {"ok": True, "current": "v2"}


# ---------------------------------------------------------------------- the local barrier


def test_local_commit_waits_for_the_engine_to_load(mount, tmp_path):
    m = mount
    v1_current_v2_published(m, tmp_path, seed=61)
    e = engine(m, "llama-a")
    e.send({"report": "swapped", "version": "v1", "pause_us": 0})  # serving v1 at start
    assert poll(lambda: engines_of(m)["llama-a"]["serving"] == "v1")
    p = commit_async(m, "v2")
    assert e.event(skip=("arrived",)) == {"event": "prepare", "version": "v2"}
    assert p.poll() is None, "commit finished before the engine reported"
    assert readlink_or_none(m.path("current")) == "versions/v1"
    e.send({"report": "loading", "version": "v2"})
    assert poll(lambda: engines_of(m)["llama-a"]["state"] == "loading")
    e.send({"report": "loaded", "version": "v2"})
    rc, out = finish(p)
    assert rc == 0, out
    assert e.event() == {"event": "current", "version": "v2"}
    e.send({"report": "swapped", "version": "v2", "pause_us": 180})
    assert poll(lambda: engines_of(m)["llama-a"]["swaps"] == 1)
    st = engines_of(m)["llama-a"]
    assert st == {"name": "llama-a", "pid": os.getpid(), "serving": "v2", "shadow": None,
                  "state": "idle", "reason": None, "last_swap_pause_us": 180, "swaps": 1}
    # an engine that serves the version already is ready at once: no prepare, no wait
    rc, out = finish(commit_async(m, "v2"))
    assert rc == 0, out
    e.close()


def test_swapped_report_may_split_its_pause(mount, tmp_path):
    """drain_us and swap_us (hwfs-vllm's drain and swap) are kept beside
    pause_us and shown by hwfs status; a later report without them drops them."""
    m = mount
    v1_current_v2_published(m, tmp_path, seed=62)
    e = engine(m, "llama-s")
    e.send({"report": "swapped", "version": "v1", "pause_us": 0})
    assert poll(lambda: engines_of(m)["llama-s"]["serving"] == "v1")
    e.send({"report": "loaded", "version": "v2"})
    assert poll(lambda: engines_of(m)["llama-s"]["state"] == "loaded")
    assert finish(commit_async(m, "v2"))[0] == 0
    e.send({"report": "swapped", "version": "v2", "pause_us": 31800, "drain_us": 27500,
            "swap_us": 191})
    assert poll(lambda: engines_of(m)["llama-s"]["swaps"] == 1)
    st = engines_of(m)["llama-s"]
    assert (st["last_swap_pause_us"], st["last_drain_us"], st["last_swap_us"]) == (31800, 27500, 191)
    out = m.run("status").stdout
    assert "last swap paused 31800 us (1 swaps), drain 27500 us, swap 191 us" in out, out
    e.send({"report": "swapped", "version": "v1", "pause_us": 150, "drain_us": -3})
    assert poll(lambda: engines_of(m)["llama-s"]["swaps"] == 2)
    st = engines_of(m)["llama-s"]
    assert st["last_swap_pause_us"] == 150 and "last_drain_us" not in st and \
        "last_swap_us" not in st, st
    e.close()


def test_local_commit_refused_by_an_engine(mount, tmp_path):
    m = mount
    v1_current_v2_published(m, tmp_path, seed=71)
    ok = engine(m, "ok-engine")
    bad = engine(m, "bad-engine")
    p = commit_async(m, "v2")
    for e in (ok, bad):
        assert e.event(skip=("arrived",)) == {"event": "prepare", "version": "v2"}
    ok.send({"report": "loaded", "version": "v2"})
    bad.send({"report": "refused", "version": "v2", "reason": "tensor w: shape [8, 8], model has [4, 4]"})
    rc, out = finish(p)
    assert rc != 0 and "engine bad-engine refused v2: tensor w: shape [8, 8], model has [4, 4]" in out, out
    assert readlink_or_none(m.path("current")) == "versions/v1"
    assert m.status()["current"] == "v1"
    st = engines_of(m)["bad-engine"]
    assert st["state"] == "refused" and st["shadow"] == "v2" and "shape [8, 8]" in st["reason"]
    # a new commit asks again and its new answer decides
    p = commit_async(m, "v2")
    assert bad.event() == {"event": "prepare", "version": "v2"}
    bad.send({"report": "refused", "version": "v2", "reason": "tensor w: shape [8, 8], model has [4, 4]"})
    rc, out = finish(p)
    assert rc != 0 and "engine bad-engine refused v2" in out, out
    bad.send({"report": "loaded", "version": "v2"})
    assert poll(lambda: engines_of(m)["bad-engine"]["state"] == "loaded")
    rc, out = finish(commit_async(m, "v2"))
    assert rc == 0, out
    ok.close()
    bad.close()


def test_local_commit_fails_when_an_engine_stays_silent(mount_factory, tmp_path):
    m = mount_factory(extra=["-o", "engine_deadline_ms=300"])
    v1_current_v2_published(m, tmp_path, seed=81)
    with Conn(m.mnt, {"op": "engine", "name": "sleepy"}) as e:
        assert e.line()["ok"]
        rc, out = finish(commit_async(m, "v2"))
        assert rc != 0 and "engine sleepy did not report v2 loaded within 300 ms" in out, out
        assert e.event(skip=("arrived",)) == {"event": "prepare", "version": "v2"}
    assert readlink_or_none(m.path("current")) == "versions/v1"


def test_engine_that_disconnects_stops_counting(mount, tmp_path):
    m = mount
    publish_model(m, tmp_path, "v1", seed=91)
    e = engine(m, "quitter")
    p = commit_async(m, "v1")
    assert e.event(skip=("arrived",)) == {"event": "prepare", "version": "v1"}
    assert p.poll() is None
    e.close()
    rc, out = finish(p)
    assert rc == 0, out
    assert readlink_or_none(m.path("current")) == "versions/v1"
    assert m.status()["engines"] == []


def test_commit_with_no_engine_and_local_flag(mount, tmp_path):
    """No engine registered: commit does not wait (and --local on a lone node is the same)."""
    m = mount
    publish_model(m, tmp_path, "v1", seed=95)
    with Conn(m.mnt, {"op": "watch"}) as w:  # a watcher is not an engine: it never holds a commit
        assert w.line()["ok"]
        m.run("commit", "v1", "--local")
        assert w.event(skip=("arrived",)) == {"event": "current", "version": "v1"}


# ---------------------------------------------------------------------- names, reports, hostile clients


def test_engine_names(mount):
    m = mount
    for bad in ("", "a" * 65, "has space", "sl/ash", "ünï", "a\nb"):
        r = call(m.mnt, {"op": "engine", "name": bad})
        assert r["ok"] is False and "invalid engine name" in r["error"], (bad, r)
    assert call(m.mnt, {"op": "engine"})["error"] == "engine: missing name"
    e = engine(m, "A-z_0.9" + "x" * 57)
    r = call(m.mnt, {"op": "engine", "name": "A-z_0.9" + "x" * 57})
    assert r["ok"] is False and "already registered" in r["error"], r
    e.close()
    # the name is free again once its connection is gone
    assert poll(lambda: m.status()["engines"] == [])
    engine(m, "A-z_0.9" + "x" * 57).close()


def test_hostile_engine_is_ignored_then_dropped(mount, tmp_path):
    m = mount
    publish_model(m, tmp_path, "v1", seed=101)
    e = engine(m, "evil")
    for junk in (b"not json\n", b"[1, 2]\n", b"\n", b"{\"report\": 5}\n",
                 b"{\"report\": \"loaded\"}\n", b"{\"report\": \"loaded\", \"version\": \"nope\"}\n",
                 b"{\"report\": \"exploded\", \"version\": \"v1\"}\n",
                 b"{\"report\": \"loaded\", \"version\": \".hwfs-x\"}\n",
                 b"{\"report\": \"refused\", \"version\": \"v1\", \"reason\": \"" + b"r" * 5000 + b"\"}\n"):
        e.send(junk)
    assert poll(lambda: engines_of(m)["evil"]["state"] == "refused")
    st = engines_of(m)["evil"]
    assert st["shadow"] == "v1" and len(st["reason"]) == 512  # cut to ENGINE_REASON_MAX
    # a line over CTL_MAX_REQUEST (64 KiB) cannot be read past: the engine is dropped
    e.send(b"{\"report\": \"" + b"x" * (70 << 10))
    assert e.wait_eof(), "the daemon kept an engine that sent an over-long line"
    assert poll(lambda: m.status()["engines"] == [])
    e.close()
    m.run("commit", "v1")  # nothing left to wait for


def test_watcher_that_never_reads_is_dropped(mount, tmp_path):
    m = mount
    publish_model(m, tmp_path, "v1", seed=111)
    publish_model(m, tmp_path, "v2", seed=112)
    lazy = Conn(m.mnt, {"op": "watch"})
    lazy.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    log = os.path.join(m.store, "hwfs.log")
    dropped = lambda: "watcher (pid %d) dropped" % os.getpid() in Path(log).read_text(errors="replace")
    for i in range(5000):  # each commit sends it one event; its socket fills long before
        r = call(m.mnt, {"op": "commit", "version": "v1" if i % 2 else "v2"})
        assert r["ok"], r
        if i % 50 == 0 and dropped():
            break
    assert dropped(), "a watcher that never reads was kept"
    assert lazy.wait_eof(), "the dropped watcher's socket was not closed"
    lazy.close()
    m.run("commit", "v1")


# ---------------------------------------------------------------------- review fixes: descriptors, shutdown, forks, errno


def daemon_fds_on(pid, mnt):
    """The targets of daemon @pid's descriptors that lie on the mount @mnt."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target == mnt or target.startswith(mnt + "/"):
            out.append(target)
    return out


def test_daemon_keeps_no_descriptor_a_client_sends(mount, tmp_path):
    """A descriptor passed with a request or a report is closed at once (only the client
    library takes the arena's descriptor): a watcher that passes an open file of the mount
    cannot make the daemon hold its own mount open, and `hwfs umount` succeeds."""
    m = mount
    publish_model(m, tmp_path, "v1", seed=121)
    path = m.vpath("v1", "model.safetensors")
    w, e, mp = Conn(m.mnt, None), Conn(m.mnt, None), Conn(m.mnt, None)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            socket.send_fds(w.s, [b'{"op": "watch"}\n'], [fd])
            assert w.line() == {"ok": True, "current": None}
            socket.send_fds(w.s, [b'and more\n'], [fd])  # lines after the request too
            socket.send_fds(e.s, [b'{"op": "engine", "name": "fd-sender"}\n'], [fd])
            assert e.line()["ok"]
            socket.send_fds(e.s, [b'{"report": "loaded", "version": "v1"}\n'], [fd, fd])
            assert poll(lambda: engines_of(m)["fd-sender"]["state"] == "loaded")
            socket.send_fds(mp.s, [b'{"op": "map", "version": "v1"}\n'], [fd])
            assert mp.line()["ok"]
            socket.send_fds(mp.s, [b'x'], [fd])
        finally:
            os.close(fd)
        held = daemon_fds_on(m.pid, m.mnt)
        assert held == [], f"the daemon keeps descriptors a client sent: {held}"
        cp = m.umount(check=False)
        assert cp.returncode == 0, cp.stderr
        assert w.wait_eof() and e.wait_eof() and mp.wait_eof()
    finally:
        for c in (w, e, mp):
            c.close()


def test_lease_bytes_survive_the_daemon_stopping(mount_factory, tmp_path):
    """A removed version mapped by a client keeps its bytes when the daemon stops: the
    client's mapping of the arena file still reads them after `hwfs umount`."""
    m = mount_factory(capacity="48M")
    t2 = v1_current_v2_published(m, tmp_path, seed=131, n=6)
    with Mapping(m.mnt, "v2") as mp:
        assert mp.ok, mp.reply
        want = {n: tensor_bytes_of(a) for n, a in t2.items()}
        m.run("rm", "v2")
        m.umount()
        assert wait_dead(m.pid), "the daemon did not exit after hwfs umount"
        assert mp.conn.wait_eof(), "the lease's connection outlived the daemon"
        for name, b in want.items():
            assert mp.tensor("model.safetensors", name)[1] == b, \
                f"{name}: the mapping changed when the daemon stopped"


# An engine that forks: the parent registers, maps v1, forks a child that keeps both
# sockets open and sleeps, prints the child's pid and exits.  Standard library only.
FORKER = textwrap.dedent("""
    import json, os, socket, sys, time
    mnt = sys.argv[1]
    def conn(req):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.getxattr(mnt, "user.hwfs.control").decode())
        s.sendall((json.dumps(req) + "\\n").encode())
        buf = b""
        while b"\\n" not in buf:
            data, fds, _, _ = socket.recv_fds(s, 1 << 20, 4)
            assert data, "connection closed"
            buf += data
        assert json.loads(buf.split(b"\\n")[0])["ok"], buf
        return s
    keep = [conn({"op": "engine", "name": "forky"}), conn({"op": "map", "version": "v1"})]
    child = os.fork()
    if child == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
""")


def test_engine_and_lease_end_with_their_process_not_a_forked_child(mount, tmp_path):
    """The connection is not the only sign of life: a child that inherited the sockets of
    an engine and a map does not keep them registered once the process that made them
    exits.  The engine leaves status, the lease ends, a commit no longer waits."""
    m = mount
    v1_current_v2_published(m, tmp_path, seed=141)
    p = subprocess.Popen([sys.executable, "-c", FORKER, m.mnt], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, err
    child = int(out.split()[0])
    try:
        assert pid_alive(child)
        assert poll(lambda: m.status()["engines"] == [], 10), m.status()["engines"]
        assert poll(lambda: m.status()["leases"] == [], 10), m.status()["leases"]
        m.run("commit", "v2")
        assert readlink_or_none(m.path("current")) == "versions/v2"
    finally:
        os.kill(child, signal.SIGKILL)
        wait_dead(child)


def test_errno_comes_from_the_daemon_not_from_its_sentence(mount):
    """Error replies of map, watch and engine carry the errno; libhwfs takes it from there,
    not from the wording, which may quote the caller's own version name."""
    import ctypes
    import errno as E

    m = mount
    r = call(m.mnt, {"op": "map", "version": "permission denied"})
    assert r["ok"] is False and r["errno"] == E.ENOENT, r
    assert call(m.mnt, {"op": "map"})["errno"] == E.EINVAL
    assert call(m.mnt, {"op": "engine", "name": "a b"})["errno"] == E.EINVAL
    with Conn(m.mnt, {"op": "engine", "name": "taken"}) as e:
        assert e.line()["ok"]
        assert call(m.mnt, {"op": "engine", "name": "taken"})["errno"] == E.EEXIST
    lib = ctypes.CDLL(os.environ.get("HWFS_LIBRARY") or str(HERE.parents[1] / "build" / "libhwfs.so.1"))
    lib.hwfs_errmsg.restype = ctypes.c_char_p
    h = ctypes.c_void_p()
    assert lib.hwfs_open(m.mnt.encode(), ctypes.byref(h)) == 0, lib.hwfs_errmsg()
    try:
        for name, want in (("permission denied", E.ENOENT), ("is open", E.ENOENT),
                           ("damaged", E.ENOENT)):
            mp = ctypes.c_void_p()
            rc = lib.hwfs_map(h, name.encode(), ctypes.byref(mp))
            assert rc == -want, (name, rc, lib.hwfs_errmsg())
    finally:
        lib.hwfs_close(h)
