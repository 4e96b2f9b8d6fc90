"""hwfs.torch: a real transformers model served by HotSwap while a trainer
process writes new versions into a real mount, and swap_in_place.

Tiny Llama configs on the CPU (hidden 64, two layers) keep each test to a few
seconds; torch runs on one thread in every process so that logits computed in
different processes can be compared bit for bit.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, assert_error_line, poll, readlink_or_none

PYDIR = REPO / "tools" / "python"
os.environ.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
if str(PYDIR) not in sys.path:
    sys.path.insert(0, str(PYDIR))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import hwfs  # noqa: E402
from hwfs.torch import HotSwap, swap_in_place, tensors  # noqa: E402

torch.set_num_threads(1)

GATE = "model.layers.0.mlp.gate_proj.weight"
N_PARAMS = 21  # distinct parameters of the untied two-layer model below


def child_env():
    env = dict(os.environ, PYTHONPATH=str(PYDIR), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
    return env


# A trainer process: writes v1 (a fresh model) into the mount with
# save_pretrained, says so (DIR/v1.done), waits for DIR/go, then writes v2:
# v1 with every weight perturbed.
TRAINER = textwrap.dedent('''
    import os, sys, time, torch
    torch.set_num_threads(1)
    from transformers import LlamaConfig, LlamaForCausalLM
    mnt, ctl, tie = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(f"{mnt}/versions/v1")
    open(f"{ctl}/v1.done", "w").close()
    end = time.monotonic() + 120
    while not os.path.exists(f"{ctl}/go"):
        if time.monotonic() > end:
            sys.exit("trainer: no go within 120 s")
        time.sleep(0.02)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(f"{mnt}/versions/v2")
''')

# A server: serves the version `current` names with HotSwap as engine NAME,
# answering the same request in a loop until DIR/stop appears; DIR/state.json
# says what it serves, DIR/answers.pt holds every distinct answer, how often
# it came and under which served version.
SERVER = textwrap.dedent('''
    import hashlib, json, os, sys, time, torch
    torch.set_num_threads(1)
    sys.setswitchinterval(1e-5)  # let the swap thread in often, mid-request included
    from transformers import AutoConfig, LlamaForCausalLM
    from hwfs.torch import HotSwap
    mnt, engine, out = sys.argv[1], sys.argv[2], sys.argv[3]
    end = time.monotonic() + 120
    while not os.path.exists(f"{mnt}/current"):  # started beside the trainer
        if time.monotonic() > end:
            sys.exit("server: nothing committed within 120 s")
        time.sleep(0.02)
    cfg = AutoConfig.from_pretrained(f"{mnt}/current")
    torch.manual_seed(12345)  # weights the versions will replace
    model = LlamaForCausalLM(cfg).eval()
    hs = HotSwap(model, mnt, engine=engine)
    x = (torch.arange(24) * 7 % cfg.vocab_size).view(1, 24)
    answers, counts, last = {}, {}, 0.0

    def state(final=False):
        tmp = f"{out}/state.tmp"
        with open(tmp, "w") as f:
            json.dump({"version": hs.version, "counts": counts, "pause_us": hs.last_pause_us,
                       "swaps": hs.swaps, "error": hs.error, "final": final}, f)
        os.rename(tmp, f"{out}/state.json")

    while not os.path.exists(f"{out}/stop"):
        with hs.serving():
            with torch.no_grad():
                logits = model(x).logits
            v = hs.version
        key = hashlib.sha256(logits.numpy().tobytes()).hexdigest()
        rec = answers.setdefault(key, [logits, 0, set()])
        rec[1] += 1
        rec[2].add(v)
        counts[v] = counts.get(v, 0) + 1
        if time.monotonic() - last > 0.05:
            state()
            last = time.monotonic()
    hs.close()
    torch.save([(t, n, sorted(vs)) for t, n, vs in answers.values()], f"{out}/answers.pt")
    state(final=True)
''')


def tiny(seed, tie=False, intermediate=128, layers=2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval()


def perturbed(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def save_version(mount, version, model):
    model.save_pretrained(mount.vpath(version))
    mount.run("seal", version)


def fresh(mount, version):
    return LlamaForCausalLM.from_pretrained(mount.vpath(version)).eval()


INPUT = (torch.arange(24) * 7 % 128).view(1, 24)


def logits(model):
    with torch.no_grad():
        return model(INPUT).logits


def engine_record(mount, name):
    for e in mount.status().get("engines", []):
        if e["name"] == name:
            return e
    return None


def assert_arena_bytes(t):
    """@t's bytes lie in read-only file mappings (the arena), not in a copy."""
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            regions.append((lo, hi, parts[1], int(parts[4])))
    at, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    while at < end:
        r = next((r for r in regions if r[0] <= at < r[1]), None)
        assert r is not None and "w" not in r[2] and r[3] != 0, \
            f"byte {at:#x} of the tensor is not in a read-only file mapping: {r}"
        at = r[1]


def read_state(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------


def test_hotswap_server_answers_v1_or_v2_never_a_mix(mount, tmp_path):
    """The issue's scenario: a trainer process writes v1 (save_pretrained
    into the mount), it is sealed and committed; a server process serves it
    with HotSwap and answers a fixed request in a loop while the trainer
    writes v2 and it is sealed; `hwfs commit v2` passes the engine barrier;
    afterwards the server answers exactly what a fresh from_pretrained of v2
    answers, and every answer of the whole run was exactly v1's or v2's."""
    ctl, out = tmp_path / "trainer", tmp_path / "server"
    ctl.mkdir()
    out.mkdir()
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "server.py").write_text(SERVER)
    tlog, slog = open(tmp_path / "trainer.log", "w"), open(tmp_path / "server.log", "w")
    # Both start at once (the server waits for `current`): their imports overlap.
    trainer = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"), mount.mnt, str(ctl), "0"],
                               stdout=tlog, stderr=subprocess.STDOUT, env=child_env())
    srv = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), mount.mnt, "llama-a", str(out)],
                           stdout=slog, stderr=subprocess.STDOUT, env=child_env())

    def logs():
        return (f"trainer log:\n{(tmp_path / 'trainer.log').read_text()}\n"
                f"server log:\n{(tmp_path / 'server.log').read_text()}")

    try:
        assert poll(lambda: (ctl / "v1.done").exists() or trainer.poll() is not None, 60), logs()
        assert (ctl / "v1.done").exists(), logs()
        mount.run("seal", "v1")
        mount.run("commit", "v1")
        st = poll(lambda: (s := read_state(out / "state.json")) and s["version"] == "v1" and s
                  or srv.poll() is not None, timeout=60, interval=0.1)
        assert st and srv.poll() is None, f"server never served v1\n{logs()}"
        e = engine_record(mount, "llama-a")
        assert e and e["serving"] == "v1" and e["pid"] == srv.pid, mount.status().get("engines")

        answered = st["counts"]["v1"]
        (ctl / "go").touch()  # the trainer writes v2 while the server answers
        assert trainer.wait(timeout=60) == 0, logs()
        mount.run("seal", "v2")
        served_v1 = read_state(out / "state.json")["counts"]["v1"]
        assert served_v1 > answered, "the server stopped answering while v2 was written"
        cp = mount.run("commit", "v2")
        assert readlink_or_none(mount.path("current")) == "versions/v2", cp.stdout

        st = poll(lambda: (s := read_state(out / "state.json")) and s["counts"].get("v2", 0) >= 5 and s,
                  timeout=30, interval=0.1)
        assert st, f"server never served v2: {read_state(out / 'state.json')}\n{logs()}"
        assert st["error"] is None and st["swaps"] == 1 and st["pause_us"] >= 1
        e = engine_record(mount, "llama-a")
        assert e["serving"] == "v2" and e["last_swap_pause_us"] == st["pause_us"], e

        (out / "stop").touch()
        assert srv.wait(timeout=60) == 0, logs()
        assert poll(lambda: engine_record(mount, "llama-a") is None, 10), "engine still registered"
    finally:
        for p in (trainer, srv):
            if p.poll() is None:
                p.kill()
                p.wait()
        tlog.close()
        slog.close()

    ref = {"v1": logits(fresh(mount, "v1")), "v2": logits(fresh(mount, "v2"))}
    assert not torch.equal(ref["v1"], ref["v2"])
    answers = torch.load(out / "answers.pt")
    seen = set()
    for t, n, versions in answers:
        match = [v for v in ("v1", "v2") if torch.equal(t, ref[v])]
        assert match, f"{n} answers (served as {versions}) equal neither v1's nor v2's logits"
        assert versions == match, f"answers equal to {match}'s logits were served as {versions}"
        seen.add(match[0])
    assert seen == {"v1", "v2"}
    # the last answer, after the commit, was v2's: the final state says v2
    assert read_state(out / "state.json")["version"] == "v2"


def test_hotswap_tied_weights_zero_copy(mount):
    """In-process HotSwap of a model with tied embeddings: it serves `current`
    from the mapping itself (no copy), shadow-loads an arriving version,
    swaps it at the commit, then equals a fresh from_pretrained, the tie kept,
    and the old version's lease is gone."""
    save_version(mount, "v1", tiny(1, tie=True))
    mount.run("commit", "v1")
    model = tiny(99, tie=True)
    with HotSwap(model, mount.mnt, engine="tied") as hs:
        assert hs.version == "v1"
        with hs.serving():
            assert torch.equal(logits(model), logits(fresh(mount, "v1")))
        emb = model.model.embed_tokens.weight
        assert model.lm_head.weight is emb
        assert_arena_bytes(emb)  # zero copy: the mapping's own pages
        e = engine_record(mount, "tied")
        assert e["serving"] == "v1" and e["pid"] == os.getpid()

        save_version(mount, "v2", perturbed(tiny(1, tie=True), 5))
        assert poll(lambda: hs.shadow == "v2", timeout=20), hs.error
        assert poll(lambda: (engine_record(mount, "tied") or {}).get("state") == "loaded", 10)
        mount.run("commit", "v2")
        assert hs.wait_version("v2", timeout=20), hs.error
        with hs.serving():
            assert torch.equal(logits(model), logits(fresh(mount, "v2")))
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert hs.swaps == 1 and hs.last_pause_us >= 1 and hs.error is None
        e = engine_record(mount, "tied")
        assert e["serving"] == "v2" and e["last_swap_pause_us"] == hs.last_pause_us, e
        assert poll(lambda: [x["version"] for x in mount.status()["leases"]] == ["v2"], 10), \
            mount.status()["leases"]
    # closed: unregistered; the module still holds (and leases) v2
    assert poll(lambda: engine_record(mount, "tied") is None, 10)


def test_hotswap_copies_hold_no_lease(mount):
    """zero_copy=False: the module gets its own writable copies, so the engine
    holds no lease once a version is loaded; the swap still gives exactly a
    fresh from_pretrained's answers."""
    save_version(mount, "v1", tiny(1))
    mount.run("commit", "v1")
    model = tiny(3)
    with HotSwap(model, mount.mnt, engine="copies", zero_copy=False) as hs:
        assert hs.version == "v1"
        assert poll(lambda: mount.status()["leases"] == [], 10), mount.status()["leases"]
        with torch.no_grad():
            model.model.norm.weight.mul_(1.0)  # a write in place: fine on a copy
        with hs.serving():
            assert torch.equal(logits(model), logits(fresh(mount, "v1")))
        save_version(mount, "v2", perturbed(tiny(1), 8))
        mount.run("commit", "v2")
        assert hs.wait_version("v2", timeout=20), hs.error
        with hs.serving():
            assert torch.equal(logits(model), logits(fresh(mount, "v2")))
        assert poll(lambda: mount.status()["leases"] == [], 10), mount.status()["leases"]


def test_hotswap_swap_waits_for_requests_in_flight(mount):
    """A request running under hs.serving() when `current` flips finishes on
    the old weights: the swap waits for it (swap_pending), then happens."""
    save_version(mount, "v1", tiny(1))
    mount.run("commit", "v1")
    save_version(mount, "v2", perturbed(tiny(1), 7))
    model = tiny(3)
    ref1, ref2 = logits(fresh(mount, "v1")), logits(fresh(mount, "v2"))
    with HotSwap(model, mount.mnt, engine="inflight") as hs:
        with hs.serving():
            ptrs = [p.data_ptr() for p in model.parameters()]
            mount.run("commit", "v2")  # the barrier: the engine loads v2 first
            assert poll(lambda: hs.swap_pending, timeout=20), \
                f"no swap waits for the request in flight (serving {hs.version}, error {hs.error})"
            assert [p.data_ptr() for p in model.parameters()] == ptrs
            assert hs.version == "v1" and torch.equal(logits(model), ref1)
        assert hs.wait_version("v2", timeout=20), hs.error
        with hs.serving():
            assert torch.equal(logits(model), ref2)


def test_hotswap_refuses_wrong_shape_dtype_missing(mount):
    """A version whose tensor has another shape (prepared by the commit,
    having arrived before the engine started), another dtype or lacks a
    parameter (both refused on arrival) is refused naming the tensor (and
    both shapes); `hwfs commit` fails naming the engine and the tensor;
    current and the served version stay v1."""
    save_version(mount, "v1", tiny(1))
    mount.run("commit", "v1")
    save_version(mount, "wide", tiny(2, intermediate=96))  # before the engine exists
    model = tiny(3)
    with HotSwap(model, mount.mnt, engine="shape-check") as hs:
        ref = logits(fresh(mount, "v1"))
        cp = mount.run("commit", "wide", check=False)
        assert_error_line(cp, "shape-check", "refused", GATE, "[96, 64]", "[128, 64]")
        assert readlink_or_none(mount.path("current")) == "versions/v1"
        assert hs.refused["wide"] == f"tensor {GATE}: shape [96, 64], model has [128, 64]"

        save_version(mount, "half", tiny(4).half())  # after: refused on arrival
        assert poll(lambda: "half" in hs.refused, timeout=20), hs.error
        assert "dtype F16, model has torch.float32" in hs.refused["half"]
        e = engine_record(mount, "shape-check")
        assert e["state"] == "refused" and e["reason"] == hs.refused["half"], e
        cp = mount.run("commit", "half", check=False)
        assert_error_line(cp, "shape-check", "refused", "dtype F16")
        assert readlink_or_none(mount.path("current")) == "versions/v1"

        save_version(mount, "short", tiny(5, layers=1))  # lacks layer 1
        assert poll(lambda: "short" in hs.refused, timeout=20), hs.error
        want = "tensor model.layers.1.self_attn.q_proj.weight: missing from short, model has [64, 64]"
        assert hs.refused["short"] == want
        cp = mount.run("commit", "short", check=False)
        assert_error_line(cp, "shape-check", "missing", "model.layers.1.self_attn.q_proj.weight")
        assert readlink_or_none(mount.path("current")) == "versions/v1"
        assert hs.version == "v1" and hs.swaps == 0
        with hs.serving():
            assert torch.equal(logits(model), ref)


def test_swap_in_place(mount):
    """swap_in_place copies a version into the module's own tensors (same
    storage), after which it equals a fresh from_pretrained; a version with a
    wrong shape raises ValueError naming the tensor and changes nothing; no
    lease is left behind."""
    save_version(mount, "v1", tiny(1))
    save_version(mount, "v2", perturbed(tiny(1), 6))
    save_version(mount, "wide", tiny(2, intermediate=96))
    model = fresh(mount, "v1")
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert swap_in_place(model, "v2", mount.mnt) == N_PARAMS
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs
    assert torch.equal(logits(model), logits(fresh(mount, "v2")))

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=GATE.replace(".", r"\.") + r".*\[96, 64\].*\[128, 64\]"):
        with hwfs.open(mount.mnt) as m:
            swap_in_place(model, "wide", m)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), f"{n} changed by a refused swap_in_place"
    assert mount.status()["leases"] == []


def test_torch_tensors_zero_copy_dtypes(mount):
    """hwfs.torch.tensors gives every tensor with its dtype (BF16 included)
    equal to safetensors.torch's reading, over the mapping's own bytes; the
    numpy view of BF16 holds the same bits; a tensor keeps the mapping alive."""
    import gc

    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(0)
    t = {"bf": torch.randn(64, 33, generator=g).to(torch.bfloat16),
         "f16": torch.randn(7, 5, generator=g).half(),
         "i64": torch.arange(-50, 50, dtype=torch.int64),
         "u8": torch.arange(255, dtype=torch.uint8),
         "mask": torch.arange(10) % 3 == 0}
    os.makedirs(mount.vpath("v1"))
    save_file(t, mount.vpath("v1", "w.safetensors"))
    mount.run("seal", "v1")
    want = load_file(mount.vpath("v1", "w.safetensors"))
    with hwfs.open(mount.mnt) as m:
        v = m.map("v1")
        got = tensors(v)
        assert sorted(got) == sorted(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
            assert got[k].data_ptr() == v.address(k), k
        bits = np.asarray(v["bf"]).view(np.uint16)
        assert np.array_equal(bits, want["bf"].view(torch.int16).numpy().view(np.uint16))
        v.close()
        gc.collect()
        assert not v.unmapped
        assert torch.equal(got["bf"], want["bf"])
        del got, bits
        gc.collect()
        assert v.unmapped


def leases_of(mount, pid):
    return sorted(x["version"] for x in mount.status()["leases"] if x["pid"] == pid)


def test_hotswap_swap_is_all_or_nothing(mount):
    """A swap that fails part-way (here: a tensor torch refuses as a
    parameter's data) puts back every tensor it had already swapped: the
    module serves v1 entirely, as before, and nothing is reported."""
    save_version(mount, "v1", tiny(1))
    mount.run("commit", "v1")
    save_version(mount, "v2", perturbed(tiny(1), 5))
    model = tiny(3)
    ref1 = logits(fresh(mount, "v1"))
    with HotSwap(model, mount.mnt, engine="atomic") as hs:
        before = [p.data_ptr() for p in model.parameters()]
        loaded = hs._load("v2")
        k = len(loaded.pairs) // 2
        target, _ = loaded.pairs[k]
        loaded.pairs[k] = (target, torch.zeros(target.shape, dtype=torch.int64))
        with pytest.raises(RuntimeError):
            hs._swap(loaded)
        assert [p.data_ptr() for p in model.parameters()] == before, "a failed swap left a mix"
        assert hs.version == "v1" and hs.swaps == 0
        with hs.serving():
            assert torch.equal(logits(model), ref1)
        assert engine_record(mount, "atomic")["serving"] == "v1"
        loaded.release()


def test_hotswap_keeps_the_loaded_shadow_when_a_newer_version_arrives(mount):
    """Two shadows: a version loaded (and so possibly READY for a commit on
    its way) is kept when a newer one arrives, so `current` flipping to it
    then swaps at once; a third arrival drops the oldest shadow."""
    save_version(mount, "v1", tiny(1))
    mount.run("commit", "v1")
    model = tiny(3)
    pid = os.getpid()
    with HotSwap(model, mount.mnt, engine="two") as hs:
        save_version(mount, "v2", perturbed(tiny(1), 2))
        assert poll(lambda: hs.shadow == "v2", timeout=20), hs.error
        save_version(mount, "v3", perturbed(tiny(1), 3))
        assert poll(lambda: hs.shadow == "v3", timeout=20), hs.error
        assert poll(lambda: leases_of(mount, pid) == ["v1", "v2", "v3"], 10), \
            f"v2's shadow was dropped when v3 arrived: leases {leases_of(mount, pid)}"
        assert hs.shadows == ["v2", "v3"], hs.shadows
        # `current` flips to v2 the way a COMMIT that passed its barrier before v3 arrived does
        os.symlink("versions/v2", mount.path(".flip"))
        os.rename(mount.path(".flip"), mount.path("current"))
        assert hs.wait_version("v2", timeout=20), hs.error
        assert hs.shadows == ["v3"] and hs.error is None, (hs.shadows, hs.error)
        with hs.serving():
            assert torch.equal(logits(model), logits(fresh(mount, "v2")))
        assert poll(lambda: leases_of(mount, pid) == ["v2", "v3"], 10), leases_of(mount, pid)
        for v in ("v4", "v5"):
            save_version(mount, v, perturbed(tiny(1), int(v[1])))
        assert poll(lambda: hs.shadows == ["v4", "v5"], timeout=20), (hs.shadows, hs.error)
        assert poll(lambda: leases_of(mount, pid) == ["v2", "v4", "v5"], 10), leases_of(mount, pid)
        mount.run("rm", "v4")
        assert poll(lambda: hs.shadows == ["v5"], timeout=20), hs.shadows
