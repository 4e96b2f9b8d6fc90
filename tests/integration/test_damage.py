"""A flipped byte in the shard arena is found by `hwfs verify` and blocks commit."""

import json
import os

from conftest import assert_error_line, find_all, flip_byte, make_tensors, save_model


def damage_version(mount, src):
    """Publish v1 and v2 (v2 holds a tensor no other version has), then flip a
    byte in the arena in the middle of that tensor."""
    t = make_tensors(500, n=6)
    save_model(src / "a" / "model.safetensors", t)
    mount.run("publish", src / "a", "good")
    mine = make_tensors(501, n=6)
    victim = list(mine)[-1]  # 1 MiB of random floats: unique in the arena
    save_model(src / "b" / "model.safetensors", mine)
    mount.run("publish", src / "b", "bad")
    # 4 KiB from the middle of the tensor: random, so unique, and inside one
    # shard even if the tensor was cut into several.
    mid = (len(mine[victim].tobytes()) // 2) + 8192
    needle = mine[victim].tobytes()[mid:mid + 4096]
    arena = os.path.join(mount.store, "arena")
    hits = find_all(arena, needle)
    assert hits, "could not find the tensor's bytes in STORE/arena"
    for off in hits:
        flip_byte(arena, off + 1000)
    return t, mine, victim


def test_verify_detects_damage(mount_factory, src):
    m = mount_factory(capacity="256M")
    damage_version(m, src)
    assert m.run("verify", "good").returncode == 0
    cp = m.run("verify", "bad", check=False)
    assert cp.returncode != 0
    assert "damaged" in (cp.stdout + cp.stderr).lower(), (cp.stdout, cp.stderr)
    assert m.version("bad")["state"] == "damaged"
    assert m.version("good")["state"] == "sealed"
    js = m.run("verify", "bad", "--json", check=False)
    assert js.returncode != 0
    assert json.loads(js.stdout)["intact"] is False, js.stdout


def test_damaged_version_cannot_be_committed(mount_factory, src):
    m = mount_factory(capacity="256M")
    damage_version(m, src)
    m.run("commit", "good")
    m.run("verify", "bad", check=False)
    assert m.version("bad")["state"] == "damaged"
    assert_error_line(m.run("commit", "bad", check=False), "damaged")
    assert os.readlink(m.path("current")) == "versions/good"
    assert m.status()["current"] == "good"
    # Nor by renaming a symlink over current by hand.
    os.symlink("versions/bad", m.path(".tmp-bad"))
    try:
        os.rename(m.path(".tmp-bad"), m.path("current"))
    except OSError:
        pass
    assert os.readlink(m.path("current")) == "versions/good"


def test_damage_state_survives_remount(mount_factory, src):
    m = mount_factory(capacity="256M")
    damage_version(m, src)
    m.run("verify", "bad", check=False)
    m.remount()
    assert m.version("bad")["state"] == "damaged"
    assert m.version("good")["state"] == "sealed"
    assert m.run("verify", "good").returncode == 0
    assert_error_line(m.run("commit", "bad", check=False), "damaged")
