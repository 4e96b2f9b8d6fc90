"""What a CLI command loads (issue 20, commit latency).

build/hwfs is the daemon and the CLI in one program.  `hwfs commit` is on the
path of every commit, so its start-up counts: linked with libmicrohttpd (the
--http server) and libsystemd (sd_notify), every command loaded GnuTLS and
some fifteen libraries behind them and ran their constructors (2.0 -> 5.0 ms
of CPU per command on the development VM).  libmicrohttpd is now loaded with
dlopen when a server starts (fs/common/http.c), and the systemd notification
is sent without libsystemd (fs/common/sdnotify.c; test_ops_install checks
READY=1 arrives; test_http that the --http server serves).  No timing here: what is loaded is checked, with the
dynamic loader's own trace (LD_DEBUG=libs).
"""

import os
import subprocess

from conftest import HWFS

HEAVY = ("libmicrohttpd", "libgnutls", "libsystemd")


def loaded_libs(args, env=None):
    """The shared libraries the dynamic loader opens for `hwfs ARGS` (LD_DEBUG=libs)."""
    cp = subprocess.run([HWFS, *args], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, LD_DEBUG="libs", **(env or {})))
    return [os.path.basename(line.split("trying file=", 1)[1].strip()) for line in cp.stderr.splitlines()
            if "trying file=" in line]


def test_cli_command_loads_no_http_or_systemd_library(mount):
    """`hwfs status` (any verb: the same program starts) opens none of libmicrohttpd, GnuTLS, libsystemd."""
    libs = loaded_libs(["status", "-m", str(mount.mnt)])
    assert any("libjansson" in x for x in libs), f"the loader trace did not list what it loaded: {libs}"
    heavy = [x for x in libs if x.startswith(HEAVY)]
    assert not heavy, f"hwfs status loaded {heavy}"
