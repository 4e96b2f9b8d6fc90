"""What `make install` ships for operators, and systemd readiness (docs/operations.md).

`make install DESTDIR=TMP` puts mount(8)'s helper in /sbin (a link to the
installed hwfs), the units hwfs@.service and hwfs-coord.service, and the man
pages; both units pass `systemd-analyze verify` (with their programs and man
pages taken from TMP) and a broken copy does not, so the check can fail.
`hwfs mount -f` and `hwfs coord -f` tell systemd READY=1 on $NOTIFY_SOCKET
(Type=notify) only once they serve: the mount answers when READY=1 arrives.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HWFS, REPO, TIMEOUT, is_mounted, sh

UNITS = ("hwfs@.service", "hwfs-coord.service")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    dest = tmp_path_factory.mktemp("destdir")
    sh(["make", "-s", "-C", REPO, "install", f"DESTDIR={dest}", "PREFIX=/usr/local"],
       timeout=600)
    return dest


def test_install_ships_helper_units_and_man_pages(installed):
    d = installed
    assert os.readlink(d / "sbin/mount.hwfs") == "/usr/local/bin/hwfs"
    for u in UNITS:
        text = (d / "lib/systemd/system" / u).read_text()
        assert "@BINDIR@" not in text and "/usr/local/bin/hwfs " in text
        assert re.search(r"^Type=notify$", text, re.M), u
    # the node's daemon is not the OOM killer's first pick (its RSS is the mapped arena,
    # whose tmpfs pages its death would not free); the coordinator keeps the default
    node = (d / "lib/systemd/system/hwfs@.service").read_text()
    assert re.search(r"^OOMScoreAdjust=-500$", node, re.M), node
    assert "OOMScoreAdjust" not in (d / "lib/systemd/system/hwfs-coord.service").read_text()
    for page in ("man1/hwfs.1", "man1/hwfs-engine.1", "man1/hwfs-vllm.1", "man8/mount.hwfs.8"):
        assert (d / "usr/local/share/man" / page).stat().st_size > 0


def test_install_with_a_private_prefix_stays_under_it(tmp_path):
    """PREFIX outside /usr and /usr/local (a test's, a user's): the helper and the units go
    under PREFIX, never into the system's /sbin or /lib/systemd/system."""
    prefix = tmp_path / "prefix"
    before = [os.path.lexists(p) for p in ("/sbin/mount.hwfs", "/lib/systemd/system/hwfs@.service")]
    try:
        sh(["make", "-s", "-C", REPO, "install", f"PREFIX={prefix}"], timeout=600)
        assert os.readlink(prefix / "sbin/mount.hwfs") == f"{prefix}/bin/hwfs"
        unit = (prefix / "lib/systemd/system/hwfs@.service").read_text()
        assert f"ExecStart={prefix}/bin/hwfs mount " in unit
        assert (prefix / "share/man/man8/mount.hwfs.8").exists()
    finally:
        after = [os.path.lexists(p) for p in ("/sbin/mount.hwfs",
                                              "/lib/systemd/system/hwfs@.service")]
        for p, was, now in zip(("/sbin/mount.hwfs", "/lib/systemd/system/hwfs@.service"),
                               before, after):
            if now and not was:  # ours: put the system back before failing
                os.unlink(p)
    assert after == before, "make install PREFIX=... wrote into the system's directories"


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_install_puts_the_python_package_where_python_looks(tmp_path):
    """The Python package goes where the target Python (PYTHON=) imports from for PREFIX,
    and make install says where: a venv as PREFIX gets it in its site-packages (importable
    with no PYTHONPATH); Debian's python3 with PREFIX=/usr/local (staged with DESTDIR) in
    /usr/local/lib/python3.X/dist-packages, on its path; a directory the Python does not
    look in is named in a note. Before: PREFIX/lib/python3/dist-packages for every Python."""
    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    cp = sh(["make", "-s", "-C", REPO, "install", f"PREFIX={venv}", f"PYTHON={py}"],
            timeout=600, env=_clean_env())
    m = re.search(r"^installed the Python package in (\S+)$", cp.stdout, re.M)
    assert m, cp.stdout
    assert "does not look in" not in cp.stderr, cp.stderr
    where = sh([py, "-c", "import importlib.util as u; print(u.find_spec('hwfs').origin)"],
               cwd=tmp_path, env=_clean_env()).stdout.strip()
    assert where == os.path.join(m.group(1), "__init__.py"), (where, m.group(1))
    assert Path(m.group(1)).parent.name == "site-packages"

    deb = "/usr/bin/python3"
    if not os.path.exists(deb):
        return
    dest = tmp_path / "dest"
    cp = sh(["make", "-s", "-C", REPO, "install", f"DESTDIR={dest}", "PREFIX=/usr/local",
             f"PYTHON={deb}"], timeout=600, env=_clean_env())
    site = sh([deb, "-c", "import sys; print([p for p in sys.path if p.startswith("
                          "'/usr/local/lib/') and p.endswith('-packages')][0])"],
              env=_clean_env()).stdout.strip()
    assert (dest / site.lstrip("/") / "hwfs" / "_libdir.py").exists(), cp.stdout
    assert f"installed the Python package in {dest}{site}/hwfs" in cp.stdout
    assert not (dest / "usr/local/lib/python3/dist-packages").exists()
    # a Python that does not look under PREFIX: installed where it would, and a note
    cp = sh(["make", "-s", "-C", REPO, "install", f"DESTDIR={dest}", f"PREFIX={tmp_path}/opt",
             f"PYTHON={deb}"], timeout=600, env=_clean_env())
    assert re.search(rf"installed the Python package in {dest}{tmp_path}/opt/lib/python3\.\d+/"
                     r"site-packages/hwfs", cp.stdout), cp.stdout
    assert "does not look in" in cp.stderr and "pip install ./tools/python" in cp.stderr, cp.stderr


def test_make_demo_builds_the_programs_quietly(tmp_path):
    """`make demo` builds what the demo runs (hwfs, hwfs-core, mount.hwfs, hwfs-engine,
    libhwfs) with a silent sub-make, not `make all` with every compiler line and the unit
    tests (make -n into an empty BUILD: what it would run, nothing built)."""
    cp = sh(["make", "-n", "-C", REPO, "demo", f"BUILD={tmp_path}/b"], timeout=120)
    lines = cp.stdout.splitlines()
    assert any(ln.startswith("make -s ") and ln.endswith(" progs") for ln in lines), cp.stdout
    assert any(ln.strip() == "tools/demo.sh" for ln in lines), cp.stdout
    built = [ln.split(" -o ")[1].split()[0] for ln in lines if " -o " in ln]
    for prog in ("hwfs", "hwfs-core", "hwfs-engine", "libhwfs.so.1.0.0"):
        assert f"{tmp_path}/b/{prog}" in built, built
    assert not [b for b in built if "/tests/" in b or "bench" in b], built


def test_man_page_names_every_verb(installed):
    page = (installed / "usr/local/share/man/man1/hwfs.1").read_text()
    verbs = re.findall(r'^\s*\{"([a-z]+)", cmd_', (REPO / "tools/cli/hwfs.c").read_text(), re.M)
    assert len(verbs) > 10
    for v in verbs:
        if v == "unmount":  # an alias, named under umount
            assert "unmount" in page
            continue
        assert re.search(rf"^\.B {v}\b", page, re.M), f"hwfs.1 does not describe `hwfs {v}`"


def verify(units, installed):
    """systemd-analyze verify @units (paths), programs and man pages from the DESTDIR."""
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze not found (Debian package systemd; tools/install/install-deps.sh)"
    env = dict(os.environ, MANPATH=str(installed / "usr/local/share/man"))
    return subprocess.run([tool, "verify", *map(str, units)], capture_output=True, text=True,
                          env=env, timeout=TIMEOUT)


def unit_copies(installed, tmp_path, mangle=lambda s: s):
    """The installed units with /usr/local/bin pointed into the DESTDIR (a template instantiated)."""
    out = []
    for u in UNITS:
        text = (installed / "lib/systemd/system" / u).read_text()
        text = mangle(text.replace("/usr/local/bin/", f"{installed}/usr/local/bin/"))
        p = tmp_path / u.replace("@.", "@n1.")
        p.write_text(text)
        out.append(p)
    return out


def test_units_pass_systemd_analyze_verify(installed, tmp_path):
    cp = verify(unit_copies(installed, tmp_path), installed)
    assert cp.returncode == 0 and not cp.stdout.strip() and not cp.stderr.strip(), \
        cp.stdout + cp.stderr
    # the check can fail: a typo in a unit is reported
    bad = tmp_path / "bad"
    bad.mkdir()
    cp = verify(unit_copies(installed, bad, lambda s: s.replace("Type=notify", "Type=notfy")),
                installed)
    assert "notfy" in cp.stdout + cp.stderr, cp.stdout + cp.stderr


class NotifySocket:
    """A $NOTIFY_SOCKET of our own: what systemd would receive."""

    def __init__(self, path):
        self.path = str(path)
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(self.path)
        self.s.settimeout(0.2)

    def wait_for(self, what, timeout=20, proc=None):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = self.s.recv(4096).decode()
            except socket.timeout:
                if proc is not None and proc.poll() is not None:
                    raise AssertionError(f"exited ({proc.returncode}) before {what}")
                continue
            if what in msg.split("\n"):
                return msg
        raise AssertionError(f"no {what} within {timeout} s")

    def close(self):
        self.s.close()


def test_mount_foreground_notifies_ready_once_it_answers(tmp_path):
    mnt, store = tmp_path / "mnt", Path("/dev/shm") / f"hwfs-test-notify-{os.getpid()}"
    mnt.mkdir()
    ns = NotifySocket(tmp_path / "notify")
    p = subprocess.Popen([HWFS, "mount", mnt, "--store", store, "--capacity", "64M", "-f"],
                         env=dict(os.environ, NOTIFY_SOCKET=ns.path), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        msg = ns.wait_for("READY=1", proc=p)
        assert int(os.getxattr(mnt, "user.hwfs.pid")) == p.pid, msg  # it answers already
        sh([HWFS, "umount", mnt])
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        ns.close()
        shutil.rmtree(store, ignore_errors=True)


def test_coordinator_foreground_notifies_ready(tmp_path):
    ns = NotifySocket(tmp_path / "notify")
    p = subprocess.Popen([HWFS, "coord", "-f", "--listen", "tcp://127.0.0.1:0", "--insecure",
                          "--state", tmp_path / "st"], env=dict(os.environ, NOTIFY_SOCKET=ns.path),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ns.wait_for("READY=1", proc=p)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert "coord: listening on tcp://127.0.0.1:" in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ns.close()
