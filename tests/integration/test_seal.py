"""Sealed versions are immutable; `mv` seals; `hwfs publish` imports and seals."""

import errno
import os

import pytest

from conftest import (assert_same_file, assert_tree_equal, expect_errno, make_hf_model, make_tensors,
                      random_file, save_model, sh)


@pytest.fixture
def sealed(mount, src):
    random_file(src / "data.bin", 1_000_000, seed=5)
    save_model(src / "model.safetensors", make_tensors(5, n=4))
    os.mkdir(mount.vpath("v1"))
    sh(["cp", src / "data.bin", src / "model.safetensors", mount.vpath("v1")])
    mount.run("seal", "v1")
    return mount


def test_append_to_sealed_file_is_erofs(sealed, src):
    with pytest.raises(OSError) as ei:
        with open(sealed.vpath("v1", "data.bin"), "ab") as f:
            f.write(b"more")
    expect_errno(ei, errno.EROFS)
    with pytest.raises(OSError) as ei:
        with open(sealed.vpath("v1", "data.bin"), "r+b") as f:
            f.write(b"x")
    expect_errno(ei, errno.EROFS)
    assert_same_file(src / "data.bin", sealed.vpath("v1", "data.bin"))


def test_create_in_sealed_version_fails(sealed, src):
    cp = sh(["touch", sealed.vpath("v1", "new")], check=False)
    assert cp.returncode != 0
    assert not os.path.exists(sealed.vpath("v1", "new"))
    with pytest.raises(OSError) as ei:
        open(sealed.vpath("v1", "new2"), "wb").close()
    expect_errno(ei, errno.EROFS)
    with pytest.raises(OSError) as ei:
        os.mkdir(sealed.vpath("v1", "newdir"))
    expect_errno(ei, errno.EROFS)


def test_remove_or_rename_in_sealed_version_fails(sealed, src):
    with pytest.raises(OSError) as ei:
        os.unlink(sealed.vpath("v1", "data.bin"))
    expect_errno(ei, errno.EROFS)
    with pytest.raises(OSError) as ei:
        os.rename(sealed.vpath("v1", "data.bin"), sealed.vpath("v1", "moved.bin"))
    expect_errno(ei, errno.EROFS)
    with pytest.raises(OSError) as ei:
        os.truncate(sealed.vpath("v1", "data.bin"), 0)
    expect_errno(ei, errno.EROFS)
    assert_same_file(src / "data.bin", sealed.vpath("v1", "data.bin"))


def test_seal_unknown_version_fails(sealed):
    cp = sealed.run("seal", "nope", check=False)
    assert cp.returncode != 0 and "hwfs: error:" in cp.stderr
    assert sealed.version("v1")["state"] == "sealed"


def test_mv_seals(mount, src):
    model = make_hf_model(src / "m", seed=9)
    os.mkdir(mount.vpath("V.tmp"))
    sh(["cp", "-r", str(model) + "/.", mount.vpath("V.tmp")])
    assert mount.version("V.tmp")["state"] == "open"
    os.rename(mount.vpath("V.tmp"), mount.vpath("V"))
    names = sorted(os.listdir(mount.path("versions")))
    assert names == ["V"]
    v = mount.version("V")
    assert v is not None and v["state"] == "sealed"
    assert mount.version("V.tmp") is None
    assert_tree_equal(model, mount.vpath("V"))
    with pytest.raises(OSError) as ei:
        open(mount.vpath("V", "config.json"), "ab").close()
    expect_errno(ei, errno.EROFS)


def test_mv_with_shell_mv(mount, src):
    random_file(src / "x.bin", 200_000, seed=6)
    os.mkdir(mount.vpath("W.tmp"))
    sh(["cp", src / "x.bin", mount.vpath("W.tmp")])
    sh(["mv", mount.vpath("W.tmp"), mount.vpath("W")])
    assert mount.version("W")["state"] == "sealed"
    assert_tree_equal(src, mount.vpath("W"))


def test_publish(mount, src):
    model = make_hf_model(src / "m", seed=10)
    mount.run("publish", model, "p1")
    v = mount.version("p1")
    assert v["state"] == "sealed"
    assert v["tensors"] == 12
    assert_tree_equal(model, mount.vpath("p1"))
    mount.remount()
    assert_tree_equal(model, mount.vpath("p1"))


def test_publish_existing_name_fails(mount, src, tmp_path):
    random_file(src / "a.bin", 10_000, seed=1)
    other = tmp_path / "other"
    random_file(other / "b.bin", 10_000, seed=2)
    mount.run("publish", src, "p1")
    digest = mount.version("p1")["digest"]
    cp = mount.run("publish", other, "p1", check=False)
    assert cp.returncode != 0
    assert "hwfs: error:" in cp.stderr
    assert mount.version("p1")["digest"] == digest
    assert_tree_equal(src, mount.vpath("p1"))
    # Also refused over an open version.
    os.mkdir(mount.vpath("o1"))
    cp = mount.run("publish", other, "o1", check=False)
    assert cp.returncode != 0
