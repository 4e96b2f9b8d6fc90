"""What a CLI command loads (issue 20, commit latency).

`hwfs commit` is on the path of every commit, so its start-up counts.  When
build/hwfs was the daemon and the CLI in one program, every command loaded
FUSE, sqlite, ZeroMQ, libmicrohttpd (the --http server), libsystemd
(sd_notify) and some thirty libraries behind them and ran their constructors
(4.8 ms of CPU per command on the development VM).  Now build/hwfs is the
client verbs with libhwfs only (0.65 ms) and runs build/hwfs-core for the
daemon's verbs (tools/cli/hwfs_cli.h); the daemon loads libmicrohttpd with dlopen
when a server starts (fs/common/http.c; test_http checks it serves) and sends
systemd's notification without libsystemd (fs/common/sdnotify.c;
test_ops_install checks READY=1 arrives).  Since issue 29 it carries jansson
and xxhash from their static archives where they are installed, so libc may be
all it loads (the Makefile's CLI_LIBS).  No timing here: what is loaded is
checked, with the dynamic loader's own trace (LD_DEBUG=libs).
"""

import os
import subprocess

from conftest import HWFS

HEAVY = ("libmicrohttpd", "libgnutls", "libsystemd", "libzmq", "libsqlite3", "libfuse3")


def loaded_libs(args, env=None):
    """The shared libraries the dynamic loader opens for `hwfs ARGS` (LD_DEBUG=libs)."""
    cp = subprocess.run([HWFS, *args], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, LD_DEBUG="libs", **(env or {})))
    return [os.path.basename(line.split("trying file=", 1)[1].strip()) for line in cp.stderr.splitlines()
            if "trying file=" in line]


def test_client_verb_loads_only_the_client_libraries(mount):
    """`hwfs status` (a client verb, as commit) opens none of the daemon's libraries (HEAVY)."""
    libs = loaded_libs(["status", "-m", str(mount.mnt)])
    assert any(x.startswith("libc.so") for x in libs), f"the loader trace did not list what it loaded: {libs}"
    heavy = [x for x in libs if x.startswith(HEAVY)]
    assert not heavy, f"hwfs status loaded {heavy}"


def test_daemon_verbs_run_the_core_program(mount):
    """The mount made through build/hwfs is served by build/hwfs-core (the same pid `hwfs mount` reported)."""
    exe = os.readlink(f"/proc/{mount.pid}/exe")
    assert os.path.basename(exe) == "hwfs-core", f"the daemon of {mount.mnt} runs {exe}"
    assert os.path.dirname(exe) == os.path.dirname(os.path.realpath(HWFS)), (exe, HWFS)
