"""sim_grid.py — the Simulation table of docs/benchmarks.md: `hwfs sim` at 64,
256 and 1024 receivers x 100 GiB and 1 TiB x 25, 100 and 400 Gbit/s, chain,
whole version, a host per node; plus the shapes of checkpoint-engine's
published runs.  Every row is a simulation (docs/sim.md), not a measurement.

  python3 tools/bench/sim_grid.py [--hwfs build/hwfs] [--io-threads N] [--extra ARGS]

The CPU rates are measured once on this machine (`hwfs sim`'s calibration)
and then given to every run, so the rows share one set of rates.
"""
import argparse
import json
import resource
import shlex
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def sim(hwfs, args):
    t = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    out = subprocess.run([hwfs, "sim", *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout), resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hwfs", default=str(REPO / "build" / "hwfs"))
    ap.add_argument("--extra", default="", help="more `hwfs sim` arguments for every run")
    a = ap.parse_args()
    cal, _ = sim(a.hwfs, ["--nodes", "1", "--size", "64MiB"])
    r = cal["params"]["rates"]
    rates = ["--hash", f"{r['hash_gibps']:.2f}", "--copy", f"{r['copy_gibps']:.2f}",
             "--encode-rate", f"{r['encode_gibps']:.2f}", "--decode", f"{r['decode_gibps']:.2f}"]
    extra = shlex.split(a.extra)
    print(f"rates (measured here, {time.strftime('%Y-%m-%d')}): {' '.join(rates)}; extra: {a.extra or '-'}\n")
    print("| receivers | size | link | S/B s | simulated s | x S/B | bottleneck | depth | sim CPU s |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    rows = [(n, size, link) for n in (64, 256, 1024) for size in ("100GiB", "1TiB")
            for link in ("25gbit", "100gbit", "400gbit")]
    rows += [(256, "1TiB", "400gbit"), (8, "438GiB", "400gbit")]  # Kimi-K2 1T (fp8), Qwen3-235B (bf16)
    for n, size, link in rows:
        res, cpu = sim(a.hwfs, ["--nodes", str(n), "--size", size, "--link", link, *rates, *extra])
        print(f"| {n} | {size} | {link} | {res['s_over_b']:.1f} | {res['converged_s']:.1f} | "
              f"{res['x_s_over_b']:.2f} | {res['bottleneck']} | {res['critical_path_depth']} | {cpu:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
