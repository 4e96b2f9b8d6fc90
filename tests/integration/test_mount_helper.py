"""`mount -t hwfs` and fstab through mount(8)'s helper, build/mount.hwfs (docs/operations.md).

mount(8) looks for its helper only in /sbin (and /sbin/fs.d, /sbin/fs), so the
fixture links /sbin/mount.hwfs to the mount.hwfs beside the hwfs under test
(build/, or the sanitizer build of $HWFS_BIN) for the test and removes the
link afterwards; an /sbin/mount.hwfs that is not such a link (an installed
one) is left alone and the tests are skipped, saying so.  Each test checks
that the mount answers as soon as mount(8) returns, that the options reached
the daemon (capacity in its status; the read_ahead_kb tunable in the mount's
bdi, /sys/class/bdi/MAJOR:MINOR/read_ahead_kb of its st_dev, which the daemon
sets before the mount is reported up), and that a plain `umount` stops the
daemon cleanly.
"""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import HWFS, TIMEOUT, is_mounted, pid_alive, scaled, sh, wait_dead
from http_helpers import get

SBIN_HELPER = "/sbin/mount.hwfs"
READ_AHEAD_DEFAULT_KB = 8192  # the read_ahead_kb tunable's default (fs/common/tunables.h)


@pytest.fixture
def helper():
    ours = os.path.join(os.path.dirname(HWFS), "mount.hwfs")
    assert os.path.exists(ours), f"{ours} not built (make)"
    made = False
    if os.path.islink(SBIN_HELPER) or os.path.exists(SBIN_HELPER):
        if not (os.path.islink(SBIN_HELPER) and os.readlink(SBIN_HELPER) == ours):
            pytest.skip(f"{SBIN_HELPER} exists and is not a test link (installed?); not replaced")
    else:
        os.symlink(ours, SBIN_HELPER)
        made = True
    try:
        yield ours
    finally:
        if made:
            os.unlink(SBIN_HELPER)


class Place:
    """A store dir and a mount point, unmounted (umount, else fusermount3 -u -z) after the test."""

    def __init__(self, tmp_path):
        self.store = Path("/dev/shm") / f"hwfs-test-helper-{os.getpid()}-{tmp_path.name}"
        self.mnt = tmp_path / "mnt"
        self.mnt.mkdir()
        self.pid = None

    def cleanup(self):
        if is_mounted(self.mnt):
            subprocess.run(["umount", self.mnt], capture_output=True, timeout=TIMEOUT)
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True,
                           timeout=TIMEOUT)
        if self.pid and pid_alive(self.pid):
            os.kill(self.pid, 9)
            wait_dead(self.pid)
        subprocess.run(["rm", "-rf", self.store])

    def log(self):
        try:
            return (self.store / "hwfs.log").read_text(errors="replace")
        except OSError:
            return ""


@pytest.fixture
def place(tmp_path):
    p = Place(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()


def read_ahead_kb(mnt):
    """The read-ahead of the mount at @mnt: read_ahead_kb of the bdi of its st_dev."""
    dev = os.stat(mnt).st_dev
    with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb") as f:
        return int(f.read())


def check_mounted_then_umount(p, capacity, read_ahead):
    """The mount answers at once, has the options asked for (capacity, read-ahead in KiB);
    umount stops the daemon cleanly."""
    pid = int(os.getxattr(p.mnt, "user.hwfs.pid"))  # answers: no retry
    p.pid = pid
    st = __import__("json").loads(sh([HWFS, "status", "--json", "-m", p.mnt]).stdout)
    assert st["store"]["capacity_bytes"] == capacity
    assert read_ahead_kb(p.mnt) == read_ahead, \
        f"the mount's read_ahead_kb is {read_ahead_kb(p.mnt)}, not {read_ahead}\n{p.log()}"
    assert get(st["http"], "/readyz") == (200, "ready\n")
    cp = sh(["umount", p.mnt], check=False)
    assert cp.returncode == 0, cp.stderr
    assert wait_dead(pid, scaled(20)), "the daemon did not exit after umount"
    assert not is_mounted(p.mnt)
    log = p.log()
    assert "unmounted " in log and "error" not in log, log


def test_mount_t_hwfs_maps_options_and_umount_stops_the_daemon(helper, place):
    cp = sh(["mount", "-t", "hwfs", place.store, place.mnt, "-o",
             "capacity=64M,http=127.0.0.1:0,_netdev,nofail,defaults,rw,x-systemd.after=x.service,"
             "read_ahead_kb=1024"], check=False)
    assert cp.returncode == 0, cp.stderr
    assert is_mounted(place.mnt)
    check_mounted_then_umount(place, 64 << 20, 1024)


def test_fstab_line(helper, place, tmp_path):
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# a test fstab\n{place.store} {place.mnt} hwfs "
                     "capacity=32M,http=127.0.0.1:0,_netdev,nofail,noauto 0 0\n")
    cp = sh(["mount", "-T", fstab, place.mnt], check=False)
    assert cp.returncode == 0, cp.stderr
    check_mounted_then_umount(place, 32 << 20, READ_AHEAD_DEFAULT_KB)


@pytest.mark.parametrize("opts, says", [
    ("bogus=1", "mount.hwfs: unknown option bogus=1"),
    ("capacity", "mount.hwfs: option capacity needs a value"),
    ("pin=yes", "mount.hwfs: option pin takes no value"),
    ("ro", "mount.hwfs: ro is not supported"),
    ("http=nowhere", "--http nowhere: not HOST:PORT"),
    ("join=tcp://127.0.0.1:1", "--join needs --node NAME"),
])
def test_bad_options_fail_with_one_line_and_mount_nothing(helper, place, opts, says):
    cp = sh(["mount", "-t", "hwfs", place.store, place.mnt, "-o", opts], check=False)
    assert cp.returncode != 0
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], cp.stderr
    assert not is_mounted(place.mnt)


def test_fake_mount_does_nothing(helper, place):
    cp = sh(["mount", "-f", "-t", "hwfs", place.store, place.mnt, "-o", "capacity=64M"],
            check=False)
    assert cp.returncode == 0, cp.stderr
    assert not is_mounted(place.mnt)


def test_mount_a_twice_is_a_no_op(helper, place, tmp_path):
    """`mount -a` run again with the mount in place: mount(8) does not see that it is
    (mountinfo's source is hwfs:STORE, fstab's STORE) and runs the helper again, which
    then exits 0 with a note instead of failing (was: exit 32, "already an hwfs mount").
    Another store on that mount point still fails, naming both."""
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{place.store} {place.mnt} hwfs capacity=32M,_netdev,nofail 0 0\n")
    cp = sh(["mount", "-a", "-T", fstab], check=False)
    assert cp.returncode == 0, cp.stderr
    pid = int(os.getxattr(place.mnt, "user.hwfs.pid"))
    place.pid = pid
    cp = sh(["mount", "-a", "-T", fstab], check=False)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"already mounted from {os.path.realpath(place.store)}" in cp.stdout + cp.stderr, \
        cp.stdout + cp.stderr
    assert int(os.getxattr(place.mnt, "user.hwfs.pid")) == pid  # the same daemon, one mount
    assert sum(1 for ln in open("/proc/self/mountinfo") if f" {place.mnt} " in ln) == 1
    other = Path(str(place.store) + "-other")
    try:
        cp = sh(["mount", "-t", "hwfs", other, place.mnt, "-o", "capacity=32M"], check=False)
        assert cp.returncode != 0
        assert "already an hwfs mount" in cp.stderr and str(place.store) in cp.stderr, cp.stderr
    finally:
        subprocess.run(["rm", "-rf", other])
    cp = sh(["umount", place.mnt], check=False)
    assert cp.returncode == 0, cp.stderr
    assert wait_dead(pid, scaled(20))


def sanitizer_report(text):
    """The first line of an ASan/UBSan report in @text, or None."""
    return next((ln for ln in text.splitlines()
                 if "AddressSanitizer" in ln or "runtime error:" in ln), None)


def test_many_options_stay_within_the_argument_array(place):
    """mount.hwfs turns each option into at most two `hwfs mount` arguments:
    a tunable then 125 flag options used to write one pointer past its fixed
    array of 256 (ASan: stack-buffer-overflow), whatever the length of the
    line now fits; several -o are joined as mount(8) joins its own.  Run with
    HWFS_BIN=build-asan/hwfs to have ASan watch it."""
    ours = os.path.join(os.path.dirname(HWFS), "mount.hwfs")
    for n in (124, 125, 126, 400):
        opts = ",".join(["read_ahead_kb=1024"] + ["join=tcp://127.0.0.1:1"] * n)
        cp = sh([ours, "-f", place.store, place.mnt, "-o", opts], check=False)
        assert cp.returncode == 0 and not sanitizer_report(cp.stderr), (n, cp.stderr[-3000:])
    assert not is_mounted(place.mnt)
    # a real mount of 300 options given as 300 -o: every one reached the daemon
    args = [ours, place.store, place.mnt]
    for _ in range(150):
        args += ["-o", "capacity=64M", "-o", "nofail"]
    cp = sh(args + ["-o", "http=127.0.0.1:0", "-o", "read_ahead_kb=1024"], check=False)
    assert cp.returncode == 0 and not sanitizer_report(cp.stderr), cp.stderr[-3000:]
    check_mounted_then_umount(place, 64 << 20, 1024)


def test_more_tunables_than_hwfs_mount_takes_are_refused(place):
    """`hwfs mount -o` takes at most 64 tunables; more are refused in one line
    (they used to be dropped silently, the mount going on without them)."""
    opts = ",".join(["read_ahead_kb=1024"] * 65)
    cp = sh([HWFS, "mount", place.mnt, "--store", place.store, "-o", opts], check=False)
    if cp.returncode == 0:
        place.pid = int(os.getxattr(place.mnt, "user.hwfs.pid"))
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert cp.returncode == 1 and len(lines) == 1 and "too many -o tunables" in lines[0], cp.stderr
    assert not is_mounted(place.mnt)
