"""`hwfs diff A B --elements`: the elements that differ per tensor and in total,
and the bytes a node holding A would receive with element-level deltas
(docs/cli.md, "diff").

The models are written byte by byte (write_st) so the dtypes are the ones an
RL loop moves (BF16, with no numpy dtype of its own) and the changed
elements are known exactly.
"""

import json
import os
import threading
import time

import numpy as np
import pytest

from conftest import TIMEOUT, assert_error_line, proc_status_bytes, scaled
from test_security_local import as_user, user_popen

ELEMS = 100_000  # elements of the BF16 tensor
CHANGED = ELEMS * 2 // 100  # 2% of them change


def write_st(path, tensors):
    """A safetensors file of @tensors: name -> (dtype, shape, bytes), in order."""
    header, off = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for _, _, data in tensors.values():
            f.write(data)
    os.chmod(path, 0o644)


def flip(arr, idx, mask=1):
    """@arr (an integer array) with the elements at @idx changed (@mask's bits flipped)."""
    out = arr.copy()
    out[idx] ^= mask
    return out


def publish(m, root, name, files, mode=0o755):
    """Write @files (relative path -> tensors dict, or bytes) under @root/@name and publish it."""
    d = os.path.join(root, name)
    for rel, content in files.items():
        p = os.path.join(d, rel)
        if isinstance(content, bytes):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(content)
            os.chmod(p, 0o644)
        else:
            write_st(p, content)
    os.chmod(d, mode)
    m.run("publish", d, name)
    return d


def by_name(res):
    return {(t["file"], t["tensor"]): t for t in res["tensors"]}


@pytest.fixture
def rl_step(mount_factory, tmp_path):
    """v1, and v2 one "RL step" later: 2% of a BF16 tensor changed, one F32
    tensor the same, one with another dtype (same length), one added, one
    renamed (its bytes are in A), a sub-byte tensor with 3 bytes changed, an
    empty tensor, a tensor named like the BF16 one in another file (the same
    in both), two changed non-safetensors files (one keeps its length, one
    grows) and an unchanged one."""
    m = mount_factory(umask=0)
    rng = np.random.default_rng(9)
    bf = rng.integers(0, 1 << 16, ELEMS, dtype=np.uint16)
    same = rng.standard_normal((256, 64), dtype=np.float32)
    dt = rng.integers(0, 1 << 31, (64, 64), dtype=np.int32)
    f4 = rng.integers(0, 256, 64, dtype=np.uint8)  # 128 F4 values
    idx = rng.choice(ELEMS, CHANGED, replace=False)
    blob = rng.bytes(10_000)
    gone = rng.bytes(1000)
    common = {"config.json": b'{"layers": 2}\n', "vocab.txt": b"a b c\n",
              "second.safetensors": {"w.bf16": ("BF16", (ELEMS,), bf.tobytes())}}
    v1 = {**common, "notes.bin": blob,
          "model.safetensors": {"w.bf16": ("BF16", (1000, 100), bf.tobytes()),
                                "w.same": ("F32", same.shape, same.tobytes()),
                                "w.dtype": ("F32", dt.shape, dt.tobytes()),
                                "w.f4": ("F4", (128,), f4.tobytes()),
                                "w.empty": ("F32", (0,), b""),
                                "w.gone": ("U8", (1000,), gone)}}
    v2 = {**common, "notes.bin": blob[:-1] + b"!", "vocab.txt": b"a b c d\n",
          "model.safetensors": {"w.bf16": ("BF16", (1000, 100), flip(bf, idx).tobytes()),
                                "w.same": ("F32", same.shape, same.tobytes()),
                                "w.dtype": ("I32", dt.shape, (dt ^ 1).tobytes()),
                                "w.f4": ("F4", (128,), flip(f4, [0, 7, 63]).tobytes()),
                                "w.empty": ("F32", (0,), b""),
                                "w.new": ("F16", (100,), bytes(range(200))),
                                "w.moved": ("U8", (1000,), gone)}}
    publish(m, tmp_path, "v1", v1)
    d2 = publish(m, tmp_path, "v2", v2)
    return m, d2


def test_elements_per_tensor(rl_step):
    m, _ = rl_step
    res = json.loads(m.run("diff", "v1", "v2", "--elements", "--json").stdout)
    assert res["a"] == "v1" and res["b"] == "v2"
    t = by_name(res)
    bf = t[("model.safetensors", "w.bf16")]
    assert bf["matched"] and bf["dtype"] == "BF16"
    assert (bf["elements"], bf["changed_elements"], bf["bytes"]) == (ELEMS, CHANGED, 2 * ELEMS)
    assert bf["changed_fraction"] == pytest.approx(0.02)
    assert 0 < bf["delta_bytes"] < bf["bytes"] // 4, bf  # a delta, well below the tensor
    for key in (("model.safetensors", "w.same"), ("second.safetensors", "w.bf16"),
                ("model.safetensors", "w.empty")):
        assert t[key]["matched"], key
        assert (t[key]["changed_elements"], t[key]["changed_fraction"], t[key]["delta_bytes"]) == \
            (0, 0, 0), key
    assert t[("model.safetensors", "w.empty")]["elements"] == 0
    # a sub-byte dtype is compared byte by byte (the codec's width 1)
    f4 = t[("model.safetensors", "w.f4")]
    assert (f4["elements"], f4["changed_elements"], f4["matched"]) == (64, 3, True)
    # another dtype, or a new tensor: no base, every element changed, sent whole
    for key, elems, nbytes in ((("model.safetensors", "w.dtype"), 4096, 16384),
                               (("model.safetensors", "w.new"), 100, 200)):
        x = t[key]
        assert not x["matched"], key
        assert (x["elements"], x["changed_elements"], x["changed_fraction"]) == (elems, elems, 1), key
        assert x["bytes"] == x["delta_bytes"] == nbytes, key
    # renamed: no base by name, but a node holding A has its bytes: nothing to send
    x = t[("model.safetensors", "w.moved")]
    assert (x["matched"], x["changed_elements"], x["bytes"], x["delta_bytes"]) == (False, 1000, 1000, 0)


def test_elements_totals(rl_step):
    m, d2 = rl_step
    res = json.loads(m.run("diff", "v1", "v2", "--elements", "--json").stdout)
    ts, tot = res["tensors"], res["total"]
    assert tot["tensors"] == len(ts) == 8
    assert tot["tensors_changed"] == 5 and tot["tensors_identical"] == 3
    assert tot["tensors_removed"] == 1  # w.gone
    assert tot["elements"] == sum(t["elements"] for t in ts)
    assert tot["changed_elements"] == sum(t["changed_elements"] for t in ts) == CHANGED + 3 + 4096 + 100 + 1000
    assert tot["changed_fraction"] == pytest.approx(tot["changed_elements"] / tot["elements"])
    # every byte of B, and what a node holding A receives: the tensors'
    # deltas; outside tensors, model.safetensors's header (longer: no base)
    # and vocab.txt (longer) whole, a delta of notes.bin (one byte changed);
    # nothing for config.json and second.safetensors, which A has
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(d2) for f in fs)
    assert tot["bytes"] == size
    with open(os.path.join(d2, "model.safetensors"), "rb") as f:
        header = 8 + int.from_bytes(f.read(8), "little")
    whole = header + len(b"a b c d\n")
    assert whole < tot["other_delta_bytes"] < whole + 10_000 // 10, tot
    assert tot["delta_bytes"] == sum(t["delta_bytes"] for t in ts) + tot["other_delta_bytes"]
    assert tot["delta_bytes"] < tot["bytes"] // 2
    assert tot["delta_ratio"] == pytest.approx(tot["delta_bytes"] / tot["bytes"])


def test_elements_text(rl_step):
    m, _ = rl_step
    out = m.run("diff", "v1", "v2", "--elements").stdout
    lines = out.splitlines()
    assert "5 of 8 tensors changed, 3 identical, 1 removed" in lines[0], out
    for name in ("w.bf16", "w.dtype", "w.new", "w.f4", "w.moved"):
        assert any(name in ln for ln in lines[1:-1]), (name, out)
    assert "w.same" not in out and "w.empty" not in out and "second.safetensors" not in out, out
    assert "2.00%" in out and lines[-1].startswith("total:"), out
    # A against itself: nothing changed, nothing to send
    res = json.loads(m.run("diff", "v1", "v1", "--elements", "--json").stdout)
    assert (res["total"]["changed_elements"], res["total"]["delta_bytes"]) == (0, 0)
    assert res["total"]["tensors_identical"] == res["total"]["tensors"] == 7
    # B -> A: w.new and w.moved are gone, w.gone is back (its bytes are in B: nothing to send)
    res = json.loads(m.run("diff", "v2", "v1", "--elements", "--json").stdout)
    assert res["total"]["tensors_removed"] == 2
    assert by_name(res)[("model.safetensors", "w.gone")]["delta_bytes"] == 0


def test_elements_refuses_missing_and_open_versions(rl_step):
    m, _ = rl_step
    for args, words in ((("v1", "nope"), ("nope", "no such version")),
                        (("nope", "v2"), ("nope", "no such version"))):
        assert_error_line(m.run("diff", *args, "--elements", check=False), *words)
    os.mkdir(m.vpath("open1"))
    assert_error_line(m.run("diff", "v1", "open1", "--elements", check=False), "open1", "open")
    assert_error_line(m.run("diff", "open1", "v1", "--elements", "--json", check=False), "open1",
                      "open")


def test_elements_needs_read_access(rl_step, tmp_path):
    """Like diff, --elements shows a version's tensor names (and more) only to
    a caller who could read all of it through the mount."""
    m, _ = rl_step
    cp = as_user(m, "diff", "v1", "v2", "--elements", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["total"]["tensors"] == 8
    d = os.path.join(tmp_path, "private")
    write_st(os.path.join(d, "secret.safetensors"), {"w.secret": ("U8", (4,), b"abcd")})
    os.chmod(os.path.join(d, "secret.safetensors"), 0o600)
    os.chmod(d, 0o755)
    m.run("publish", d, "private")
    for args in (("v1", "private"), ("private", "v1")):
        cp = as_user(m, "diff", *args, "--elements")
        assert_error_line(cp, "permission denied", "private")
        assert "w.secret" not in cp.stdout + cp.stderr


def test_elements_across_shards(mount_factory, tmp_path):
    """Tensors cut in pieces of max_shard = 4099 bytes (odd, so elements span
    two pieces): the changed elements are counted across the cuts, and only
    the pieces that changed are sent (as deltas or whole)."""
    piece = 4099
    m = mount_factory(extra=["-o", f"max_shard={piece}"])
    rng = np.random.default_rng(5)
    f32 = rng.integers(0, 1 << 32, 64 * 256, dtype=np.uint32)  # 65536 bytes: 16 pieces
    bf = rng.integers(0, 1 << 16, 20_000, dtype=np.uint16)  # 40000 bytes: 10 pieces
    # element 1024 of f32 spans bytes 4096..4099, across the first cut: its
    # top byte (4099, in the second piece) changes; 1500 and 1510 are in the
    # second piece too.  bf element 2049 spans 4098..4099: its low byte (in
    # the first piece) changes, and element 15000 is in the eighth piece.
    f32_2 = flip(flip(f32, [1024], 1 << 24), [1500, 1510])
    bf_2 = flip(bf, [2049, 15_000])
    publish(m, tmp_path, "v1", {"m.safetensors": {"f32": ("F32", (64, 256), f32.tobytes()),
                                                  "bf": ("BF16", (20_000,), bf.tobytes())}})
    publish(m, tmp_path, "v2", {"m.safetensors": {"f32": ("F32", (64, 256), f32_2.tobytes()),
                                                  "bf": ("BF16", (20_000,), bf_2.tobytes())}})
    res = json.loads(m.run("diff", "v1", "v2", "--elements", "--json").stdout)
    t = by_name(res)
    f, b = t[("m.safetensors", "f32")], t[("m.safetensors", "bf")]
    assert (f["elements"], f["changed_elements"]) == (16384, 3)
    assert (b["elements"], b["changed_elements"]) == (20_000, 2)
    # only the pieces that changed cost anything: f32's second, bf's first and eighth
    assert 0 < f["delta_bytes"] <= piece, f
    assert 0 < b["delta_bytes"] <= 2 * piece, b
    assert res["total"]["changed_elements"] == 5


def test_plain_diff_tells_same_named_tensors_of_two_files_apart(rl_step):
    """Plain `hwfs diff` keyed tensors by name alone: model.safetensors's
    w.bf16 (changed) hid behind second.safetensors's (the same).  A name used
    by two files is now qualified with the file's path, as in tensors/."""
    m, _ = rl_step
    d = json.loads(m.run("diff", "v1", "v2", "--json").stdout)
    assert sorted(d["changed"]) == ["w.bf16@model.safetensors", "w.dtype", "w.f4"], d
    assert d["tensors_same"] == 3 and d["tensors_changed"] == 3, d
    assert sorted(d["added"]) == ["w.moved", "w.new"] and d["removed"] == ["w.gone"], d


def test_elements_of_versions_without_tensors(mount, tmp_path):
    """Files that are not safetensors (or do not parse as such) have no
    elements; a changed chunk travels as a delta against the chunk at the same
    place of the same file in A when it has the same length, else whole."""
    publish(mount, tmp_path, "a", {"notes.txt": b"one\n" * 1000, "bad.safetensors": b"not a header",
                                   "grow.txt": b"x"})
    publish(mount, tmp_path, "b", {"notes.txt": b"two\n" * 1000, "bad.safetensors": b"not a header",
                                   "grow.txt": b"xy"})
    res = json.loads(mount.run("diff", "a", "b", "--elements", "--json").stdout)
    assert res["tensors"] == []
    tot = res["total"]
    assert (tot["tensors"], tot["elements"], tot["changed_elements"], tot["changed_fraction"]) == (0, 0, 0, 0)
    assert tot["bytes"] == tot["other_bytes"] == 4000 + 12 + 2
    assert tot["delta_bytes"] == tot["other_delta_bytes"]
    assert 2 < tot["delta_bytes"] < 2 + 4000 // 10, tot
    out = mount.run("diff", "a", "b", "--elements").stdout
    assert "0 of 0 tensors changed" in out and "FILE" not in out, out


@pytest.mark.parametrize("names", [("a.empty", "z.big"), ("z.empty", "a.big")])
def test_elements_empty_tensor_beside_a_changed_one(mount, tmp_path, names):
    """An empty tensor at the same offset as a changed one, sorting before
    or after it: the changed tensor's shard is still its own (its delta
    bytes are on its line, not outside tensors)."""
    a = np.arange(1024, dtype=np.uint16)
    for v, arr in (("v1", a), ("v2", flip(a, [3]))):
        publish(mount, tmp_path, v, {"m.safetensors": {names[0]: ("F32", (0,), b""),
                                                       names[1]: ("BF16", (1024,), arr.tobytes())}})
    t = by_name(json.loads(mount.run("diff", "v1", "v2", "--elements", "--json").stdout))
    big, empty = t[("m.safetensors", names[1])], t[("m.safetensors", names[0])]
    assert (big["changed_elements"], empty["elements"], empty["delta_bytes"]) == (1, 0, 0)
    assert 0 < big["delta_bytes"] < 2048, big


# ------------------------------------------------------------ many diffs at once
#
# Issue 16 item 6: 64 parallel `hwfs diff A B --elements` by an unprivileged
# user took the daemon to 4.2 GB and a root commit from 9 ms to 25 s.  Element
# diffs are now limited (diff_threads, diff_per_uid, diff_mem_bytes,
# diff_queue_ms) and their results kept per pair of version digests.

STORM = 64  # parallel diffs
BIG = 32 << 20  # bytes of each version's one tensor (one shard): a diff holds about 1.5x that


def big_versions(m, root, names):
    """@names published, each one F32 tensor of BIG bytes, 2% of it changed from the one before."""
    rng = np.random.default_rng(16)
    w = rng.integers(0, 1 << 32, BIG // 4, dtype=np.uint32)
    for name in names:
        w = flip(w, rng.integers(0, len(w), len(w) // 50), 1 << 7)
        publish(m, root, name, {"m.safetensors": {"w": ("F32", (len(w),), w.tobytes())}})


def storm(m, pairs):
    """One `hwfs diff A B --elements --json` as user 65534 per pair of @pairs, all at once:
    a list of (exit status, stdout, stderr)."""
    procs = [user_popen(m, "diff", a, b, "--elements", "--json") for a, b in pairs]
    outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outs)]


def timed(m, *args):
    """Seconds `hwfs ARGS` as root took (it must succeed)."""
    t0 = time.monotonic()
    m.run(*args)
    return time.monotonic() - t0


def test_elements_storm_by_one_user_stays_bounded(mount_factory, tmp_path):
    """64 element diffs at once by an unprivileged user over 12 pairs of
    versions: the daemon's memory stays bounded, root's commit and status
    stay fast meanwhile (each no slower than max(2 s, 5x the slowest of the
    same commands before the storm), the 2 s times HWFS_TIME_SCALE), and
    every diff either answers or is refused as busy (EBUSY) in one line."""
    m = mount_factory(umask=0)
    names = ["v1", "v2", "v3", "v4"]
    big_versions(m, tmp_path, names)
    pairs = [(a, b) for a in names for b in names if a != b]
    m.run("commit", "v1")
    quiet = [0.0, 0.0]  # the same root commands without the storm: the baseline
    for k in range(6):
        quiet[0] = max(quiet[0], timed(m, "commit", names[k % 2 + 1]))
        quiet[1] = max(quiet[1], timed(m, "status"))
    m.run("commit", "v1")
    base = proc_status_bytes(m.pid, "RssAnon")  # the arena is shared memory: not in it
    peak, slowest, done, errors = [base], [0.0, 0.0], threading.Event(), []

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc_status_bytes(m.pid, "RssAnon"))
            time.sleep(0.01)

    def root_ops():
        k = 0
        try:
            while not done.is_set():
                slowest[0] = max(slowest[0], timed(m, "commit", names[k % 2 + 1]))
                slowest[1] = max(slowest[1], timed(m, "status"))
                k += 1
        except BaseException as e:  # pytest.fail() in m.run(): report it from the test
            errors.append(e)

    threads = [threading.Thread(target=sample), threading.Thread(target=root_ops)]
    for t in threads:
        t.start()
    try:
        res = storm(m, [pairs[i % len(pairs)] for i in range(STORM)])
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not errors, errors
    grown = peak[0] - base
    print(f"storm: anonymous memory grew {grown >> 20} MiB; slowest root commit "
          f"{slowest[0] * 1000:.0f} ms, status {slowest[1] * 1000:.0f} ms (without the storm "
          f"{quiet[0] * 1000:.0f} ms, {quiet[1] * 1000:.0f} ms)")
    ok = [json.loads(out) for rc, out, _ in res if rc == 0]
    print(f"storm: {len(ok)} of {len(res)} diffs answered, the others refused as busy")
    assert ok, [err for _, _, err in res]
    for rc, out, err in res:
        if rc:
            assert err.startswith("hwfs: error: cannot diff") and "busy" in err, err
            assert err.count("\n") == 1, err
    assert all(r["total"]["tensors_changed"] == 1 for r in ok)
    assert grown < 512 << 20, f"the daemon grew by {grown >> 20} MiB"
    bound = [max(scaled(2.0), 5 * q) for q in quiet]
    assert slowest[0] < bound[0] and slowest[1] < bound[1], \
        f"slowest root commit, status under the storm {slowest} s; bounds {bound} s " \
        f"(without the storm {quiet} s)"


def test_identical_elements_diffs_compute_once(mount_factory, tmp_path):
    """Identical requests wait for the one computing instead of counting
    against the user's limit: with diff_per_uid=1, 24 at once all answer,
    the same, and the daemon computed the diff once (status diffs.computed:
    the others waited for that computation or took its kept result)."""
    m = mount_factory(umask=0, extra=["-o", "diff_per_uid=1"])
    big_versions(m, tmp_path, ["v1", "v2"])
    before = m.status()["diffs"]["computed"]
    res = storm(m, [("v1", "v2")] * 24)
    assert [rc for rc, _, _ in res] == [0] * 24, [err for _, _, err in res]
    assert len({out for _, out, _ in res}) == 1
    computed = m.status()["diffs"]["computed"] - before
    assert computed == 1, f"24 identical diffs computed {computed} times, not once"


def test_elements_over_the_memory_budget(mount_factory, tmp_path):
    """A diff estimated above diff_mem_bytes is refused at once, in one line
    naming the tunable; a plain diff still answers."""
    m = mount_factory(umask=0, extra=["-o", "diff_mem_bytes=16M"])
    big_versions(m, tmp_path, ["v1", "v2"])
    cp = m.run("diff", "v1", "v2", "--elements", check=False)
    assert_error_line(cp, "cannot diff v1 v2", "diff_mem_bytes")
    assert cp.stderr.count("\n") == 1, cp.stderr
    m.run("diff", "v1", "v2")


# ------------------------------------------------------------ hostile tensor names

# Tensor names holding terminal escapes and other control characters: ESC (a
# colour, a window title), newline, BEL, DEL, a C1 CSI (U+009B, which some
# terminals obey too), and a NUL-free tab.
HOSTILE_NAMES = ["w.\x1b[31mred\x1b[0m", "w.line\nfeed", "w.bell\x07", "w.del\x7f",
                 "w.c1\u009b2J", "w.tab\there", "w.\x1b]0;owned\x07title"]


def controls(text):
    """The C0 (but the line ends), DEL and C1 control characters in @text."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]


def blanked(name):
    """@name as hwfs prints it: every control character (and a line end) a space."""
    return "".join(" " if controls(c) or c == "\n" else c for c in name)


@pytest.fixture
def hostile(mount_factory, tmp_path):
    """v1 and v2 whose tensors have HOSTILE_NAMES: v2 changes some, adds one, removes one."""
    m = mount_factory(umask=0)
    t1 = {n: ("U8", (64,), bytes([i]) * 64) for i, n in enumerate(HOSTILE_NAMES[:-1])}
    t2 = {n: ("U8", (64,), bytes([i + (i % 2)]) * 64) for i, n in enumerate(HOSTILE_NAMES[1:])}
    publish(m, tmp_path, "v1", {"m.safetensors": t1})
    publish(m, tmp_path, "v2", {"m.safetensors": t2})
    return m


def test_diff_prints_no_control_characters(hostile):
    """Neither `hwfs diff` nor `hwfs diff --elements` prints a tensor name's
    control characters raw (they are blanked, as `hwfs status` does for
    engines): each name stays on its line, and --json keeps the names exact."""
    m = hostile
    plain = m.run("diff", "v1", "v2")
    assert not controls(plain.stdout + plain.stderr), plain.stdout
    # two summary lines, then one per changed, added and removed tensor
    res = json.loads(m.run("diff", "v1", "v2", "--json").stdout)
    n = len(res["changed"]) + len(res["added"]) + len(res["removed"])
    assert n >= 3 and len(plain.stdout.splitlines()) == 2 + n, plain.stdout
    assert "\x1b]0;owned\x07title" in "".join(res["added"])
    el = m.run("diff", "v1", "v2", "--elements")
    assert not controls(el.stdout + el.stderr), el.stdout
    res = json.loads(m.run("diff", "v1", "v2", "--elements", "--json").stdout)
    changed = [t for t in res["tensors"] if t["changed_elements"] or not t["matched"]]
    # summary, header, one line per changed tensor, total
    assert len(el.stdout.splitlines()) == 3 + len(changed), el.stdout
    assert {t["tensor"] for t in res["tensors"]} == set(HOSTILE_NAMES[1:])
    for t in changed:  # each on its own line, its control characters blanked
        assert any(blanked(t["tensor"]) in line for line in el.stdout.splitlines()), t
    # the manifest is canonical JSON: JSON escapes C0 controls, and `hwfs manifest`
    # writes DEL and C1 as \u00NN too (docs/cli.md, manifest): the same JSON value
    manifest = m.run("manifest", "v2").stdout
    assert not controls(manifest) and json.loads(manifest)
    assert "  ~ w.line feed\n" in plain.stdout and "  - w. [31mred [0m\n" in plain.stdout


def test_tensors_dir_escapes_control_characters(hostile):
    """tensors/ names hold no control character: each is escaped as %XX, as
    '/' and '%' are, so every tensor keeps its file."""
    names = os.listdir(hostile.vpath("v2", "tensors"))
    assert not controls("".join(names)) and not any("\n" in n for n in names), names
    assert sorted(names) == sorted(["w.line%0Afeed", "w.bell%07", "w.del%7F", "w.c1%C2%9B2J",
                                    "w.tab%09here", "w.%1B]0;owned%07title"])
    with open(hostile.vpath("v2", "tensors", "w.bell%07"), "rb") as f:
        assert f.read() == bytes([2]) * 64
