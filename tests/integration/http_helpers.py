"""Helpers for the tests of the HTTP endpoint (--http; docs/operations.md).

``get(addr, path)`` fetches a page with the standard library (status, body);
``samples(text)`` parses Prometheus text format into {(name, labels): value}
independently of the daemon's writer; ``promtool_check(text)`` runs Debian's
``promtool check metrics`` on it (the package `prometheus`, installed by
tools/install/install-deps.sh) and fails the test with promtool's complaint;
``standalone_coord(tmp_path, *extra)`` runs `hwfs coord --http` for a test.
"""

import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from conftest import HWFS, poll, scaled, sh, wait_dead

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def get(addr, path, timeout=10):
    """GET http://@addr@path: (status, body text); a refused or failed connection raises."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text):
    """{(name, frozenset of (label, value)): float} of a text exposition (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset((k, bytes(v, "utf-8").decode("unicode_escape"))
                           for k, v in LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(s, name, **labels):
    """The value of sample @name{@labels} in samples() @s; fails when it is absent."""
    key = (name, frozenset(labels.items()))
    assert key in s, f"no sample {name}{labels}; have {sorted(k[0] for k in s)[:20]}..."
    return s[key]


def commit_seen_updating(m, addr, e, version):
    """Commit @version on mount @m while engine connection @e holds it in the barrier:
    meanwhile @addr's /readyz says "ready: updating" and hwfs_updating is 1; then @e
    reports it loaded and the commit must succeed."""
    from conftest import poll
    from engine_proto import commit_async, finish

    p = commit_async(m, version)
    assert poll(lambda: get(addr, "/readyz") == (200, "ready: updating\n"), timeout=10)
    assert value(samples(get(addr, "/metrics")[1]), "hwfs_updating") == 1
    e.send({"report": "loaded", "version": version})
    rc, out = finish(p)
    assert rc == 0, out


def promtool_check(text):
    """`promtool check metrics` on @text; fails the test with its output when it complains."""
    tool = shutil.which("promtool")
    assert tool, "promtool not found (Debian package prometheus; tools/install/install-deps.sh)"
    cp = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True,
                        timeout=60)
    if cp.returncode != 0 or cp.stdout.strip() or cp.stderr.strip():
        pytest.fail(f"promtool check metrics (exit {cp.returncode}):\n{cp.stdout}{cp.stderr}")


@contextmanager
def standalone_coord(tmp_path, *extra):
    """A stand-alone `hwfs coord --http 127.0.0.1:0 EXTRA` in the background: (its http
    address, its state dir), once /api/status answers; stopped (SIGTERM, checked) after."""
    state = tmp_path / "coord"
    cp = sh([HWFS, "coord", "--listen", "tcp://127.0.0.1:0", "--insecure", "--state", state,
             "--http", "127.0.0.1:0", *extra])
    pid = int(cp.stdout.split()[0])
    try:
        log = state / "coord.log"
        m = poll(lambda: re.search(r"coord: http on (\S+) ", log.read_text()), timeout=10)
        assert m, log.read_text()
        assert poll(lambda: get(m.group(1), "/api/status")[0] == 200, timeout=10)
        yield m.group(1), state
    finally:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
        assert wait_dead(pid, scaled(10)), "coordinator survived SIGTERM"
