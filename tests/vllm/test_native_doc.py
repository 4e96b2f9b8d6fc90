"""The commands of docs/engines.md's sections on vLLM's native weight-transfer
API, run as written: only the doc's mount (/hotweights) and port (8000) are
replaced by the test's, `python` and `hwfs-vllm` are the vLLM venv's (the
package installed there, no PYTHONPATH), `hwfs` the built program.

In order, on one server started by the doc's launch block:

1. "vLLM's native weight-transfer API": the launch block starts a server on
   /hotweights/current (v1 committed), with the load format and the backend;
   it answers under its --served-model-name, /weight_info says v1 and
   `hwfs status` shows the engine of the block's HWFS_ENGINE serving v1;
2. "The trainer side": the python block (a transformers model from
   /hotweights/current, WeightTransferTrainerFactory with vLLM's own HTTP
   client, a publish of step-42 then send_weights("step-42"), then
   send_weights(model)): the server ends on the next number of the mount's
   step- names, step-000043;
3. "Commit-driven": with v4 published, the block's `hwfs commit v4` and
   `hwfs status` print the engine serving v4, and /weight_info says v4;
4. "hwfs-vllm" (the thin driver): the block's `hwfs-vllm` beside the server
   drives it through the native routes ("requests held" in its log, not the
   /collective_rpc driver) at the commit of v5; it exits 0 on SIGTERM.

The other sections' blocks are run by test_vllm.py (the fallback recipe),
test_trl.py (TRL) and tests/verl (verl).  Tokens are not compared here (the
doc's launch line lets vLLM pick the dtype); test_native.py does that.
"""

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hwfs_integration_conftest import HWFS, poll, scaled
from test_vllm import (START_TIMEOUT, VENV, VPY, Assets, Proc, drop_mount, env, free_port,
                       new_mount, perturb, the_block)

NATIVE = "vLLM's native weight-transfer API"


def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


class Doc:
    """The doc's blocks and what they run on: a mount, a port, a PATH."""

    def __init__(self, top):
        self.top = Path(top)
        self.launch = the_block(NATIVE, "sh", "--load-format hwfs")
        self.trainer = the_block("The trainer side", "python", "send_weights")
        self.commit = the_block("Commit-driven", "sh", "hwfs commit")
        self.driver = the_block("hwfs-vllm: vLLM with", "sh", "hwfs-vllm --server")
        self.engine = re.search(r"HWFS_ENGINE=(\S+)", self.launch).group(1)
        self.model = re.search(r"--served-model-name (\S+)", self.launch).group(1)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mount = None
        self.procs = []
        self.env = env()
        del self.env["VLLM_SERVER_DEV_MODE"], self.env["PYTHONPATH"]  # the doc sets the first
        self.env["PATH"] = os.pathsep.join([str(VENV / "bin"), str(Path(HWFS).resolve().parent),
                                            os.environ.get("PATH", "/usr/bin:/bin")])

    def here(self, text):
        """@text with the doc's mount and port replaced by this test's."""
        assert "/hotweights" in text, text
        return re.sub(r"\b8000\b", str(self.port), text.replace("/hotweights", self.mount.mnt))

    def sh(self, text, name):
        """A block run to its end under /bin/sh: its output; exit 0 or the test fails."""
        cp = subprocess.run(["/bin/sh", "-c", self.here(text)], env=self.env, cwd=self.top,
                            capture_output=True, text=True, timeout=scaled(300))
        assert cp.returncode == 0, f"{name} block: exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
        return cp.stdout

    def background(self, text, name):
        p = Proc(["/bin/sh", "-c", self.here(text)], self.top / f"{name}.log", self.env)
        self.procs.append(p)
        return p

    def engine_record(self):
        return next((e for e in self.mount.status().get("engines", [])
                     if e["name"] == self.engine), None)

    def weight_version(self):
        return get(self.url + "/weight_info")["weight_version"]

    def wait_up(self, server):
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if not server.alive():
                pytest.fail(f"the doc's launch block exited ({server.p.returncode}):\n"
                            f"{server.tail(60)}")
            try:
                get(self.url + "/health", timeout=2)
                return
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.5)
        pytest.fail(f"vLLM not up within {START_TIMEOUT} s:\n{server.tail(60)}")

    def close(self):
        for p in reversed(self.procs):
            if p.alive():
                p.kill()
        if self.mount is not None:
            drop_mount(self.mount)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps` (tools/install/install-vllm.sh)", pytrace=False)
    top = tmp_path_factory.mktemp("native-doc")
    d = Doc(top)
    try:
        d.a = Assets(top)
        d.mount = new_mount()
        d.a.publish(d.mount, "v1", stage=d.a.dirs["v1"])
        d.mount.run("commit", "v1")
        d.server = d.background(d.launch, "server")
        d.wait_up(d.server)
        yield d
    finally:
        d.close()


@pytest.mark.limit(120)
def test_the_launch_block_serves_current_through_the_backend(doc):
    e = poll(lambda: (doc.engine_record() or {}).get("serving") == "v1" and doc.engine_record(),
             timeout=scaled(60), interval=0.2)
    assert e, f"engine {doc.engine_record()}\n{doc.server.tail(30)}"
    assert doc.weight_version() == "v1"
    out = subprocess.run([HWFS, "status", "-m", doc.mount.mnt], capture_output=True, text=True,
                         timeout=scaled(30)).stdout
    assert f"engine:  {doc.engine} (pid " in out and "serving v1" in out, out
    models = [m["id"] for m in get(doc.url + "/v1/models")["data"]]
    assert models == [doc.model], models
    body = json.dumps({"model": doc.model, "prompt": "Hello", "max_tokens": 4,
                       "temperature": 0}).encode()
    req = urllib.request.Request(doc.url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["choices"][0]["text"] is not None


@pytest.mark.limit(300)
def test_the_trainer_block_publishes_and_serves(doc):
    script = doc.top / "trainer.py"
    script.write_text(doc.here(doc.trainer))
    cp = subprocess.run(["python", script], env=doc.env, cwd=doc.top, capture_output=True,
                        text=True, timeout=scaled(240))
    assert cp.returncode == 0, f"the trainer block: exit {cp.returncode}\n{cp.stderr[-4000:]}"
    names = {v.name for v in os.scandir(doc.mount.vpath(""))}
    assert {"step-42", "step-000043"} <= names, names
    assert doc.weight_version() == "step-000043"
    e = poll(lambda: (doc.engine_record() or {}).get("serving") == "step-000043",
             timeout=scaled(30), interval=0.2)
    assert e, f"engine {doc.engine_record()}"


@pytest.mark.limit(300)
def test_the_commit_block_moves_the_server(doc):
    doc.a.publish(doc.mount, "v4", model=perturb(doc.a.v2, 4))
    out = doc.sh(doc.commit, "commit-driven")
    assert re.search(rf"engine:  {re.escape(doc.engine)} \(pid \d+\): serving v4; last swap "
                     rf"paused \d+ us", out), out
    assert doc.weight_version() == "v4"
    assert os.readlink(os.path.join(doc.mount.mnt, "current")).endswith("v4")


@pytest.mark.limit(300)
def test_the_thin_driver_block_swaps_through_the_routes(doc):
    cli = doc.background(doc.driver, "hwfs-vllm")
    registered = poll(lambda: 'runs the backend "hwfs", serving v4' in cli.tail(50)
                      or not cli.alive(), timeout=scaled(60), interval=0.2)
    assert registered and cli.alive(), f"hwfs-vllm:\n{cli.tail(40)}"
    doc.a.publish(doc.mount, "v5", model=perturb(doc.a.v2, 5))
    doc.mount.run("commit", "v5")
    held = poll(lambda: re.search(r"serving v5 \(requests held [0-9.]+ ms", cli.tail(50)),
                timeout=scaled(60), interval=0.2)
    assert held, f"hwfs-vllm:\n{cli.tail(40)}"
    assert doc.weight_version() == "v5"
    # SIGTERM to hwfs-vllm, not to the block's shell: the shell then exits with its status
    kids = children(cli.p.pid)
    assert kids, f"no process under the block's shell\n{cli.tail(20)}"
    for k in kids:
        os.kill(k, signal.SIGTERM)
    assert cli.p.wait(timeout=scaled(30)) == 0, cli.tail(20)


def children(pid):
    """The pids whose parent is @pid."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out
