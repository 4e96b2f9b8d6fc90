"""The tensors/ view, tensor xattrs, manifests and mmap of sealed files."""

import errno
import json
import os
import stat

import numpy as np
import pytest

from conftest import (HEX32, make_hf_model, make_tensors, safetensors_header, save_model, sh,
                      xxh3_128_hex)

DTYPE_NAMES = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64",
               np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
               np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL"}


def mixed_tensors():
    rng = np.random.default_rng(1234)
    return {
        "emb.weight": rng.standard_normal((64, 128), dtype=np.float32),
        "attn.q.half": rng.standard_normal((32, 16)).astype(np.float16),
        "pos.ids": np.arange(10, dtype=np.int64),
        "mask.u8": rng.integers(0, 255, size=(3, 4, 5), dtype=np.uint8),
        "counts.i32": rng.integers(-1000, 1000, size=(7, 3), dtype=np.int32),
        "scale.f64": rng.standard_normal((5,)),
        "big.f32": rng.standard_normal((1024, 256), dtype=np.float32),
    }


@pytest.fixture
def published(mount, src):
    t = mixed_tensors()
    save_model(src / "model.safetensors", t, metadata={"format": "np"})
    mount.run("publish", src, "v1")
    return mount, t


def getfattr(path, name):
    return sh(["getfattr", "--only-values", "-n", name, path]).stdout


def test_tensor_files_hold_tensor_bytes(published):
    m, t = published
    tdir = m.vpath("v1", "tensors")
    assert sorted(os.listdir(tdir)) == sorted(t)
    for name, arr in t.items():
        p = os.path.join(tdir, name)
        st = os.stat(p)
        assert stat.S_ISREG(st.st_mode)
        assert st.st_mode & 0o222 == 0, f"{name} is writable: {oct(st.st_mode)}"
        assert st.st_size == arr.nbytes
        with open(p, "rb") as f:
            assert f.read() == arr.tobytes(), name
    assert m.version("v1")["tensors"] == len(t)


def test_tensor_xattrs(published):
    m, t = published
    for name, arr in t.items():
        p = m.vpath("v1", "tensors", name)
        dtype = DTYPE_NAMES[arr.dtype]
        shape = "[" + ",".join(str(d) for d in arr.shape) + "]"
        assert getfattr(p, "user.hwfs.dtype") == dtype
        assert getfattr(p, "user.hwfs.shape") == shape
        h = getfattr(p, "user.hwfs.hash")
        assert HEX32.match(h), h
        assert os.getxattr(p, "user.hwfs.dtype").decode() == dtype
        assert os.getxattr(p, "user.hwfs.shape").decode() == shape
        assert os.getxattr(p, "user.hwfs.hash").decode() == h
        assert json.loads(shape) == list(arr.shape)
    assert "[64,128]" == getfattr(m.vpath("v1", "tensors", "emb.weight"), "user.hwfs.shape")
    hashes = {os.getxattr(m.vpath("v1", "tensors", n), "user.hwfs.hash") for n in t}
    assert len(hashes) == len(t), "distinct tensors must have distinct hashes"


def test_tensor_hash_is_content_hash(mount, src, tmp_path):
    """user.hwfs.hash of a tensor is XXH3-128 of its bytes, computed here with
    libxxhash itself, whatever file, name or version holds them."""
    t = make_tensors(3, n=4)
    save_model(src / "a.safetensors", t)
    other = tmp_path / "o"
    renamed = {f"other.{i}": a for i, a in enumerate(t.values())}
    save_model(other / "b.safetensors", renamed)
    mount.run("publish", src, "v1")
    mount.run("publish", other, "v2")
    man = {t_["name"]: t_ for f in json.loads(mount.run("manifest", "v1").stdout)["files"]
           for t_ in f.get("tensors", [])}
    for i, (name, arr) in enumerate(t.items()):
        want = xxh3_128_hex(arr.tobytes())
        h1 = os.getxattr(mount.vpath("v1", "tensors", name), "user.hwfs.hash").decode()
        h2 = os.getxattr(mount.vpath("v2", "tensors", f"other.{i}"), "user.hwfs.hash").decode()
        assert h1 == want, f"{name}: xattr {h1}, XXH3-128 of its bytes {want}"
        assert h2 == want, f"other.{i}: the same bytes must hash the same in any file and version"
        assert man[name]["hash"] == want, (name, man[name]["hash"], want)


def test_tensors_of_sharded_model(mount, src):
    model = make_hf_model(src / "m", seed=12)
    mount.run("publish", model, "v1")
    names = set()
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        hdr, _ = safetensors_header(model / shard)
        names |= {k for k in hdr if k != "__metadata__"}
    assert set(os.listdir(mount.vpath("v1", "tensors"))) == names


def test_tensors_dir_is_read_only(published):
    m, t = published
    p = m.vpath("v1", "tensors", "emb.weight")
    with pytest.raises(OSError) as ei:
        open(p, "r+b").close()
    assert ei.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    with pytest.raises(OSError):
        open(m.vpath("v1", "tensors", "new.weight"), "wb").close()
    with pytest.raises(OSError):
        os.unlink(p)
    assert sh(["touch", m.vpath("v1", "tensors", "x")], check=False).returncode != 0
    with open(p, "rb") as f:
        assert f.read() == t["emb.weight"].tobytes()


def test_manifest(published, src):
    """The manifest's values, not only its keys: every file's size and mode, its
    extents tiling it with XXH3-128 of their bytes (computed here with libxxhash),
    the shard list being those extents, and each tensor's offset, length, dtype,
    shape and hash against the safetensors header read here."""
    m, t = published
    cp = m.run("manifest", "v1")
    man = json.loads(cp.stdout)
    assert man["format"] == "hwfs-manifest/1"
    assert man["version"] == "v1"
    srcfile = src / "model.safetensors"
    data = srcfile.read_bytes()
    assert [f["path"] for f in man["files"]] == ["model.safetensors"]
    f = man["files"][0]
    assert f["kind"] == "file"
    assert f["size"] == len(data)
    assert f["mode"] == stat.S_IMODE(os.stat(srcfile).st_mode)
    # extents tile the file in order; each hash is XXH3-128 of those bytes
    at, shards = 0, {}
    for off, length, h in f["extents"]:
        assert off == at and length > 0, f["extents"]
        assert h == xxh3_128_hex(data[off:off + length]), (off, length)
        shards[h] = length
        at += length
    assert at == len(data)
    assert sorted(map(tuple, man["shards"])) == sorted(shards.items())
    # tensors: what the header says, in file order
    hdr, start = safetensors_header(srcfile)
    want = sorted(((start + e["data_offsets"][0], e["data_offsets"][1] - e["data_offsets"][0],
                    k, e["dtype"], e["shape"]) for k, e in hdr.items() if k != "__metadata__"))
    got = [(x["offset"], x["length"], x["name"], x["dtype"], x["shape"]) for x in f["tensors"]]
    assert got == want
    for x in f["tensors"]:
        arr = t[x["name"]]
        assert x["dtype"] == DTYPE_NAMES[arr.dtype] and x["shape"] == list(arr.shape)
        assert x["length"] == arr.nbytes
        assert data[x["offset"]:x["offset"] + x["length"]] == arr.tobytes()
        assert x["hash"] == xxh3_128_hex(arr.tobytes()), x["name"]
    # the digest is XXH3-128 of exactly these bytes (the printed manifest, its newline aside)
    assert m.version("v1")["digest"] == xxh3_128_hex(cp.stdout.rstrip("\n").encode())
    assert m.run("manifest", "v1").stdout == cp.stdout, "manifest output must be stable"
    bad = m.run("manifest", "nope", check=False)
    assert bad.returncode != 0 and "hwfs: error:" in bad.stderr


def test_version_digest_xattr(published, tmp_path):
    m, t = published
    d = os.getxattr(m.vpath("v1"), "user.hwfs.digest").decode()
    assert HEX32.match(d), d
    assert m.version("v1")["digest"] == d
    other = tmp_path / "other"
    save_model(other / "model.safetensors", make_tensors(4, n=3))
    m.run("publish", other, "v2")
    d2 = os.getxattr(m.vpath("v2"), "user.hwfs.digest").decode()
    assert HEX32.match(d2) and d2 != d


def test_numpy_memmap(published):
    m, t = published
    path = m.vpath("v1", "model.safetensors")
    hdr, start = safetensors_header(path)
    np_types = {v: k for k, v in DTYPE_NAMES.items()}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = np_types[info["dtype"]]
        mm = np.memmap(path, dtype=dt, mode="r", offset=start + b, shape=tuple(info["shape"]))
        assert mm.nbytes == e - b
        assert np.array_equal(np.asarray(mm), t[name]), name
        del mm
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    with open(path, "rb") as f:
        assert whole.tobytes() == f.read()
    del whole


def test_safe_open(published):
    from safetensors import safe_open

    m, t = published
    with safe_open(m.vpath("v1", "model.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(t)
        assert f.metadata() == {"format": "np"}
        for name in f.keys():
            got = f.get_tensor(name)
            assert got.dtype == t[name].dtype and np.array_equal(got, t[name]), name
