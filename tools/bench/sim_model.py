"""sim_model.py — run `hwfs sim` for a bench-cluster row (docs/sim.md).

Shared by tests/integration/test_sim.py (which checks the simulator against
the runs recorded in tools/bench/sim_recorded.json) and tools/bench/bench_cluster.py
(which prints the simulator's prediction and the error after each row it
measures).  The model parameters (rates) are those recorded in
sim_recorded.json["params"], updated by a parameter set of
sim_recorded.json["param_sets"] where the code measured has another pipeline
(PIPELINE: issue 20's codec workers, encode ahead, cut-through deltas, fused
rebuild); a row may override them (a run's own measured encode/decode rates,
its delta ratio).
"""
import json
import os
import subprocess
from pathlib import Path

RECORDED = Path(__file__).resolve().parent / "sim_recorded.json"
PIPELINE = "pipeline-2026-11-26"  # the parameter set of the code on main since 8a41084


def load_recorded(path=RECORDED):
    return json.loads(Path(path).read_text())


def online_cpus():
    """The daemon's codec_threads default: one codec worker per online CPU."""
    try:
        return os.sysconf("SC_NPROCESSORS_ONLN")
    except (ValueError, OSError):
        return os.cpu_count() or 1


def params_for(rec, name=None, **over):
    """The model parameters of @rec (load_recorded()): its "params", updated by
    param_sets[@name] when @name is given, then by @over."""
    p = dict(rec["params"])
    if name:
        p.update(rec["param_sets"][name])
    p.update(over)
    p.pop("notes", None)
    return p


def sim_args(params, run):
    """The `hwfs sim` arguments (after the verb) for @run with model @params."""
    p = dict(params)
    p.update({k: v for k, v in run.items() if k in params})
    a = ["--nodes", str(run["n"]), "--size", str(run["size"]), "--shard", str(run["shard"]),
         "--link", str(run["link"]), "--topology", run.get("topology", "chain"),
         "--host-cores", str(p["host_cores"]), "--overhead", str(p["overhead"]),
         "--latency", str(p["latency"]), "--piece", str(p["piece"]),
         "--net-cpu", str(p["net_cpu_s_per_gib"]), "--hash", str(p["hash_gibps"]),
         "--copy", str(p["copy_gibps"]), "--encode-rate", str(p["encode_gibps"]),
         "--decode", str(p["decode_gibps"]), "--codec-workers", str(p["codec_workers"]),
         "--relay", p["relay"], "--encode", p["encode"], "--control", str(p["control"]),
         "--finish", str(p["finish"]), "--finish-cpu", str(p.get("finish_cpu", 0)),
         "--rebuild", p.get("rebuild", "separate"), "--io-threads", str(p.get("io_threads", 1)),
         "--json"]
    if run.get("delta"):
        a += ["--delta", str(run["delta"]), "--delta-ratio", str(run["delta_ratio"])]
    return a


def predict(hwfs, params, run, timeout=120):
    """`hwfs sim`'s result object for @run (raises on failure)."""
    out = subprocess.run([str(hwfs), "sim"] + sim_args(params, run), capture_output=True,
                         text=True, timeout=timeout, check=True)
    return json.loads(out.stdout)
