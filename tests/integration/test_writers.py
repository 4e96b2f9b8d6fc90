"""Ordinary writers into an open version; every byte survives seal and remount."""

import os

from conftest import (assert_same_file, assert_tree_equal, make_hf_model, make_tensors, random_file,
                      save_model, sh)


def _seal_and_check(mount, version, pairs):
    """Seal @version, then check every (source, path-in-mount) pair after the
    seal and again after a remount."""
    mount.run("seal", version)
    assert mount.version(version)["state"] == "sealed"
    for a, b in pairs:
        (assert_tree_equal if os.path.isdir(a) else assert_same_file)(a, b)
    mount.remount()
    assert mount.version(version)["state"] == "sealed"
    for a, b in pairs:
        (assert_tree_equal if os.path.isdir(a) else assert_same_file)(a, b)


def test_mkdir_opens_version(mount):
    os.mkdir(mount.vpath("w1"))
    assert "w1" in os.listdir(mount.path("versions"))
    assert mount.version("w1")["state"] == "open"


def test_cp_file(mount, src):
    random_file(src / "weights.bin", 5_000_003, seed=1)
    os.mkdir(mount.vpath("w1"))
    sh(["cp", src / "weights.bin", mount.vpath("w1")])
    # Readable while open, too.
    assert_same_file(src / "weights.bin", mount.vpath("w1", "weights.bin"))
    _seal_and_check(mount, "w1", [(src / "weights.bin", mount.vpath("w1", "weights.bin"))])


def test_cp_r_hf_model_dir(mount, src):
    model = make_hf_model(src / "hfmodel")
    os.mkdir(mount.vpath("w1"))
    sh(["cp", "-r", model, mount.vpath("w1") + "/"])
    _seal_and_check(mount, "w1", [(model, mount.vpath("w1", "hfmodel"))])
    v = mount.version("w1")
    assert v["tensors"] == 12
    assert v["errors"] == []


def test_cp_r_into_version_root(mount, src):
    model = make_hf_model(src / "hfmodel", seed=8)
    os.mkdir(mount.vpath("w1"))
    sh(["cp", "-r", str(model) + "/.", mount.vpath("w1")])
    _seal_and_check(mount, "w1", [(model, mount.vpath("w1"))])


def test_rsync_a(mount, src):
    d = src / "rs"
    save_model(d / "model.safetensors", make_tensors(21, n=6, prefix="rs.layers"))
    (d / "config.json").write_text('{"x": 1}\n')
    random_file(d / "sub" / "data.bin", 2_000_000, seed=21)
    os.symlink("config.json", d / "link.json")
    os.mkdir(mount.vpath("w1"))
    # rsync writes a temporary file and renames it into place.
    sh(["rsync", "-a", str(d) + "/", mount.vpath("w1", "rs") + "/"])
    _seal_and_check(mount, "w1", [(d, mount.vpath("w1", "rs"))])
    assert os.readlink(mount.vpath("w1", "rs", "link.json")) == "config.json"


def test_safetensors_save_file_directly(mount, src):
    t = make_tensors(31, n=10, prefix="direct.layers")
    save_model(src / "direct.safetensors", t)
    os.mkdir(mount.vpath("w1"))
    save_model(mount.vpath("w1", "direct.safetensors"), t)
    _seal_and_check(mount, "w1", [(src / "direct.safetensors", mount.vpath("w1", "direct.safetensors"))])
    assert mount.version("w1")["tensors"] == 10


def test_python_several_writes(mount, src):
    rnd = random_file(src / "rnd.bin", 3 << 20, seed=41).read_bytes()
    pieces = [rnd[:1], rnd[1:4096], rnd[4096:4096 + 65537], rnd[4096 + 65537:(2 << 20) + 3], rnd[(2 << 20) + 3:]]
    assert b"".join(pieces) == rnd
    os.mkdir(mount.vpath("w1"))
    with open(mount.vpath("w1", "multi.bin"), "wb") as f:
        for p in pieces:
            f.write(p)
            f.flush()
    with open(mount.vpath("w1", "small.txt"), "w") as f:
        for i in range(100):
            f.write(f"line {i}\n")
    (src / "small.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    _seal_and_check(mount, "w1", [(src / "rnd.bin", mount.vpath("w1", "multi.bin")),
                                  (src / "small.txt", mount.vpath("w1", "small.txt"))])
