"""Trainers (docs/trainers.md): hwfs.torch.publish from 2 and 4 ranks,
several processes writing disjoint ranges of one file, the tp/N/r resharding
views, and TrainerSwap.

The distributed parts run real ranks (tests/integration/trainer_proc.py)
under torch.distributed.run with gloo on the CPU; each rank reports what it
saw in OUTDIR/rank<r>.json, and rank 0 saves the unsharded model there (never
in the mount), which the tests compare the version against byte for byte.
"""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, poll, safetensors_header, scaled, xxh3_128_hex

PYDIR = REPO / "tools" / "python"
PROC = REPO / "tests" / "integration" / "trainer_proc.py"
os.environ.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
if str(PYDIR) not in sys.path:
    sys.path.insert(0, str(PYDIR))


def child_env():
    env = dict(os.environ, PYTHONPATH=str(PYDIR), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.setdefault("HWFS_LIBRARY", str(REPO / "build" / "libhwfs.so.1"))
    return env


def run_ranks(n, scenario, mnt, outdir, *args, timeout=90, check=True):
    """Run trainer_proc.py SCENARIO on @n ranks; the rank reports, by rank.
    @timeout (scaled for sanitizer builds) only guards against a hang."""
    os.makedirs(outdir, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", str(PROC), scenario, str(mnt), str(outdir),
           *[str(a) for a in args]]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(timeout),
                            env=child_env(), start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{scenario} on {n} ranks timed out\n{e.stdout}\n{e.stderr}")
    if check and cp.returncode != 0:
        pytest.fail(f"{scenario} on {n} ranks failed (exit {cp.returncode})\n"
                    f"{cp.stdout[-3000:]}\n{cp.stderr[-6000:]}")
    reports = {}
    for r in range(n):
        p = os.path.join(outdir, f"rank{r}.json")
        if os.path.exists(p):
            with open(p) as f:
                reports[r] = json.load(f)
    return cp, reports


def st_tensors(path):
    """{name: (dtype, shape, bytes)} of safetensors file @path, read with Python only."""
    hdr, start = safetensors_header(path)
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], tuple(v["shape"]), data[start + a:start + b])
    return out


def version_tensors(vdir):
    out = {}
    for fn in sorted(os.listdir(vdir)):
        if fn.endswith(".safetensors"):
            out.update(st_tensors(os.path.join(vdir, fn)))
    return out


# ---------------------------------------------------------------- publish


@pytest.mark.limit(150)
@pytest.mark.parametrize("ranks,max_file", [(2, 1 << 30), (4, 100_000)])
def test_publish_sharded_equals_unsharded(mount, tmp_path, ranks, max_file):
    """DTensor Shard(0)/Shard(1)/Replicate (and, on 4 ranks, a 2-D mesh with
    Shard(0), Shard(1)) and plain tensors: the version's full tensors are
    byte-equal to the unsharded model, the files are HF style, transformers
    loads them; a state dict that differs on one rank is refused on all."""
    out = tmp_path / "out"
    _, rep = run_ranks(ranks, "publish", mount.mnt, out, "v1", max_file)
    assert sorted(rep) == list(range(ranks))
    vdir = mount.vpath("v1")
    assert mount.version("v1")["state"] == "sealed"
    ref = st_tensors(out / "reference.safetensors")
    got = version_tensors(vdir)
    assert set(got) == set(ref)
    for k in ref:
        assert got[k] == ref[k], f"tensor {k} differs from the unsharded model"
    files = sorted(f for f in os.listdir(vdir) if f.endswith(".safetensors"))
    if max_file >= 1 << 30:
        assert files == ["model.safetensors"]
        assert not os.path.exists(os.path.join(vdir, "model.safetensors.index.json"))
    else:
        n = len(files)
        assert n > 1 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        with open(os.path.join(vdir, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        assert idx["metadata"]["total_size"] == sum(len(v[2]) for v in ref.values())
        for name, fn in idx["weight_map"].items():
            assert name in st_tensors(os.path.join(vdir, fn))
    # every tensor's hash in the daemon's view is that of the reference bytes
    for k in ("model.layers.0.self_attn.o_proj.weight", "model.embed_tokens.weight"):
        h = os.getxattr(os.path.join(vdir, "tensors", k), "user.hwfs.hash").decode()
        assert h == xxh3_128_hex(ref[k][2])
    for r in range(ranks):
        assert "rank 1 has a different state dict" in rep[r]["mismatch"], rep[r]
    assert not any(v["name"].startswith("v1-bad") or ".publish-" in v["name"]
                   for v in mount.status()["versions"])
    code = ("import sys, torch; from transformers import LlamaForCausalLM;"
            "m = LlamaForCausalLM.from_pretrained(sys.argv[1]);"
            "print(sum(p.numel() for p in m.parameters()))")
    cp = subprocess.run([sys.executable, "-c", code, vdir], capture_output=True, text=True,
                        env=child_env(), timeout=60)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert int(cp.stdout.split()[-1]) == sum(
        int(np.prod(v[1])) for v in ref.values())


SOLO = """
import sys, torch
from hwfs.torch import publish
assert not torch.distributed.is_initialized()
torch.manual_seed(3)
sd = {"w": torch.randn(64, 48), "b": torch.arange(7, dtype=torch.bfloat16)}
print(publish(sd, sys.argv[2], sys.argv[1], files={"config.json": b"{}"}))
torch.save(sd, sys.argv[3])
"""


@pytest.mark.limit(90)
def test_publish_without_torch_distributed(mount, tmp_path):
    """A trainer that runs no process group (one process, the vLLM trainer
    engine's common case) publishes alone: the version holds its tensors
    byte for byte, and the extra file."""
    ref = tmp_path / "ref.pt"
    cp = subprocess.run([sys.executable, "-c", SOLO, mount.mnt, "solo", str(ref)],
                        capture_output=True, text=True, env=child_env(), timeout=60)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert cp.stdout.strip() == "['model.safetensors', 'config.json']", cp.stdout
    assert mount.version("solo")["state"] == "sealed"
    import torch
    sd = torch.load(ref)
    got = version_tensors(mount.vpath("solo"))
    assert set(got) == {"w", "b"}
    for k, t in sd.items():
        assert got[k][1] == tuple(t.shape) and got[k][2] == t.contiguous().view(-1).view(
            torch.uint8).numpy().tobytes(), k
    with open(mount.vpath("solo", "config.json"), "rb") as f:
        assert f.read() == b"{}"


@pytest.mark.limit(150)
@pytest.mark.parametrize("where", ["local", "exchange"])
def test_publish_rank_killed(mount, tmp_path, where):
    """A rank killed (SIGKILL) in the middle of its writes, or of the ranks'
    exchange of Shard(1) rows: its peers do not hang, the version is not
    made, the partial one is removed and its space given back.  The
    survivor, rank 0, reports its publish failed with a PublishError naming
    the version (the broken collective, or torchrun's SIGTERM once it saw
    rank 1 die): it neither hung (run_ranks' timeout) nor published."""
    before = mount.status()["store"]["used_bytes"]
    out = tmp_path / "out"
    cp, rep = run_ranks(2, "publish_kill", mount.mnt, out, "v1", 1, where, check=False)
    assert os.path.exists(out / "rank1.dying"), cp.stderr[-3000:]
    assert 1 not in rep
    assert 0 in rep, f"the surviving rank 0 reported nothing\n{cp.stderr[-3000:]}"
    assert (rep[0]["error"] or "").startswith("PublishError: publish v1: rank 0: "), \
        f"rank 0's publish did not fail with a PublishError: {rep[0]}"
    vs = [v["name"] for v in mount.status()["versions"]]
    assert vs == [], vs
    assert os.listdir(mount.path("versions")) == []
    assert mount.status()["store"]["used_bytes"] == before


def test_concurrent_disjoint_writes(mount):
    """Four processes pwrite() disjoint ranges of one safetensors file, in a
    shuffled order, the header among them (ingest thaws the file and cuts it
    at the last close): the file and its tensors are exactly what was meant."""
    rng = np.random.default_rng(5)
    tensors = {f"t{i}": rng.integers(0, 255, size=(64 + i, 1000), dtype=np.uint8)
               for i in range(6)}
    hdr, off = {}, 0
    for k, a in tensors.items():
        hdr[k] = {"dtype": "U8", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    js = json.dumps(hdr).encode()
    js += b" " * (-len(js) % 8)
    blob = len(js).to_bytes(8, "little") + js + b"".join(a.tobytes() for a in tensors.values())
    os.mkdir(mount.vpath("v1"))
    path = mount.vpath("v1", "model.safetensors")
    piece = 4096 + 123
    ranges = [(o, min(len(blob), o + piece)) for o in range(0, len(blob), piece)]
    random.Random(3).shuffle(ranges)
    with open(path, "wb"):
        pass
    code = ("import os, sys; p, s = sys.argv[1], sys.stdin.buffer.read(); fd = os.open(p, os.O_WRONLY)\n"
            "rs = [tuple(map(int, x.split(':'))) for x in sys.argv[2:]]\n"
            "import json\n"
            "for a, b in rs: os.pwrite(fd, s[a:b], a)\n"
            "os.close(fd)\n")
    procs = []
    for w in range(4):
        mine = ranges[w::4]
        procs.append(subprocess.Popen([sys.executable, "-c", code, path,
                                       *[f"{a}:{b}" for a, b in mine]], stdin=subprocess.PIPE))
    for p in procs:
        p.communicate(blob, timeout=60)
        assert p.returncode == 0
    mount.run("seal", "v1")
    with open(path, "rb") as f:
        assert f.read() == blob
    for k, a in tensors.items():
        assert os.getxattr(mount.vpath("v1", "tensors", k), "user.hwfs.hash").decode() == \
            xxh3_128_hex(a.tobytes())


# ------------------------------------------------------------- tp/N/r views

def llama_like(seed=3, experts=4):
    """A small Llama/Mixtral-named state dict (float32 numpy): q/k/v/gate/up,
    o/down, norms, embeddings, lm_head, and MoE experts (w1/w2/w3) with a router."""
    rng = np.random.default_rng(seed)

    def t(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    sd = {"model.embed_tokens.weight": t(64, 32), "lm_head.weight": t(64, 32),
          "model.norm.weight": t(32)}
    for i in range(2):
        p = f"model.layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": t(32, 32), p + "self_attn.k_proj.weight": t(16, 32),
                   p + "self_attn.v_proj.weight": t(16, 32), p + "self_attn.q_proj.bias": t(32),
                   p + "self_attn.o_proj.weight": t(32, 32), p + "mlp.gate_proj.weight": t(64, 32),
                   p + "mlp.up_proj.weight": t(64, 32), p + "mlp.down_proj.weight": t(32, 64),
                   p + "input_layernorm.weight": t(32), p + "post_attention_layernorm.weight": t(32)})
    # an MoE layer (Mixtral names) and a wide row-parallel weight whose dim-1
    # slices are more runs than one FUSE reply takes (read through a bounce copy)
    for e in range(experts):
        for w, shape in (("w1", (16, 32)), ("w2", (32, 16)), ("w3", (16, 32))):
            sd[f"model.layers.2.block_sparse_moe.experts.{e}.{w}.weight"] = t(*shape)
    sd["model.layers.2.block_sparse_moe.gate.weight"] = t(experts, 32)
    sd["model.layers.3.mlp.down_proj.weight"] = t(4096, 64)
    return sd


def expected_slice(name, a, n, r, experts=4):
    """What rank r of TP size n must get of tensor @name, with torch.chunk;
    None when the tensor is not on that rank."""
    import torch
    t = torch.from_numpy(a)
    if ".experts." in name:
        e = int(name.split(".experts.")[1].split(".")[0])
        return a if e // (experts // n) == r else None
    parts = name.split(".")
    if any(c in parts for c in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",
                                "embed_tokens", "lm_head")):
        return torch.chunk(t, n, 0)[r].numpy()
    if any(c in parts for c in ("o_proj", "down_proj")) and a.ndim == 2:
        return torch.chunk(t, n, 1)[r].numpy()
    return a


def write_version(mount, name, sd, extra=None):
    from safetensors.numpy import save_file
    os.mkdir(mount.vpath(name))
    save_file(sd, mount.vpath(name, "model.safetensors"))
    for fn, text in (extra or {}).items():
        with open(mount.vpath(name, fn), "w") as f:
            f.write(text)
    mount.run("seal", name)


@pytest.mark.parametrize("experts", [4, 0])
def test_tp_views_equal_chunk(mount, experts):
    """tp/N/r/model.safetensors for N = 1, 2, 4 holds torch.chunk of every
    split tensor (dim 0, dim 1), the whole replicated ones, and each MoE
    expert on one rank only; map(V, tp=(N, r)) gives the same slices, the
    dim-0 ones as views of the arena; `ls tp/` lists the powers of two that
    work; a size that does not divide is EINVAL, named in tp/README.  Without
    experts, the ranks of a size share one header (each its own slices)."""
    import hwfs
    from safetensors.numpy import load_file
    sd = llama_like(experts=experts)
    write_version(mount, "v1", sd)
    tp = mount.vpath("v1", "tp")
    # readdir order, numeric (os.listdir does not sort)
    if experts:
        assert os.listdir(tp) == ["1", "2", "4", "README"]  # 4 experts: N <= 4
    else:  # k_proj has 16 rows
        assert os.listdir(tp) == ["1", "2", "4", "8", "16", "README"]
    mnt = hwfs.open(mount.mnt)
    for n in (1, 2, 4):
        assert os.listdir(os.path.join(tp, str(n))) == [str(r) for r in range(n)]
        seen_experts = []
        for r in range(n):
            path = os.path.join(tp, str(n), str(r), "model.safetensors")
            # readable by whoever may read the checkpoint, never writable
            assert os.stat(path).st_mode & 0o777 == \
                os.stat(mount.vpath("v1", "model.safetensors")).st_mode & 0o444
            got = load_file(path)
            want = {k: expected_slice(k, a, n, r) for k, a in sd.items()}
            want = {k: v for k, v in want.items() if v is not None}
            assert sorted(got) == sorted(want)
            for k in want:
                assert got[k].shape == want[k].shape and np.array_equal(got[k], want[k]), (n, r, k)
            seen_experts += [k for k in got if ".experts." in k]
            with mnt.map("v1", tp=(n, r)) as m:
                assert sorted(m) == sorted(want)
                for k in want:
                    assert np.array_equal(m[k], want[k]), (n, r, k)
                q = m["model.layers.0.self_attn.q_proj.weight"]
                assert q.flags.c_contiguous and not q.flags.owndata
        assert sorted(seen_experts) == sorted(k for k in sd if ".experts." in k)
        if not experts:
            assert len({os.path.getsize(os.path.join(tp, str(n), str(r), "model.safetensors"))
                        for r in range(n)}) == 1
    # 3 divides nothing here: EINVAL, and README says which tensor
    with pytest.raises(OSError) as ei:
        os.stat(os.path.join(tp, "3"))
    assert ei.value.errno == 22
    with open(os.path.join(tp, "README")) as f:
        readme = f.read()
    import re
    m3 = re.search(r"^3: EINVAL: (tensor (\S+): dim 0 of size (\d+) does not divide by 3)$", readme,
                   re.M)
    assert m3 and int(m3.group(3)) % 3 and m3.group(2) in sd, readme
    assert "64: EINVAL" in readme and "4: ok" in readme
    with pytest.raises(ValueError) as ei:
        mnt.map("v1", tp=(3, 0))
    assert str(ei.value) == m3.group(1)  # the same tensor, the same words
    if experts:  # 8 ranks, 4 experts: the experts cannot be shared out
        with pytest.raises(OSError):
            os.stat(os.path.join(tp, "8", "0"))
        assert "8: EINVAL: tensor model.layers.2.block_sparse_moe.experts.0.w1.weight: 4 " \
               "experts do not divide by 8" in readme
    # not stored: the manifest knows only the checkpoint's files
    man = json.loads(mount.run("manifest", "v1").stdout)
    assert sorted(f["path"] for f in man["files"]) == ["model.safetensors"]
    mnt.close()


def test_tp_partition_overrides(mount):
    """hwfs-partition.json: the first matching pattern wins over the built-in
    rules; a bad rule makes every size EINVAL with the reason in README."""
    import hwfs
    from safetensors.numpy import load_file
    sd = {k: v for k, v in llama_like(experts=2).items() if "layers.3" not in k}
    rules = json.dumps({"*.q_proj.weight": "replicate", "*norm.weight": 0,
                        "*.experts.*": "replicate", "*.embed_tokens.weight": 1})
    write_version(mount, "v1", sd, {"hwfs-partition.json": rules})
    got = load_file(mount.vpath("v1", "tp", "2", "1", "model.safetensors"))
    assert np.array_equal(got["model.layers.0.self_attn.q_proj.weight"],
                          sd["model.layers.0.self_attn.q_proj.weight"])
    assert np.array_equal(got["model.norm.weight"], sd["model.norm.weight"][16:])
    assert np.array_equal(got["model.embed_tokens.weight"], sd["model.embed_tokens.weight"][:, 16:])
    assert "model.layers.2.block_sparse_moe.experts.0.w1.weight" in got
    mount.remount()  # the views are made again from the index at start-up
    again = load_file(mount.vpath("v1", "tp", "2", "1", "model.safetensors"))
    assert sorted(again) == sorted(got) and all(np.array_equal(again[k], got[k]) for k in got)
    with hwfs.open(mount.mnt) as mnt, mnt.map("v1", tp=(2, 1)) as m:
        for k in got:
            assert np.array_equal(m[k], got[k]), k
    # 3 divides every split tensor of v3, but tp/ serves powers of two; map() takes it
    q = np.arange(24, dtype=np.float32).reshape(6, 4)
    write_version(mount, "v3", {"a.q_proj.weight": q})
    assert os.listdir(mount.vpath("v3", "tp")) == ["1", "2", "README"]
    with open(mount.vpath("v3", "tp", "README")) as f:
        assert "3: EINVAL: every tensor divides, but tp/ serves powers of two only" in f.read()
    with hwfs.open(mount.mnt) as mnt, mnt.map("v3", tp=(3, 2)) as m:
        assert np.array_equal(m["a.q_proj.weight"], q[4:])
    write_version(mount, "v2", sd, {"hwfs-partition.json": json.dumps({"*": 2})})
    with pytest.raises(OSError) as ei:
        os.listdir(mount.vpath("v2", "tp", "1"))
    assert ei.value.errno == 22
    with open(mount.vpath("v2", "tp", "README")) as f:
        assert 'hwfs-partition.json: pattern "*": the rule must be 0, 1, "replicate" or "expert"' \
            in f.read()


def test_tp_not_listed(mount, tmp_path):
    """tp/ is reached by path but not listed by readdir of the version, so
    `du`, `cp -r` and `rsync -a` of versions/V see the checkpoint, not the computed views
    (tensors/: its tensors once more; tp/: here five sizes, five times the bytes), which
    are reached by path only;
    inside tp/ the daemon lists sizes and ranks in numeric order (`ls -U`)."""
    import subprocess
    sd = llama_like(experts=0)
    write_version(mount, "v1", sd)
    v = mount.vpath("v1")
    ckpt = os.path.getsize(os.path.join(v, "model.safetensors"))
    assert os.path.isdir(os.path.join(v, "tp")) and os.path.isdir(os.path.join(v, "tensors"))
    assert sorted(os.listdir(v)) == ["model.safetensors"]
    assert not {"tp", "tensors"} & {e.name for e in os.scandir(v)}

    def du(path):
        out = subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[0])
    tensors = du(os.path.join(v, "tensors"))
    assert tensors >= sum(a.nbytes for a in sd.values())
    # the checkpoint, a directory size of slack; before: plus tensors/ (its
    # tensors' bytes once more) and 5 tp sizes of about `ckpt` each
    assert ckpt <= du(v) <= ckpt + 64 * 1024, (du(v), ckpt, tensors)
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", v, str(dst)], check=True)
    assert sorted(os.listdir(dst)) == ["model.safetensors"]
    ls = subprocess.run(["ls", "-U", os.path.join(v, "tp")], capture_output=True, text=True,
                        check=True).stdout.split()
    assert ls == ["1", "2", "4", "8", "16", "README"]
    assert os.listdir(os.path.join(v, "tp", "16")) == [str(r) for r in range(16)]
    # names that are not a size still look up (ENOENT), leading zeros included
    for bad in ("016", "x", "17a"):
        assert not os.path.exists(os.path.join(v, "tp", bad))
    assert os.path.isfile(os.path.join(v, "tp", "16", "15", "model.safetensors"))


def test_tp_view_outlives_removal(mount):
    """An open view file keeps its source bytes: `hwfs rm` of the version does
    not disturb a reader, and the space comes back at its close."""
    sd = llama_like()
    before = mount.status()["store"]["used_bytes"]
    write_version(mount, "v1", sd)
    path = mount.vpath("v1", "tp", "2", "0", "model.safetensors")
    with open(path, "rb") as f:
        head = f.read(8)
        mount.run("rm", "v1")
        rest = f.read()
    from safetensors.numpy import load
    got = load(head + rest)
    assert np.array_equal(got["model.layers.3.mlp.down_proj.weight"],
                          sd["model.layers.3.mlp.down_proj.weight"][:, :32])
    assert poll(lambda: mount.status()["store"]["used_bytes"] == before, timeout=10)


# ------------------------------------------------------------ TrainerSwap

def swap_versions(mount):
    """v1 (a seed-1 tiny Llama), v2..v4 each changing one tensor of the one
    before (trainer_proc.CHANGES), v5 a wrong shape; v1 committed."""
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    import trainer_proc
    sd = {k: v.clone() for k, v in trainer_proc.model(seed=1).state_dict().items()}
    for i, v in enumerate(("v1", "v2", "v3", "v4", "v5")):
        if v != "v1":
            name = trainer_proc.CHANGES[v]
            if v == "v5":
                sd[name] = torch.zeros(sd[name].shape[0] + 1, sd[name].shape[1])
            else:
                sd[name] = sd[name] + 0.5 * i
        os.mkdir(mount.vpath(v))
        save_file(sd, mount.vpath(v, "model.safetensors"))
        mount.run("seal", v)
    mount.run("commit", "v1")
    return trainer_proc


@pytest.mark.limit(150)
@pytest.mark.parametrize("mode,ranks", [("ddp", 2), ("fsdp", 4)])
def test_trainer_swap(mount, tmp_path, mode, ranks):
    """DDP (full parameters) and FSDP2 fully_shard (local shards): every rank
    swaps at the same step, parameters equal to the new version right after;
    keep / reset / attenuate act on the optimizer state of the changed tensor
    only; a version with a wrong shape is refused on every rank, naming the
    tensor, and training goes on untouched."""
    swap_versions(mount)
    _, rep = run_ranks(ranks, "swap", mount.mnt, tmp_path / "out", mode, timeout=120)
    assert sorted(rep) == list(range(ranks))
    want = [[0, "v1", 21], [3, "v2", 1], [5, "v3", 1], [7, "v4", 1]]
    for r in range(ranks):
        assert rep[r]["swaps"] == want, rep[r]
        assert rep[r]["checks"] == [["v1", "keep"], ["v2", "keep"], ["v3", "reset"],
                                    ["v4", "attenuate"]]
        assert "tensor model.layers.0.mlp.gate_proj.weight: shape [129, 64]" in rep[r]["refused"]
        assert rep[r]["final_version"] == "v4"
    if mode == "fsdp":
        assert rep[0]["placements"] == ["(Shard(dim=0),)"]


def test_trainer_swap_engine(mount):
    """TrainerSwap(engine=NAME) in a job without torch.distributed: a commit
    waits for the trainer, fails naming the tensor of a version it cannot
    take, and the swap at the next step is reported with its pause."""
    import torch
    from hwfs.torch import TrainerSwap
    trainer_proc = swap_versions(mount)
    model = trainer_proc.model(seed=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TrainerSwap(model, opt, mount.mnt, engine="trainer") as swap:
        assert swap.maybe_swap(0) == "v1"
        assert swap.maybe_swap(1) is None
        cp = mount.run("commit", "v5", check=False)
        assert cp.returncode != 0
        assert "tensor model.layers.0.mlp.gate_proj.weight: shape [129, 64]" in \
            cp.stdout + cp.stderr
        assert os.readlink(mount.path("current")).endswith("v1")
        mount.run("commit", "v2")
        assert swap.maybe_swap(2) == "v2" and swap.changed == 1
        def trainer():
            return [e for e in mount.status()["engines"] if e["name"] == "trainer"][0]
        assert poll(lambda: trainer()["serving"] == "v2"), trainer()
        assert trainer()["last_swap_pause_us"] > 0, trainer()
    assert poll(lambda: not [e for e in mount.status()["engines"] if e["name"] == "trainer"])
