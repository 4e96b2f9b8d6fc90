"""libhwfs and the C engine built on it (docs/engines.md, include/hwfs.h).

The engine (build/hwfs-engine) maps each version zero-copy with hwfs_map,
checks every tensor against its hash and answers, over a unix socket, the
version it serves, its digest and a checksum of every byte it maps.  A small
C program compiled against libhwfs checks the map itself (stitched tensors,
copied ones) and, against a `make install`ed tree found by pkg-config, that
the installed library, header and .pc file are what a program needs.
"""

import errno
import json
import os
import re
import socket
from pathlib import Path

import numpy as np
import pytest

from conftest import (CHANGED_IDX, HWFS, REPO, make_tensors, poll, save_model, sh,
                      safetensors_header)
from engine_proc import WatchProc, engine_state, procs, start_engine  # noqa: F401 (procs: fixture)
from fake_daemon import fake_daemon  # noqa: F401 (a fixture)

BUILD = Path(HWFS).resolve().parent
# a program linked with a sanitizer build's libhwfs needs that sanitizer's runtime
SANITIZE = {"build-asan": ["-fsanitize=address,undefined"], "build-tsan": ["-fsanitize=thread"]}.get(BUILD.name, [])

# Maps VERSION of MOUNT, writes tensor NAME's bytes to OUT and prints
# "DIGEST DTYPE [SHAPE] copied=C".
MAP_DUMP_C = r"""
#include <hwfs.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	struct hwfs *h = NULL;
	struct hwfs_map *m = NULL;
	const struct hwfs_tensor *t;
	FILE *f;
	int rc = 2;

	if (argc != 5 || hwfs_open(argv[1], &h) < 0 || hwfs_map(h, argv[2], &m) < 0) {
		fprintf(stderr, "map_dump: %s\n", hwfs_errmsg());
		rc = 1;
		goto out;
	}
	t = hwfs_map_find(m, argv[3]);
	if (!t || !(f = fopen(argv[4], "wb")))
		goto out;
	if (fwrite(t->data, 1, t->len, f) == t->len) {
		printf("%s %s [", hwfs_map_digest(m), t->dtype);
		for (unsigned i = 0; i < t->ndim; i++)
			printf("%s%llu", i ? ", " : "", (unsigned long long)t->shape[i]);
		printf("] copied=%d\n", t->copied);
		rc = 0;
	}
	fclose(f);
out:
	hwfs_unmap(m);
	hwfs_close(h);
	return rc;
}
"""


def publish(mount, src, version, tensors, metadata=None):
    save_model(src / version / "model.safetensors", tensors, metadata)
    mount.run("publish", src / version, version)
    return mount.version(version)["digest"]


def engine_on_v1(procs, mount, src, tmp_path, tensors):
    """@tensors published as v1 and committed, then engine e1 started on @mount
    until it serves v1; returns (the engine, its answer, v1's digest)."""
    d1 = publish(mount, src, "v1", tensors)
    mount.run("commit", "v1")
    eng = start_engine(procs, mount.mnt, "e1", tmp_path)
    return eng, eng.wait_serving("v1"), d1


def build_against_libhwfs(tmp_path_factory, name, source):
    """C program @name from @source, built against the tree's libhwfs (include/,
    build/libhwfs.so): its path."""
    d = tmp_path_factory.mktemp(name)
    (d / f"{name}.c").write_text(source)
    sh(["cc", *SANITIZE, "-o", d / name, d / f"{name}.c", f"-I{REPO / 'include'}", f"-L{BUILD}",
        "-lhwfs", f"-Wl,-rpath,{BUILD}"])
    return d / name


@pytest.fixture(scope="module")
def map_dump(tmp_path_factory):
    """map_dump built against the tree's libhwfs."""
    return build_against_libhwfs(tmp_path_factory, "map_dump", MAP_DUMP_C)


# --------------------------------------------------------------------------
# the C engine


def test_engine_serves_committed_version_then_the_next(mount, src, tmp_path, procs):
    t1 = make_tensors(seed=1)
    eng, a1, d1 = engine_on_v1(procs, mount, src, tmp_path, t1)
    assert a1["digest"] == d1 and a1["tensors"] == len(t1)
    assert a1["bytes"] == sum(t.nbytes for t in t1.values())
    st = engine_state(mount, "e1")
    assert st and st["serving"] == "v1" and st["pid"] == eng.pid, st
    assert {"version": "v1", "pid": eng.pid} in mount.status()["leases"]

    d2 = publish(mount, src, "v2", make_tensors(seed=1, changed=CHANGED_IDX))
    mount.run("commit", "v2")
    a2 = eng.wait_serving("v2")
    assert a2["digest"] == d2 and a2["checksum"] != a1["checksum"]
    st = engine_state(mount, "e1")
    assert st["serving"] == "v2" and st["swaps"] >= 1 and st["last_swap_pause_us"] >= 1, st
    # the old version stays mapped as the standby, reported loaded: a rollback is ready at once
    assert poll(lambda: sorted(l["version"] for l in mount.status()["leases"] if l["pid"] == eng.pid)
                == ["v1", "v2"]), mount.status()["leases"]
    assert poll(lambda: engine_state(mount, "e1")["shadow"] == "v1"
                and engine_state(mount, "e1")["state"] == "loaded"), engine_state(mount, "e1")
    # ... and the standby before it is unmapped at the next swap
    publish(mount, src, "v3", make_tensors(seed=1, changed=(0,)))
    mount.run("commit", "v3")
    eng.wait_serving("v3")
    assert poll(lambda: sorted(l["version"] for l in mount.status()["leases"] if l["pid"] == eng.pid)
                == ["v2", "v3"]), mount.status()["leases"]
    assert eng.stop() == 0, eng.log()
    assert poll(lambda: engine_state(mount, "e1") is None), "a stopped engine is still registered"


def test_mapped_version_survives_rm_until_unmapped(mount, src, tmp_path, procs):
    t1 = make_tensors(seed=2)
    eng, a1, _ = engine_on_v1(procs, mount, src, tmp_path, t1)

    # A version the engine refuses (another shape); `current` moved to it
    # past the barrier (`hwfs commit --local --force`) leaves v1 served and no
    # longer current, so it can be removed under the engine.
    bad = {k: (v[:32] if i == 0 else v) for i, (k, v) in enumerate(t1.items())}
    publish(mount, src, "v2", bad)
    eng.wait_log("refused v2")
    mount.run("commit", "v2", "--local", "--force")
    assert os.readlink(mount.path("current")) == "versions/v2"
    used = mount.used_bytes()
    mount.run("rm", "v1")
    assert mount.version("v1") is None
    # v1's bytes stay (a freed page would be punched out and read as zeros):
    # the engine still serves them, also once new data arrived
    assert mount.used_bytes() == used, "the shards of a mapped version were freed by rm"
    assert {"version": "v1", "pid": eng.pid} in mount.status()["leases"]
    # v3 changes tensor 0: v1's tensor 0 (64 KiB) is then in no other version
    publish(mount, src, "v3", make_tensors(seed=2, changed=(0,)))
    assert eng.ask() == a1
    held = mount.used_bytes()

    # the engine swaps to v3 and unmaps v1: then its shards are freed
    mount.run("commit", "v3")
    eng.wait_serving("v3")
    assert poll(lambda: mount.used_bytes() < held, timeout=10), \
        f"store usage did not drop after the engine unmapped the removed v1 ({held} bytes)\n{eng.log()}\n{mount.status()}\n{mount.log_tail()}"
    assert all(l["version"] != "v1" for l in mount.status()["leases"])


def test_kill9_engine_releases_registration_and_lease(mount, src, tmp_path, procs):
    eng, _, _ = engine_on_v1(procs, mount, src, tmp_path, make_tensors(seed=3))
    assert engine_state(mount, "e1") is not None
    eng.kill9()
    assert poll(lambda: engine_state(mount, "e1") is None and not mount.status()["leases"], timeout=10), \
        f"after kill -9 the node still shows {mount.status()['engines']} {mount.status()['leases']}"
    # the name is free again, and a restarted engine loads `current`
    eng2 = start_engine(procs, mount.mnt, "e1", tmp_path)
    eng2.wait_serving("v1")


def test_engine_exits_1_when_the_daemon_goes(mount, src, tmp_path, procs):
    eng, _, _ = engine_on_v1(procs, mount, src, tmp_path, make_tensors(seed=6, n=2))
    mount.umount()
    assert eng.proc.wait(timeout=20) == 1, eng.log()
    assert "closed the event stream" in eng.log()
    assert not os.path.exists(eng.sock), "the engine left its socket behind"


def test_engine_refuses_other_shapes_and_local_commit_aborts(mount, src, tmp_path, procs):
    t1 = make_tensors(seed=4)
    eng, _, _ = engine_on_v1(procs, mount, src, tmp_path, t1)
    name = next(iter(t1))
    bad = dict(t1)
    bad[name] = t1[name][:16]
    publish(mount, src, "v2", bad)
    cp = mount.run("commit", "v2", check=False)
    assert cp.returncode == 1, cp
    want = f"tensor {name}: shape [16, 256] does not match the model's [{t1[name].shape[0]}, 256]"
    assert "engine e1 refused v2" in cp.stderr and want in cp.stderr, cp.stderr
    assert os.readlink(mount.path("current")) == "versions/v1"
    assert eng.ask()["version"] == "v1"
    st = engine_state(mount, "e1")
    assert st["state"] == "refused" and want in st["reason"], st


# --------------------------------------------------------------------------
# hwfs_map: tensors in pieces


def save_page_aligned(path, tensors, page=4096):
    """save_model(), with the header padded (metadata) so that the data starts
    on a page: the first tensor's pieces then start on pages in the arena."""
    save_model(path, tensors, {"pad": ""})
    short = page - safetensors_header(path)[1] % page  # bytes to add, give or take the 8-byte padding
    for pad in range(max(short - 8, 0), short + 9):
        save_model(path, tensors, {"pad": "x" * pad})
        if safetensors_header(path)[1] % page == 0:
            return path
    raise AssertionError("no padding puts the data on a page")


def test_map_stitches_tensors_in_pieces(mount_factory, src, map_dump, tmp_path):
    """With 64 KiB shards, a 1 MiB tensor that starts on a page is 16 shards
    that start on pages.  In v2 one piece changed: its shards are no longer
    one run of the arena, and hwfs_map stitches them with page mappings
    (not copied); the bytes are the tensor's."""
    m = mount_factory(extra=["-o", "max_shard=65536"])
    big = np.arange(1024 * 256, dtype=np.float32).reshape(1024, 256)
    save_page_aligned(src / "v1" / "model.safetensors", {"big": big, "small": np.ones((4, 4), np.float32)})
    m.run("publish", src / "v1", "v1")
    big2 = big.copy()
    big2[300] = -1  # inside the 5th 64 KiB piece
    save_page_aligned(src / "v2" / "model.safetensors", {"big": big2, "small": np.ones((4, 4), np.float32)})
    m.run("publish", src / "v2", "v2")
    d2 = m.version("v2")["digest"]
    out = tmp_path / "big.bin"
    cp = sh([map_dump, m.mnt, "v2", "big", out])
    assert cp.stdout.split() == [d2, "F32", "[1024,", "256]", "copied=0"], cp.stdout
    assert out.read_bytes() == big2.tobytes()


def test_map_copies_tensors_whose_pieces_are_not_page_aligned(mount_factory, src, map_dump, tmp_path):
    """Shards of 5000 bytes: in v2 one piece changed, so the tensor's pieces
    are not one run of the arena, and their boundaries are not on pages: no
    page mapping can put them end to end, so the tensor is copied (and says so)."""
    m = mount_factory(extra=["-o", "max_shard=5000"])
    a = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    publish(m, src, "v1", {"a": a})
    a2 = a.copy()
    a2[20] = -1  # inside the 5th piece
    d2 = publish(m, src, "v2", {"a": a2})
    out = tmp_path / "a.bin"
    cp = sh([map_dump, m.mnt, "v2", "a", out])
    assert cp.stdout.split() == [d2, "F32", "[64,", "256]", "copied=1"], cp.stdout
    assert out.read_bytes() == a2.tobytes()


def test_map_errors_are_errno_and_a_sentence(mount, src, map_dump, tmp_path):
    publish(mount, src, "v1", {"a": np.zeros((4, 4), np.float32)})
    os.mkdir(mount.vpath("open"))
    for version, words in (("nope", "no such version"), ("open", "is open")):
        cp = sh([map_dump, mount.mnt, version, "a", tmp_path / "x"], check=False)
        assert cp.returncode == 1 and words in cp.stderr, cp
    cp = sh([map_dump, "/tmp", "v1", "a", tmp_path / "x"], check=False)
    assert cp.returncode == 1 and "not an hwfs mount" in cp.stderr, cp


# --------------------------------------------------------------------------
# make install + pkg-config


@pytest.mark.limit(300)
def test_make_install_and_pkg_config(mount, src, tmp_path):
    root = tmp_path / "root"
    sh(["make", "-s", "-C", REPO, "install", f"DESTDIR={root}", "PREFIX=/usr"], timeout=280)
    lib = root / "usr" / "lib"
    for rel in ("bin/hwfs", "bin/hwfs-engine", "include/hwfs.h", "lib/libhwfs.a",
                "lib/libhwfs.so", "lib/libhwfs.so.1", "lib/pkgconfig/hwfs.pc"):
        assert (root / "usr" / rel).exists(), f"make install did not install {rel}"
    assert os.readlink(lib / "libhwfs.so.1") == "libhwfs.so.1.0.0"
    # the shared library exports the API and nothing else
    syms = sh(["nm", "-D", "--defined-only", lib / "libhwfs.so.1"]).stdout.split("\n")
    names = [ln.split()[-1].split("@")[0] for ln in syms if ln.strip()]
    assert names and all(n.startswith("hwfs_") or n == "HWFS_1" for n in names), names
    # exactly the functions include/hwfs.h declares
    declared = set(re.findall(r"\b(hwfs_[a-z0-9_]+)\(", (REPO / "include" / "hwfs.h").read_text()))
    assert set(names) - {"HWFS_1"} == declared, (sorted(set(names) ^ declared))
    assert {"hwfs_load", "hwfs_unload", "hwfs_map_gpu", "hwfs_map_device", "hwfs_map_dlpack",
            "hwfs_map_dlpack_versioned", "hwfs_watch_open_gpu"} <= declared
    soname = sh(["readelf", "-d", lib / "libhwfs.so.1"]).stdout
    assert "Library soname: [libhwfs.so.1]" in soname
    if (REPO / "tools" / "python" / "hwfs").is_dir():
        libdirs = list((root / "usr" / "lib").glob("python3*/*-packages/hwfs/_libdir.py"))
        assert len(libdirs) == 1, libdirs
        assert libdirs[0].read_text().strip().endswith('LIBDIR = "/usr/lib"'), libdirs[0].read_text()

    t = make_tensors(seed=5, n=3)
    d1 = publish(mount, src, "v1", t)
    name = list(t)[1]
    (tmp_path / "prog.c").write_text(MAP_DUMP_C)
    env = dict(os.environ, PKG_CONFIG_PATH=str(lib / "pkgconfig"), PKG_CONFIG_SYSROOT_DIR=str(root))
    flags = sh(["pkg-config", "--cflags", "--libs", "hwfs"], env=env).stdout.split()
    assert f"-I{root}/usr/include" in flags and "-lhwfs" in flags, flags
    sh(["cc", "-o", tmp_path / "prog", tmp_path / "prog.c", *flags], env=env)
    assert "libhwfs.so.1" in sh(["readelf", "-d", tmp_path / "prog"]).stdout
    # static: the archive and the libraries pkg-config --static names
    sflags = sh(["pkg-config", "--static", "--libs", "hwfs"], env=env).stdout.split()
    sh(["cc", "-o", tmp_path / "prog-static", tmp_path / "prog.c", f"-I{root}/usr/include",
        str(lib / "libhwfs.a"), *[f for f in sflags if f != "-lhwfs" and not f.startswith("-L")]], env=env)
    assert "libhwfs.so" not in sh(["readelf", "-d", tmp_path / "prog-static"]).stdout

    hdr, start = safetensors_header(mount.vpath("v1", "model.safetensors"))
    for prog in ("prog", "prog-static"):
        out = tmp_path / f"{prog}.bin"
        cp = sh([tmp_path / prog, mount.mnt, "v1", name, out], env=dict(env, LD_LIBRARY_PATH=str(lib)))
        assert cp.stdout.split()[:2] == [d1, "F32"], cp.stdout
        assert out.read_bytes()[:64] == t[name].tobytes()[:64]
        assert out.read_bytes() == t[name].tobytes()
    assert hdr[name]["dtype"] == "F32"


# --------------------------------------------------------------------------
# names: any name hwfs accepts, and names a daemon must never send


def test_engine_answer_is_json_whatever_the_version_name(mount, src, tmp_path, procs):
    """hwfs-engine's answer names the served version as a JSON string: a name
    with quotes, a backslash, a tab-free control-free UTF-8 tail comes back
    exactly, not as more JSON."""
    name = 'v1", "version": "forged", "x": "\\ é'
    t = make_tensors(seed=7, n=2)
    d1 = publish(mount, src, name, t)
    mount.run("commit", name)
    eng = start_engine(procs, mount.mnt, "e1", tmp_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(eng.sock)
        s.sendall(b"what do you serve?\n")
        buf = b""
        while not buf.endswith(b"\n"):
            data = s.recv(4096)
            assert data, f"the engine closed the connection after {buf!r}"
            buf += data
    ans = json.loads(buf)
    assert ans["version"] == name and ans["digest"] == d1 and ans["tensors"] == len(t), ans


def map_answer(arena, **change):
    """A map answer of version "v": one file "f" of 8 KiB, one tensor "w" of
    its bytes at arena offset 4096, the descriptor of @arena (a path) with it;
    @change replaces top-level members ("files": the file record's members)."""
    f = {"path": "f", "size": 8192, "extents": [[0, 8192, 4096]],
         "tensors": [{"name": "w", "dtype": "U8", "shape": [8192], "off": 0, "len": 8192,
                      "hash": "0" * 32}]}
    f.update(change.pop("files", {}))
    ans = {"ok": True, "version": "v", "digest": "0" * 32, "arena_size": 3 * 4096,
           "page_size": os.sysconf("SC_PAGE_SIZE"), "files": [f]}
    ans.update(change)

    def answer(c, req):
        fd = os.open(arena, os.O_RDONLY)
        try:
            socket.send_fds(c, [(json.dumps(ans) + "\n").encode()], [fd])
        finally:
            os.close(fd)
    return answer


@pytest.mark.parametrize("case", ["arena-beyond-file", "not-a-file", "other-version",
                                  "bad-version", "bad-file-path"])
def test_map_checks_the_daemons_answer(case, fake_daemon, map_dump, tmp_path):
    """libhwfs checks a map answer against the descriptor that came with it
    (a regular file that holds the whole arena) and the names in it: a
    daemon that lies gets a clear error, not a SIGBUS or a path outside."""
    small = tmp_path / "arena"
    small.write_bytes(b"A" * 4096)
    big = tmp_path / "arena-ok"
    big.write_bytes(b"B" * 3 * 4096)
    answer, words = {
        "arena-beyond-file": (map_answer(small, arena_size=1 << 30), "arena"),
        "not-a-file": (map_answer("/dev/zero"), "not a regular file"),
        "other-version": (map_answer(big, version="w"), "version"),
        "bad-version": (map_answer(big, version="../../etc"), "version"),
        "bad-file-path": (map_answer(big, files={"path": "../../etc/passwd"}), "path"),
    }[case]
    cp = sh([map_dump, fake_daemon(answer).dir, "v", "w", tmp_path / "out"], check=False)
    assert cp.returncode == 1, f"map_dump ended {cp.returncode} ({cp.stdout!r} {cp.stderr!r})"
    assert "malformed map answer" in cp.stderr and words in cp.stderr, cp.stderr
    # the same answer from a daemon that tells the truth maps
    cp = sh([map_dump, fake_daemon(map_answer(big)).dir, "v", "w", tmp_path / "out"])
    assert (tmp_path / "out").read_bytes() == b"B" * 8192


def test_watch_drops_events_with_bad_version_names(fake_daemon, tmp_path, procs):
    """An event whose version is no version name (a path, '..', empty, a
    control character) is dropped with an error: `hwfs watch` says so on
    stderr and goes on; no hook ever sees it."""
    bad = ["../../../etc", "..", ".", "", "a/b", "v\x01", "x" * 256]

    def answer(c, req):
        lines = [{"ok": True, "current": None}] + \
                [{"event": "arrived", "version": v} for v in bad] + \
                [{"event": "arrived", "version": "good"}]
        c.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in lines))

    fake = fake_daemon(answer)
    log = tmp_path / "hooks"
    w = WatchProc(fake.dir, "--on-arrive", f'printf "%s\\n" "$HWFS_PATH" >> {log}').start()
    procs.append(w)
    lines = w.wait_line("loaded good")
    assert lines == ["arrived good", "loaded good"], lines
    assert log.read_text() == f"{fake.dir}/versions/good\n"
    assert w.stderr.count("invalid version name") == len(bad), w.stderr
    # a watch whose first answer names an invalid `current` is refused
    fake2 = fake_daemon(lambda c, req: c.sendall(b'{"ok": true, "current": "../x"}\n'))
    cp = sh([HWFS, "watch", "-m", fake2.dir], check=False, timeout=20)
    assert cp.returncode == 1 and "invalid version name" in cp.stderr, cp


# Maps VERSION of MOUNT and prints what hwfs_map() returned and hwfs_errmsg().
MAP_RC_C = r"""
#include <hwfs.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	struct hwfs *h = NULL;
	struct hwfs_map *m = NULL;
	int r = argc == 3 ? hwfs_open(argv[1], &h) : -1;

	if (r == 0)
		r = hwfs_map(h, argv[2], &m);
	printf("%d %s\n", r, hwfs_errmsg());
	hwfs_unmap(m);
	hwfs_close(h);
	return 0;
}
"""


@pytest.fixture(scope="module")
def map_rc(tmp_path_factory):
    """map_rc built against the tree's libhwfs: prints hwfs_map()'s return and sentence."""
    return build_against_libhwfs(tmp_path_factory, "map_rc", MAP_RC_C)


def refusal(**fields):
    """A fake daemon's answer: {"ok": false, ...@fields}."""
    line = json.dumps({"ok": False, **fields}).encode() + b"\n"
    return lambda c, req: c.sendall(line)


# every word the old library guessed an errno from, in one sentence
MISLEADING = ("permission denied: no such version is open, not sealed, damaged, already "
              "registered, exists already; too many control connections")


@pytest.mark.parametrize("errno_", [errno.EROFS, errno.ENOENT, errno.ECANCELED, 4095])
def test_refusal_maps_by_its_errno_not_its_words(errno_, fake_daemon, map_rc):
    """libhwfs returns the errno a refusal carries, whatever words its sentence holds
    (the sentence is still the daemon's)."""
    cp = sh([map_rc, fake_daemon(refusal(error=MISLEADING, errno=errno_)).dir, "v"])
    rc, msg = cp.stdout.rstrip("\n").split(" ", 1)
    assert int(rc) == -errno_ and msg == MISLEADING, cp.stdout


@pytest.mark.parametrize("bad", ["absent", None, "2", 2.0, True, 0, -2, 4096, 1 << 40, [2], {"n": 2}])
def test_refusal_without_a_valid_errno_is_eproto(bad, fake_daemon, map_rc):
    """A refusal with no errno, or one that is not an integer in 1..4095 (an old or a
    hostile daemon), is -EPROTO, even when its words once meant something else."""
    fields = {"error": "permission denied: no such version"}
    if bad != "absent":
        fields["errno"] = bad
    cp = sh([map_rc, fake_daemon(refusal(**fields)).dir, "v"])
    rc, msg = cp.stdout.rstrip("\n").split(" ", 1)
    assert int(rc) == -errno.EPROTO and msg == fields["error"], cp.stdout
    # and with no sentence at all
    cp = sh([map_rc, fake_daemon(refusal()).dir, "v"])
    assert int(cp.stdout.split(" ", 1)[0]) == -errno.EPROTO, cp.stdout
