"""The coordinator's status page and /api/status, in a real headless browser (docs/operations.md).

A coordinator and two nodes with --http; A publishes, B receives, B commits.
/api/status is the JSON of `hwfs status --cluster --json` (the same nodes,
versions and committed version, with the history the page draws); the page
at / loads nothing from elsewhere (no src/href to another origin, no
url()); Debian's chromium (--headless --dump-dom, tools/install/install-deps.sh) runs
its script against the live coordinator and the DOM it builds shows both
nodes up, the committed version, the commit with its outcome and per-node
READY times, a convergence bar for v1 and a wire-bytes line per node; once B
is killed the page shows it down.  A screenshot is taken (docs/img holds one).

Runs once in `make test` (the plain pass): Makefile ONCE_TESTS.
"""

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

from http_helpers import get
from .conftest import poll, random_model

HTTP_ANY = ["--http", "127.0.0.1:0"]


def chromium(*args, timeout=60):
    tool = shutil.which("chromium")
    assert tool, "chromium not found (Debian package chromium; tools/install/install-deps.sh)"
    cp = subprocess.run([tool, "--headless", "--no-sandbox", "--disable-gpu",
                         "--virtual-time-budget=5000", *args], capture_output=True,
                        text=True, timeout=timeout)
    assert cp.returncode == 0, cp.stderr[-2000:]
    return cp.stdout


class Assets(HTMLParser):
    """Every src/href and CSS url() of a page."""

    def __init__(self):
        super().__init__()
        self.refs = []

    def handle_starttag(self, tag, attrs):
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "link":
            self.refs.append(f"<link {attrs}>")


def test_status_page_in_chromium(net, tmp_path):
    c = net.start_coord(extra=HTTP_ANY)
    a = net.add("A")
    b = net.add("B")
    m = poll(lambda: re.search(r"coord: http on (\S+) ", Path(c.logpath).read_text()), timeout=10)
    assert m, c.log_tail()
    addr = m.group(1)
    src = random_model(tmp_path / "m", 3 << 20, seed=2211)
    digest = net.publish("A", src, "v1")
    net.wait_version("v1", digest, nodes=[b])
    b.run("commit", "v1")

    # /api/status: what hwfs status --cluster --json prints (the same keys), the same nodes
    # and versions, and the history the page draws
    want = json.loads(b.run("status", "--cluster", "--json").stdout)

    rx = int(b.status()["replication"]["wire_bytes_received"])
    tx = int(a.status()["replication"]["wire_bytes_sent"])
    assert rx == tx >= 3 << 20

    def api():  # the commit recorded, and the wire bytes of the next heartbeats (1 s)
        code, body = get(addr, "/api/status")
        st = json.loads(body) if code == 200 else {}
        wire = {n["name"]: (n["wire_bytes_received"], n["wire_bytes_sent"])
                for n in st.get("nodes", [])}
        return st if st.get("commits") and wire == {"A": (0, tx), "B": (rx, 0)} else None

    st = poll(api, timeout=10)
    assert st, get(addr, "/api/status")
    assert sorted(st) == sorted(want), (sorted(st), sorted(want))
    assert st["committed"] == want["committed"] == "v1"
    assert st["coordinator"] == want["coordinator"] == c.url
    for got_n, want_n in zip(sorted(st["nodes"], key=lambda n: n["name"]),
                             sorted(want["nodes"], key=lambda n: n["name"])):
        assert (got_n["name"], got_n["alive"], got_n["addr"]) == \
            (want_n["name"], want_n["alive"], want_n["addr"])
        assert [(v["name"], v["digest"], v["complete"]) for v in got_n["versions"]] == \
            [(v["name"], v["digest"], v["complete"]) for v in want_n["versions"]]
    (commit,) = st["commits"]
    assert commit["version"] == "v1" and commit["outcome"] == "committed"
    assert sorted(commit["ready_s"]) == ["A", "B"]
    (ver,) = st["recent_versions"]
    assert ver["name"] == "v1" and ver["origin"] == "A" and ver["converge_s"] >= 0

    # the page: self-contained
    code, page = get(addr, "/")
    assert code == 200 and page.startswith("<!DOCTYPE html>")
    parser = Assets()
    parser.feed(page)
    assert parser.refs == [], f"the page loads other resources: {parser.refs}"
    assert "url(" not in page and "@import" not in page
    others = set(re.findall(r"\b(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s\"']*", page))
    assert others == {"http://www.w3.org/2000/svg"}, others  # the SVG namespace name only

    # in a browser: the script fills the page from /api/status
    dom = chromium("--dump-dom", f"http://{addr}/")
    assert "committed: v1" in dom, dom[:3000]
    assert "2 of 2 node(s) up" in dom, dom[:3000]
    assert len(re.findall(r'<span class="up">up</span>', dom)) == 2, dom[:3000]
    # each node's current, none diverging after the commit (test_cluster_current: one that does)
    assert len(re.findall(r'<span class="current">v1</span>', dom)) == 2, dom[:3000]
    nodes_table = re.search(r'<table id="nodes">.*?</table>', dom, re.S).group(0)
    assert "diverged" not in nodes_table, nodes_table
    assert re.search(r'<td>v1</td><td><span class="ok">committed</span></td>', dom), dom
    assert re.search(r"A \d+ ms, B \d+ ms", dom), dom
    assert len(re.findall(r'class="converge-bar"', dom)) == 1, dom
    assert len(re.findall(r'class="wire-line"', dom)) == 2, dom
    assert '<div id="error"></div>' in dom  # no fetch failed
    shot = tmp_path / "status.png"
    chromium("--window-size=1200,800", f"--screenshot={shot}", f"http://{addr}/")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10000

    # a node that dies is shown down
    b.kill9_daemon()
    assert poll(lambda: "1 of 2 node(s) up" in chromium("--dump-dom", f"http://{addr}/"),
                timeout=30), chromium("--dump-dom", f"http://{addr}/")[:3000]
    dom = chromium("--dump-dom", f"http://{addr}/")
    assert re.search(r'<td>B</td><td><span class="down">down</span></td>', dom), dom[:3000]
