"""Who may drive a daemon through its control socket (docs/cli.md, "Permissions").

The daemon runs as root (the tests do); the callers are run as the unprivileged
user 65534 with setpriv.  Every daemon here is started under umask 0 with a
store path too long for a unix socket address: the case where the socket used
to fall back to a /tmp path whose mode came from the umask.
"""

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile

import pytest

from conftest import (HWFS, TIMEOUT, assert_error_line, is_mounted, make_tensors, poll,
                      random_file, save_model, sh)

NOBODY = 65534
GROUP = 4242  # a gid no test user has unless given with --groups


# How as_user() and user_popen() run their command (umask 0, a bare environment).
USER_KW = {"text": True, "umask": 0, "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
           "cwd": "/"}


def user_cmd(mount, *args, groups=None, uid=NOBODY, gid=NOBODY):
    """The command line of `hwfs ARGS -m MNT` as @uid/@gid (supplementary @groups, else none)."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}"]
    cmd += [f"--groups={','.join(str(g) for g in groups)}"] if groups else ["--clear-groups"]
    return cmd + [HWFS, *[str(a) for a in args], "-m", mount.mnt]


def as_user(mount, *args, groups=None, uid=NOBODY, gid=NOBODY):
    """`hwfs ARGS -m MNT` as @uid/@gid (supplementary @groups, else none), under umask 0."""
    return subprocess.run(user_cmd(mount, *args, groups=groups, uid=uid, gid=gid),
                          capture_output=True, timeout=TIMEOUT, **USER_KW)


def user_popen(mount, *args):
    """`hwfs ARGS -m MNT` started as user 65534 (as as_user()), its output in pipes."""
    return subprocess.Popen(user_cmd(mount, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **USER_KW)


@pytest.fixture
def shared_src():
    """A source directory that user 65534 can read (tmp_path is root-only)."""
    d = tempfile.mkdtemp(prefix="hwfs-src-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def two_versions(m, src):
    """v1 and v2 published and v1 committed (as root); an open version `open1`."""
    save_model(os.path.join(src, "a", "model.safetensors"), make_tensors(1, n=3))
    save_model(os.path.join(src, "b", "model.safetensors"), make_tensors(2, n=3))
    for d in ("a", "b"):  # safetensors writes 0600; let the test user read them
        os.chmod(os.path.join(src, d), 0o755)
        os.chmod(os.path.join(src, d, "model.safetensors"), 0o644)
    m.run("publish", os.path.join(src, "a"), "v1")
    m.run("publish", os.path.join(src, "b"), "v2")
    m.run("commit", "v1")
    os.mkdir(m.vpath("open1"))


def snapshot(m):
    st = m.status()
    return st["current"], sorted((v["name"], v["state"]) for v in st["versions"])


@pytest.mark.parametrize("umask", [0, 0o022, 0o077], ids=["000", "022", "077"])
def test_control_socket_mode_does_not_follow_umask(mount_factory, umask):
    """A root daemon's socket is /run/hwfs/PID.sock, mode 0666, in a root-owned 0755
    directory (not a symlink), whatever the umask it was started under; a user
    other than root can therefore connect even when the umask was 077."""
    m = mount_factory(long_store=True, umask=umask)
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    assert ctl == f"/run/hwfs/{m.pid}.sock", ctl
    st = os.lstat(ctl)
    assert stat.S_ISSOCK(st.st_mode), oct(st.st_mode)
    assert st.st_uid == 0
    assert stat.S_IMODE(st.st_mode) == 0o666, \
        f"socket {ctl} has mode {oct(stat.S_IMODE(st.st_mode))} under umask {umask:03o}"
    parent = os.lstat(os.path.dirname(ctl))
    assert stat.S_ISDIR(parent.st_mode), "the socket directory is not a directory (a symlink?)"
    assert parent.st_uid == 0 and stat.S_IMODE(parent.st_mode) == 0o755, \
        f"socket dir {os.path.dirname(ctl)}: uid {parent.st_uid} mode {oct(parent.st_mode)}"
    cp = as_user(m, "status", "--json")  # connecting needs write on the socket
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["pid"] == m.pid


def test_unprivileged_caller_cannot_mutate(mount_factory, shared_src):
    m = mount_factory(long_store=True, umask=0)
    two_versions(m, shared_src)
    before = snapshot(m)
    for verb in (["rm", "v2"], ["gc", "--keep", "0"], ["seal", "open1"], ["commit", "v2"],
                 ["verify", "v2"], ["publish", os.path.join(shared_src, "b"), "v9"]):
        cp = as_user(m, *verb)
        assert_error_line(cp, "permission denied", verb[0])
    assert snapshot(m) == before
    # read-only verbs work for anyone who may read the mount
    cp = as_user(m, "status", "--json")
    assert cp.returncode == 0, cp.stderr
    cp = as_user(m, "ls")
    assert cp.returncode == 0 and "v1" in cp.stdout, cp.stderr
    cp = as_user(m, "diff", "v1", "v2")
    assert cp.returncode == 0, cp.stderr


@pytest.mark.parametrize("how", ["primary", "supplementary", "name"])
def test_ctl_group_may_mutate(mount_factory, shared_src, how):
    group = "nogroup" if how == "name" else str(NOBODY if how == "primary" else GROUP)
    m = mount_factory(long_store=True, umask=0, extra=["--ctl-group", group])
    two_versions(m, shared_src)
    groups = [GROUP] if how == "supplementary" else None
    for verb in (["seal", "open1"], ["verify", "v2"], ["commit", "v2"], ["rm", "v1"],
                 ["gc", "--keep", "0"], ["publish", os.path.join(shared_src, "a"), "v3"]):
        cp = as_user(m, *verb, groups=groups)
        assert cp.returncode == 0, f"{verb}: {cp.stderr}"
    cur, vers = snapshot(m)
    assert cur == "v2" and [n for n, _ in vers] == ["v2", "v3"]
    # someone outside the group is still refused
    cp = as_user(m, "rm", "v3", uid=NOBODY - 1, gid=NOBODY - 1)
    assert_error_line(cp, "permission denied")


def test_ctl_group_unknown_is_refused(mount_factory, tmp_path):
    cp = subprocess.run([HWFS, "mount", str(tmp_path / "mnt"), "--store", str(tmp_path / "s"),
                         "--ctl-group", "no-such-group-hwfs"], capture_output=True, text=True,
                        timeout=TIMEOUT)
    assert_error_line(cp, "no-such-group-hwfs")


def test_publish_reads_sources_as_the_caller(mount_factory, shared_src):
    """A permitted caller cannot make the (root) daemon read files it cannot read."""
    m = mount_factory(long_store=True, umask=0, extra=["--ctl-group", str(GROUP)])
    pub = os.path.join(shared_src, "pub")
    os.mkdir(pub, 0o755)
    with open(os.path.join(pub, "ok.txt"), "w") as f:
        f.write("anyone may read this\n")
    secret = os.path.join(pub, "secret.txt")
    with open(secret, "w") as f:
        f.write("root only\n")
    os.chmod(secret, 0o600)
    cp = as_user(m, "publish", pub, "leak", groups=[GROUP])
    assert_error_line(cp, "secret.txt", "permission denied")
    assert m.version("leak") is None
    # a directory the caller cannot list is refused too
    closed = os.path.join(shared_src, "closed")
    os.mkdir(closed, 0o700)
    with open(os.path.join(closed, "x"), "w") as f:
        f.write("x")
    cp = as_user(m, "publish", closed, "leak2", groups=[GROUP])
    assert cp.returncode != 0 and m.version("leak2") is None, cp.stderr
    # what the caller can read, it may publish; root may publish anything
    os.chmod(secret, 0o644)
    cp = as_user(m, "publish", pub, "fine", groups=[GROUP])
    assert cp.returncode == 0, cp.stderr
    os.chmod(secret, 0o600)
    m.run("publish", pub, "byroot")
    with open(m.vpath("byroot", "secret.txt")) as f:
        assert f.read() == "root only\n"


def _ctl_connect(mnt):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(os.getxattr(mnt, "user.hwfs.control").decode())
    return s


@pytest.mark.limit(90)
def test_umount_waits_for_control_connections(tmp_path):
    """`hwfs umount` while one control connection idles and another publishes:
    the daemon stops the publish, closes both and exits 0 (no use after free;
    run with HWFS_BIN=build-asan/hwfs to have ASan check it)."""
    mnt, store, big = tmp_path / "mnt", "/dev/shm/" + tmp_path.name + "-store", tmp_path / "big"
    mnt.mkdir()
    for i in range(8):
        random_file(big / f"f{i}.bin", 32 << 20, seed=i)
    log = open(tmp_path / "daemon.log", "w+")
    env = dict(os.environ, HWFS_PUBLISH_IO="65536")  # small reads: the publish takes a while
    asan = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "log_path=" + str(tmp_path / "asan")
    proc = subprocess.Popen([HWFS, "mount", str(mnt), "--store", store, "-f"], stdout=log,
                            stderr=log, stdin=subprocess.DEVNULL, env=env)
    idle = pub = None
    try:
        assert poll(lambda: is_mounted(mnt) and os.path.exists(mnt / "versions"), 20), \
            "foreground daemon did not mount"
        idle = _ctl_connect(mnt)
        pub = _ctl_connect(mnt)
        pub.sendall(json.dumps({"op": "publish", "src": str(big), "version": "big"}).encode()
                    + b"\n")
        f = pub.makefile("rb")
        while True:  # wait until the publish is really moving bytes
            line = json.loads(f.readline())
            assert "progress" in line, f"publish ended before umount: {line}"
            if line["progress"]["done"] > 0:
                break
        cp = sh([HWFS, "umount", str(mnt)], check=False)
        assert cp.returncode == 0, cp.stderr
        rc = proc.wait(timeout=60)
        log.seek(0)
        out = log.read()
        reports = [p.name for p in tmp_path.iterdir() if p.name.startswith("asan")]
        assert rc == 0 and not reports and "AddressSanitizer" not in out, \
            f"daemon exit {rc}, sanitizer logs {reports}:\n{out[-4000:]}"
        # the publisher is told, or its connection is closed; progress lines the
        # daemon wrote before the umount reached it may come first
        rest = [ln for ln in f.read().decode().splitlines()
                if not (ln.startswith("{") and "progress" in json.loads(ln))]
        assert rest == [] or (len(rest) == 1 and json.loads(rest[0])["ok"] is False), rest
        assert idle.recv(1) == b""
    finally:
        for s in (idle, pub):
            if s:
                s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        shutil.rmtree(store, ignore_errors=True)
        log.close()


_LONG_REQUEST = r"""
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
chunk = b"x" * 65536
try:
    for _ in range(int(sys.argv[2])):  # one line without its newline
        s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
except (BrokenPipeError, ConnectionResetError):
    pass  # the daemon stopped reading: its answer is still queued for us
print(s.makefile("rb").readline().decode())
"""


def test_unprivileged_long_request_is_refused_early(mount_factory):
    """Anyone may connect, and the daemon reads the request before it knows the
    verb: the request line is bounded by what a request needs, not by the
    256 MiB an answer (a manifest) may take, so nobody can make the (root)
    daemon buffer hundreds of MiB per connection."""
    m = mount_factory(long_store=True, umask=0)
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    cp = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                         "python3", "-c", _LONG_REQUEST, ctl, "64"],  # 4 MiB
                        capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
    assert cp.returncode == 0, cp.stderr
    ans = json.loads(cp.stdout)
    assert ans["ok"] is False and "too long" in ans["error"], ans
    assert m.status()["pid"] > 0  # the daemon is still there and answers


def _request_of_size(total):
    """A status request line of exactly @total bytes, its newline included."""
    head, tail = b'{"op": "status", "pad": "', b'"}\n'
    return head + b"x" * (total - len(head) - len(tail)) + tail


@pytest.mark.parametrize("extra", [-1, 0, 1, 2])
def test_request_limit_is_exactly_ctl_max_request(mount_factory, extra):
    """CTL_MAX_REQUEST (64 KiB) bounds a request line, its newline included: a line
    of 65535 or 65536 bytes is read and answered, one of 65537 or more is refused
    "request too long" with EMSGSIZE (as the unprivileged user 65534)."""
    m = mount_factory(long_store=True, umask=0)
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    total = (64 << 10) + extra
    line = _request_of_size(total)
    assert len(line) == total
    cp = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                         "python3", "-c", _SEND_LINE, ctl],
                        input=line, capture_output=True, timeout=TIMEOUT, cwd="/")
    assert cp.returncode == 0, cp.stderr
    ans = json.loads(cp.stdout)
    if total <= 64 << 10:
        assert ans.get("ok") is True and ans["pid"] == m.pid, (total, ans)
    else:
        assert ans["ok"] is False and "request too long" in ans["error"], (total, ans)
        assert ans["errno"] == 90, ans  # EMSGSIZE
    assert m.status()["pid"] == m.pid


_SEND_LINE = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
try:
    s.sendall(sys.stdin.buffer.read())
except (BrokenPipeError, ConnectionResetError):
    pass  # the daemon stopped reading: its answer is still queued for us
sys.stdout.write(s.makefile("rb").readline().decode())
"""


def test_private_version_manifest_and_diff_need_read_access(mount_factory, shared_src):
    """`manifest` and `diff` show names, sizes, modes, tensor names and the
    hashes of every shard (a 7-byte secret's hash is a brute-force away from
    the secret): a caller who may read the mount but not a version's files
    gets neither, as `ls` and `cat` through the mount would refuse him."""
    m = mount_factory(long_store=True, umask=0)
    two_versions(m, shared_src)
    priv = os.path.join(shared_src, "priv")
    os.mkdir(priv, 0o700)
    with open(os.path.join(priv, "secret-token.txt"), "w") as f:
        f.write("hunter2")
    os.chmod(os.path.join(priv, "secret-token.txt"), 0o600)
    save_model(os.path.join(priv, "model.safetensors"), make_tensors(3, n=3))  # 0600
    m.run("publish", priv, "private")
    for verb in (["manifest", "private"], ["diff", "v1", "private"], ["diff", "private", "v1"]):
        cp = as_user(m, *verb)
        assert_error_line(cp, "permission denied", "private")
        assert "secret-token" not in cp.stdout + cp.stderr
    # an open directory is not enough when one file in it is private
    os.chmod(priv, 0o755)
    m.run("publish", priv, "half")
    cp = as_user(m, "manifest", "half")
    assert_error_line(cp, "permission denied", "half")
    # readable versions still work for anyone, private ones for root and the owner
    cp = as_user(m, "manifest", "v1")
    assert cp.returncode == 0 and "model.safetensors" in cp.stdout, cp.stderr
    assert "secret-token.txt" in m.run("manifest", "private").stdout


_HOLD_CONNECTIONS = r"""
import errno, json, socket, sys
path, n = sys.argv[1], int(sys.argv[2])
held, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    held.append(s)
for s in held[-4:]:  # the last ones are over the limit: the daemon answers and closes them
    s.settimeout(10)
    data = s.recv(4096)
    if data and "too many control connections" in json.loads(data)["error"] and \
            json.loads(data).get("errno") == errno.EAGAIN:
        refused += 1
s = held[0]  # one under the limit still works
s.sendall(b'{"op": "status"}\n')
s.settimeout(10)
ok = json.loads(s.makefile().readline())["ok"]
print(json.dumps({"refused": refused, "first_ok": ok}))
sys.stdout.flush()
"""


def test_unprivileged_user_cannot_exhaust_control_connections(mount_factory):
    """Each control connection has a thread: a user who may connect must not be able to
    hold so many that the daemon cannot serve anyone else.  Past ctl_conns_per_uid (8
    here) the daemon answers "too many control connections" and closes; connections
    under the limit, and other users (root here), are served meanwhile."""
    m = mount_factory(long_store=True, umask=0, extra=("-o", "ctl_conns_per_uid=8"))
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    holder = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                               "python3", "-c", _HOLD_CONNECTIONS, ctl, "12"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        out, err = holder.communicate(timeout=TIMEOUT)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0, err
    ans = json.loads(out)
    assert ans == {"refused": 4, "first_ok": True}, ans
    assert m.status()["pid"] > 0  # root is served
    cp = as_user(m, "status")  # nobody again, once its connections are gone
    assert cp.returncode == 0, cp.stderr


_HOLD_WATCHES = r"""
import json, socket, sys
path, n = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(n):  # long-lived: each stays open, answered, waiting for events
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall(b'{"op": "watch"}\n')
    first = json.loads(s.makefile("rb").readline())
    assert first.get("ok", True) and "error" not in first, first
    held.append(s)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # one more, of any kind
s.settimeout(10)
s.connect(path)
try:
    s.sendall(b'{"op": "status"}\n')
except (BrokenPipeError, ConnectionResetError):
    pass  # refused at accept: the daemon answered and closed without reading
print(s.makefile("rb").readline().decode(), end="", flush=True)
"""


def test_unprivileged_watch_connections_count_against_the_cap(mount_factory):
    """docs/security.md: an unprivileged user's long-lived `watch` connections count
    against ctl_conns_per_uid like any other: with 8 watches open, its 9th
    connection is refused "too many control connections"."""
    m = mount_factory(long_store=True, umask=0, extra=("-o", "ctl_conns_per_uid=8"))
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    cp = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                         "python3", "-c", _HOLD_WATCHES, ctl, "8"],
                        capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
    assert cp.returncode == 0, cp.stderr
    ans = json.loads(cp.stdout)
    assert ans["ok"] is False and "too many control connections" in ans["error"], ans
    assert m.status()["pid"] == m.pid  # root is served meanwhile


_HOLD_LONG_LIVED = r"""
import json, os, socket, sys
path, n = sys.argv[1], int(sys.argv[2])
def conn(req):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall((json.dumps(req) + "\n").encode())
    data, fds, _, _ = socket.recv_fds(s, 1 << 20, 4)
    for fd in fds:
        os.close(fd)
    return s, json.loads(data.split(b"\n")[0])
held, answers = [], []
for i in range(n):  # maps and watches, as an engine with many live arrays holds them
    s, a = conn({"op": "map", "version": "v1"} if i % 2 else {"op": "watch"})
    held.append(s)
    answers.append(a.get("error", "ok"))
print(json.dumps(answers), flush=True)
sys.stdin.read()  # hold them until the test is done
"""


def test_privileged_callers_are_not_capped_by_long_lived_connections(mount_factory, shared_src):
    """ctl_conns_per_uid caps users who may not change the mount: root, the mount's owner and
    --ctl-group are not capped (they may remove every version anyway), so an engine of
    theirs holding many map and watch connections never locks them out of their own
    `hwfs status` and `hwfs commit`.  Others stay capped (the test above)."""
    m = mount_factory(long_store=True, umask=0,
                      extra=("--ctl-group", str(GROUP), "-o", "ctl_conns_per_uid=8"))
    two_versions(m, shared_src)
    ctl = os.getxattr(m.mnt, "user.hwfs.control").decode()
    holder = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                               f"--groups={GROUP}", "python3", "-c", _HOLD_LONG_LIVED, ctl, "12"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd="/")
    try:
        line = holder.stdout.readline()
        assert line, holder.stderr.read() if holder.poll() is not None else "no answer"
        assert json.loads(line) == ["ok"] * 12, line
        assert len(m.status()["leases"]) == 6
        for verb in (["status"], ["commit", "v2"]):
            cp = as_user(m, *verb, groups=[GROUP])
            assert cp.returncode == 0, f"{verb}: {cp.stderr}"
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
    assert m.status()["current"] == "v2"


def _suid_dir():
    """A new directory user 65534 can enter on a filesystem that honours set-id bits, or None."""
    for base in (tempfile.gettempdir(), "/var/tmp", "/dev/shm", os.path.dirname(HWFS)):
        try:
            if os.statvfs(base).f_flag & os.ST_NOSUID:
                continue
            d = tempfile.mkdtemp(prefix="hwfs-suid-", dir=base)
        except OSError:
            continue
        os.chmod(d, 0o755)
        return d
    return None


@pytest.mark.parametrize("prog", ["hwfs-core", "hwfs"])
def test_set_id_program_refuses_to_run(prog):
    """A root-owned copy of hwfs-core (or hwfs) made setuid or setgid and run by
    user 65534 refuses at once with one line, before it reads an argument or
    the environment (HWFS_MOUNT, tunables, HWFS_CUDART): hwfs acts for its
    caller and is never to be installed set-id.  The same copy without the
    bit runs."""
    d = _suid_dir()
    if d is None:
        pytest.skip("no filesystem here honours setuid bits (every candidate is nosuid)")
    try:
        copy = os.path.join(d, prog)
        shutil.copy(os.path.join(os.path.dirname(HWFS), prog), copy)
        os.chown(copy, 0, 0)
        run = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", copy,
               "--help"]
        os.chmod(copy, 0o755)
        cp = subprocess.run(run, capture_output=True, timeout=TIMEOUT, **USER_KW)
        assert cp.returncode == 0 and "usage" in cp.stdout, cp
        for mode in (0o4755, 0o2755):
            os.chmod(copy, mode)
            env = dict(USER_KW["env"], HWFS_MOUNT="/", HWFS_CUDART="/nonexistent.so")
            cp = subprocess.run(run, capture_output=True, timeout=TIMEOUT,
                                **dict(USER_KW, env=env))
            assert cp.returncode == 1 and not cp.stdout, (oct(mode), cp)
            assert_error_line(cp, "refusing to run setuid or setgid")
    finally:
        shutil.rmtree(d, ignore_errors=True)
