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

from conftest import REPO, safetensors_header, xxh3_128_hex

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
    """Run trainer_proc.py SCENARIO on @n ranks; the rank reports, by rank."""
    os.makedirs(outdir, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", str(PROC), scenario, str(mnt), str(outdir),
           *[str(a) for a in args]]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
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


@pytest.mark.limit(150)
def test_publish_rank_killed(mount, tmp_path):
    """A rank killed (SIGKILL) in the middle of its writes: the version is
    not made, the partial one is removed and its space given back."""
    before = mount.status()["store"]["used_bytes"]
    out = tmp_path / "out"
    cp, rep = run_ranks(2, "publish_kill", mount.mnt, out, "v1", 1, check=False)
    assert cp.returncode != 0
    assert os.path.exists(out / "rank1.dying"), cp.stderr[-3000:]
    assert 1 not in rep
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
