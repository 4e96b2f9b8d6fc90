"""What the `hwfs` command prints, checked as text (issue 26, a new user's
first day): the progress of `status --cluster` against a daemon whose answer
the test writes (tests/integration/fake_daemon.py), and `--version`.
"""

import json
import re
import subprocess

import pytest

from conftest import HWFS, REPO
from fake_daemon import fake_daemon  # noqa: F401 (a fixture)

MIB = 1 << 20


def cluster_answer(versions):
    """An answer to the `cluster` request: one node holding @versions."""
    def answer(conn, req):
        assert req["op"] == "cluster", req
        cl = {"coordinator": "tcp://127.0.0.1:7100", "committed": None,
              "nodes": [{"name": "n1", "alive": True, "addr": "tcp://127.0.0.1:7200",
                         "versions": versions, "engines": []}]}
        conn.sendall((json.dumps({"ok": True, "cluster": cl}) + "\n").encode())
    return answer


def bar_lines(fake_daemon, versions):
    """`hwfs status --cluster` of a node holding @versions: {name: (bar, percent, rest)}."""
    fd = fake_daemon(cluster_answer(versions))
    cp = subprocess.run([HWFS, "status", "--cluster", "-m", fd.dir], capture_output=True,
                        text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    out = {}
    for line in cp.stdout.splitlines():
        m = re.match(r"^    (\S+)\s+\[([# ]*)\]\s+(\d+)% (.*)$", line)
        if m:
            out[m.group(1)] = (m.group(2), int(m.group(3)), m.group(4))
    assert len(out) == len(versions), cp.stdout
    return out


def test_status_cluster_progress_is_held_over_total(fake_daemon):
    """bytes_held of (bytes_held + bytes_needed): the coordinator's bytes_needed is
    what is still missing, not the version's size.  Before, held / needed: 44 MiB of
    100 drew 77% of the bar, and past 50% the bar ran over its 30 columns."""
    got = bar_lines(fake_daemon, [
        {"name": "v44", "digest": "0" * 32, "complete": False,
         "bytes_held": 44 * MIB, "bytes_needed": 56 * MIB},
        {"name": "v64", "digest": "0" * 32, "complete": False,
         "bytes_held": 64 * MIB, "bytes_needed": 36 * MIB, "waiting": "waiting for space"},
        {"name": "v0", "digest": "0" * 32, "complete": False,
         "bytes_held": 0, "bytes_needed": 10 * MIB},
        {"name": "vdone", "digest": "0" * 32, "complete": True,
         "bytes_held": 10 * MIB, "bytes_needed": 0},
        {"name": "vodd", "digest": "0" * 32, "complete": False,  # a node's bad numbers
         "bytes_held": 10 * MIB, "bytes_needed": -5},
    ])
    for name, (bar, pct, _) in got.items():
        assert len(bar) == 30, (name, bar)
    assert got["v44"][1] == 44 and got["v44"][0].count("#") == 13
    assert got["v44"][2] == "(44.00 MiB of 100.00 MiB) replicating", got["v44"]
    assert got["v64"][1] == 64 and got["v64"][0].count("#") == 19
    assert got["v64"][2].endswith("waiting for space")
    assert got["v0"][1] == 0 and got["v0"][0].count("#") == 0
    assert got["vdone"] == ("#" * 30, 100, "complete")
    assert 0 <= got["vodd"][1] < 100


@pytest.mark.parametrize("prog", ["hwfs", "hwfs-core"])
def test_version(prog):
    """`hwfs --version` and `hwfs-core --version` print the version of the Makefile
    (LIBHWFS_VERSION) and exit 0, with no mount and no daemon."""
    want = re.search(r"^LIBHWFS_VERSION\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    path = HWFS if prog == "hwfs" else str(REPO / "build" / "hwfs-core")
    if prog == "hwfs-core" and HWFS != str(REPO / "build" / "hwfs"):
        path = HWFS + "-core"
    cp = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == f"{prog} {want.group(1)}\n", cp.stdout
