"""test_sim.py — `hwfs sim` (docs/sim.md): the simulator against recorded runs
of `make bench-cluster`, and the coordinator's planner driving it.

The recorded runs and the model parameters they are predicted with are in
tools/sim_recorded.json (rates given, nothing calibrated: deterministic).  No
mount, no root, no timing: only the simulator's output is checked.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HWFS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import sim_model  # noqa: E402

REC = sim_model.load_recorded()
RATES = ["--hash", "5", "--copy", "6.67", "--encode-rate", "0.935", "--decode", "1.11"]


def sim(*args):
    out = subprocess.run([HWFS, "sim", *args, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def node(res, name):
    return next(n for n in res["nodes"] if n["node"] == name)


@pytest.mark.parametrize("run", REC["runs"], ids=lambda r: f"{r['topology']}-n{r['n']}-{r['link']}"
                         f"{'-delta' if r.get('delta') else ''}")
def test_predicts_recorded_run(run):
    """Every recorded bench-cluster row is predicted within the tolerance (15%)."""
    res = sim_model.predict(HWFS, REC["params"], run)
    err = res["converged_s"] / run["measured_s"] - 1
    assert abs(err) <= REC["tolerance"], (run, res["converged_s"], f"{err:+.1%}")
    if run.get("measured_arrivals_s"):
        got = sorted(n["converged_s"] for n in res["nodes"] if n["node"] != "pub")
        for g, m in zip(got, run["measured_arrivals_s"]):
            assert abs(g / m - 1) <= REC["tolerance"], (got, run["measured_arrivals_s"])


def test_planner_topologies():
    """The plans are the coordinator's: chain, tree:2 and star donors, bytes per link."""
    chain = sim("--nodes", "3", "--size", "64MiB", "--shard", "16MiB", *RATES)
    assert [node(chain, f"r{i}")["donors"] for i in (1, 2, 3)] == [["pub"], ["r1", "pub"], ["r2", "pub"]]
    assert {(l["from"], l["to"]) for l in chain["links"]} == {("pub", "r1"), ("r1", "r2"), ("r2", "r3")}
    assert chain["critical_path_depth"] == 3
    tree = sim("--nodes", "6", "--topology", "tree:2", "--size", "64MiB", "--shard", "16MiB", *RATES)
    assert [node(tree, f"r{i}")["donors"][0] for i in range(1, 7)] == ["pub", "pub", "r1", "r1", "r2", "r2"]
    star = sim("--nodes", "4", "--topology", "star", "--size", "64MiB", "--shard", "16MiB", *RATES)
    assert all(node(star, f"r{i}")["donors"] == ["pub"] for i in range(1, 5))
    assert node(star, "pub")["bytes_out"] >= 4 * 64 << 20
    # star's publisher carries N copies: about N x the chain's time
    assert star["converged_s"] > 3 * chain["converged_s"]


def test_kill_replans_from_complete_holders():
    """A relay that dies: after node_dead_ms the coordinator re-plans every puller from
    the complete holders (striped), and the survivors converge."""
    res = sim("--nodes", "4", "--size", "1GiB", "--kill", "r2@3", *RATES)
    assert node(res, "r2")["alive"] is False and node(res, "r2")["converged_s"] is None
    assert res["converged_nodes"] == 3 and res["converged_s"] is not None
    assert node(res, "r3")["donors"] == ["pub"] and node(res, "r4")["donors"] == ["pub"]
    # r3 and r4 got nothing more from r2 after it died; pub sent them the rest
    assert node(res, "pub")["bytes_out"] > 2 * (1 << 30)


def test_late_joiner_striped_over_holders():
    """A node joining after the others converged pulls striped from every holder."""
    res = sim("--nodes", "3", "--size", "256MiB", "--shard", "16MiB", "--late-join", "30", *RATES)
    j = node(res, "j1")
    assert sorted(j["donors"]) == ["pub", "r1", "r2", "r3"]
    senders = {l["from"] for l in res["links"] if l["to"] == "j1"}
    assert senders == {"pub", "r1", "r2", "r3"}
    assert j["converged_s"] > 30


def test_deltas_relay_modes():
    """Deltas: the wire carries the delta; cut-through relays and codec workers beat today's
    store-and-forward on the agent thread (host per node)."""
    base = ["--nodes", "6", "--size", "1GiB", "--shard", "32MiB", "--delta", "0.02",
            "--delta-ratio", "0.025", *RATES]
    today = sim(*base)
    assert all(n["delta"] for n in today["nodes"] if n["node"] != "pub")
    assert node(today, "r1")["bytes_in"] < 0.05 * (1 << 30)
    fast = sim(*base, "--relay", "cut", "--codec-workers", "4", "--encode", "ahead")
    assert fast["converged_s"] < today["converged_s"]


def test_help_and_bad_args():
    out = subprocess.run([HWFS, "sim", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--host-cores" in out.stdout
    out = subprocess.run([HWFS, "sim", "--topology", "ring"], capture_output=True, text=True)
    assert out.returncode != 0 and "topology" in out.stderr
    out = subprocess.run([HWFS, "sim", "--nodes", "2", "--kill", "r9@1", *RATES],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "r9" in out.stderr
