"""Element-level deltas (docs/delta.md): an RL-like update moves only its changed elements,
and no fault of the delta path leaves a wrong byte behind.

Models are safetensors files written by hand (numpy has no bfloat16): v1 random bf16
weights, v2 = v1 with ~2% of the elements of every tensor moved by one ulp, what the bf16
rounding of a small optimizer step does.  The fault tests corrupt a base in a donor's
arena, remove a base on a receiver (before the pull, and while its deltas travel), restart
a receiver on its store, turn deltas off, mix dtypes, shapes and a plain file, and put a
hostile donor (a raw ZeroMQ peer that joined an --insecure cluster) in front of a node.
Clusters come from the ``net`` fixture of cluster/conftest.py (a coordinator and nodes
started one at a time, all cleaned up after the test).
"""

import json
import os
import signal
import struct
import subprocess
import threading
import time

import numpy as np
import pytest

import conftest as base  # tests/integration/conftest.py
from conftest import HwfsMount, poll, read_text, wait_dead

from .conftest import assert_identical, corrupt_at, node_view, ring, shaped_from

TENSORS = 8
TENSOR_BYTES = 4 << 20  # each tensor is one shard (max_shard is 64 MiB)
V1_REFUSAL = "protocol version 1 not supported (this side speaks 2)"


def write_safetensors(path, tensors):
    """Write @tensors (name -> (dtype, array)) as a safetensors file, each array's bytes as
    they are (a uint16 array holds bf16 bit patterns)."""
    header, off = {}, 0
    for name, (dtype, arr) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for _, arr in tensors.values():
            f.write(arr.tobytes())


def write_bf16(path, tensors):
    """Write @tensors (name -> uint16 array of bf16 bit patterns) as a BF16 safetensors file."""
    write_safetensors(path, {name: ("BF16", arr) for name, arr in tensors.items()})


def to_bf16(x):
    """float32 array -> uint16 bf16 bit patterns (round to nearest even)."""
    w = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_model(seed, n=TENSORS, nbytes=TENSOR_BYTES):
    """Random bf16 weights (normal, std 0.02) as uint16 bit patterns: @n tensors of @nbytes."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        w = rng.standard_normal(nbytes // 2, dtype=np.float32) * 0.02
        out[f"layers.{i}.weight"] = to_bf16(w).reshape(-1, min(1024, nbytes // 2))
    return out


def rl_step(tensors, frac, seed):
    """A copy of @tensors with @frac of the elements of every tensor moved by one bf16 ulp."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, arr in tensors.items():
        new = arr.copy().reshape(-1)
        idx = rng.choice(new.size, int(new.size * frac), replace=False)
        new[idx] = new[idx] + np.where(rng.random(idx.size) < 0.5, 1, -1).astype(np.uint16)
        out[name] = new.reshape(arr.shape)
    return out


def model_dir(root, tensors):
    os.makedirs(root, exist_ok=True)
    write_bf16(os.path.join(root, "model.safetensors"), tensors)
    with open(os.path.join(root, "config.json"), "w") as f:
        f.write('{"model": "rl-test"}\n')
    return root


def rl_versions(tmp_path):
    """Model directories under @tmp_path: v1 (bf16_model(1)) and v2, v1 after an RL step
    that moved 2% of every tensor's elements.  Returns (v1, v2)."""
    w1 = bf16_model(1)
    return (model_dir(str(tmp_path / "v1"), w1),
            model_dir(str(tmp_path / "v2"), rl_step(w1, 0.02, 2)))


def replication(node):
    return node.status()["replication"]


def grew(before, after, *keys):
    """after[keys...] - before[keys...] for nested status dicts."""
    a, b = after, before
    for k in keys:
        a, b = a[k], b[k]
    return a - b


def log_text(node):
    """The node's whole daemon log (STORE/hwfs.log)."""
    return read_text(os.path.join(node.store, "hwfs.log"))


def bad_shards(node, name):
    """bad_shards the coordinator counts against @name, seen from @node (None if unknown)."""
    return (node_view(node.try_cluster_status(), name) or {}).get("bad_shards")


def tensor_span(path, name):
    """(absolute offset, byte length) of tensor @name in the safetensors file @path."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    lo, hi = hdr[name]["data_offsets"]
    return 8 + n + lo, hi - lo


def corrupt_tensor(node, path, name):
    """Flip a byte in the middle of tensor @name of @path (the bytes the source file holds)
    in @node's store arena, as corrupt_chunk does for a plain file's shard.  Returns the
    number of copies found (1: the arena holds each distinct shard once)."""
    off, length = tensor_span(path, name)
    return corrupt_at(node, path, off + length // 2, f"tensor {name} of {path}")


def start(net, names, coord=None, extra=()):
    """A coordinator (@coord: its keyword options) and nodes @names with `hwfs mount` options
    @extra, each started once the previous one is alive."""
    net.start_coord(**(coord or {}))
    for name in names:
        net.add(name, extra=extra)
    return net.wait_alive(names, viewer=net[names[0]])


@pytest.mark.limit(150)
def test_rl_update_moves_only_changed_elements(net, tmp_path):
    """v2 = v1 with 2% of every tensor's elements changed reaches B and C byte-identical,
    each receiving at most 8% of v2's bytes over the wire; A encodes each delta once and
    B, a relay, forwards A's deltas as they came (it encodes nothing)."""
    ring(net, ["A", "B", "C"])
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    before = {n: replication(net[n]) for n in "ABC"}

    net.wait_version("v2", net.publish("A", v2, "v2"))
    size = os.path.getsize(os.path.join(v2, "model.safetensors"))
    after = {n: replication(net[n]) for n in "ABC"}
    for n in "BC":
        assert_identical(v2, net[n], "v2")
        wire = after[n]["wire_bytes_received"] - before[n]["wire_bytes_received"]
        logical = after[n]["bytes_received"] - before[n]["bytes_received"]
        print(f"{n}: {wire} bytes on the wire for {logical} shard bytes of a {size}-byte v2")
        assert logical >= TENSORS * TENSOR_BYTES, f"{n} received only {logical} shard bytes of v2"
        assert wire <= 0.08 * size, f"{n} received {wire} bytes over the wire for v2 ({size} bytes)"
        assert after[n]["delta"]["received"] - before[n]["delta"]["received"] >= TENSORS
    assert after["A"]["delta"]["encoded"] - before["A"]["delta"]["encoded"] >= TENSORS
    assert after["B"]["delta"]["encoded"] == before["B"]["delta"]["encoded"], \
        f"B re-encoded deltas it received: {before['B']['delta']} -> {after['B']['delta']}"
    for n in "ABC":
        assert after[n]["delta"]["failed"] == 0, f"{n}: {after[n]['delta']}"


@pytest.mark.limit(90)
def test_delta_against_a_corrupt_base_is_refused_and_the_shard_comes_whole(net, tmp_path):
    """A's copy of one tensor of v1 is corrupt in its arena, so the delta A makes of that
    tensor in v2 is against a wrong base: B's rebuilt shard fails its hash and nothing of it
    is staged; B logs the bad delta, counts it (delta.failed), reports A to the coordinator
    (bad_shards) and asks for the shard whole.  v2 ends byte-identical on B and C; the other
    tensors still came as deltas, and C (fed by B) saw no bad delta."""
    ring(net, ["A", "B", "C"])
    a, b, c = (net[x] for x in "ABC")
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    assert corrupt_tensor(a, os.path.join(v1, "model.safetensors"), "layers.3.weight") == 1
    before = {n: replication(net[n]) for n in "ABC"}
    bad0 = bad_shards(b, "A")

    net.wait_version("v2", net.publish("A", v2, "v2"))
    size = os.path.getsize(os.path.join(v2, "model.safetensors"))
    after = {n: replication(net[n]) for n in "ABC"}
    for n in (b, c):
        assert_identical(v2, n, "v2")
        assert n.run("verify", "v2", check=False).returncode == 0, f"{n.name}'s v2 does not verify"
    assert grew(before["B"], after["B"], "delta", "failed") >= 1, \
        f"B counted no failed delta: {before['B']['delta']} -> {after['B']['delta']}"
    assert grew(before["B"], after["B"], "delta", "received") >= TENSORS - 1, after["B"]["delta"]
    wire = grew(before["B"], after["B"], "wire_bytes_received")
    assert TENSOR_BYTES <= wire <= TENSOR_BYTES + 0.08 * size, \
        f"B received {wire} bytes on the wire: want one whole tensor ({TENSOR_BYTES}) plus deltas"
    assert f"bad delta from {a.url} for v2" in log_text(b), f"B's log:\n{b.log_tail()}"
    assert grew(before["C"], after["C"], "delta", "failed") == 0, after["C"]["delta"]
    assert poll(lambda: (bad_shards(b, "A") or 0) > bad0, timeout=10, interval=0.2), \
        f"the coordinator counts no bad shard against A ({bad0} before): {b.try_cluster_status()}"
    assert bad_shards(b, "B") == 0 and bad_shards(b, "C") == 0


@pytest.mark.limit(120)
def test_late_joiner_gets_a_shard_whole_from_another_donor_after_a_bad_delta(net, tmp_path):
    """D holds v1 and is down while v2 is published; A's copy of every tensor of v1 is
    corrupt, so every delta A makes (and keeps) is against a wrong base.  D, back, is striped
    over A, B and C with base v1: each shard it asked of A fails its hash, A is reported and
    backed off, and the shard comes whole from B or C.  v2 ends identical on every node."""
    ring(net, ["A", "B", "C", "D"])
    a, b, c, d = (net[x] for x in "ABCD")
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    d.umount()
    assert wait_dead(d.pid, 10), "D's daemon still alive after hwfs umount"
    net.wait_dead("D", viewer=a)
    for i in range(TENSORS):
        name = f"layers.{i}.weight"
        assert corrupt_tensor(a, os.path.join(v1, "model.safetensors"), name) == 1

    d2 = net.publish("A", v2, "v2")
    net.wait_version("v2", d2, nodes=[a, b, c])
    sent0 = {n.name: replication(n)["wire_bytes_sent"] for n in (b, c)}
    bad0 = bad_shards(a, "A")

    d.mount()
    net.wait_version("v2", d2, nodes=[d], timeout=60)
    assert_identical(v2, d, "v2")
    assert d.run("verify", "v2", check=False).returncode == 0, "D's v2 does not verify"
    rd = replication(d)  # a fresh daemon: its counters start at 0
    assert rd["delta"]["failed"] >= 1, f"D counted no failed delta: {rd['delta']}"
    assert f"bad delta from {a.url} for v2" in log_text(d), f"D's log:\n{d.log_tail()}"
    sent = {n.name: replication(n)["wire_bytes_sent"] - sent0[n.name] for n in (b, c)}
    assert sum(sent.values()) >= TENSOR_BYTES, \
        f"B and C sent {sent} wire bytes to D: no shard came whole from them after A's bad delta"
    assert poll(lambda: (bad_shards(d, "A") or 0) > bad0, timeout=10, interval=0.2), \
        f"D's bad delta from A was not counted ({bad0} before): {d.try_cluster_status()}"
    print(f"D: {rd['delta']}; B, C sent {sent} wire bytes")


@pytest.mark.limit(90)
def test_a_receiver_without_the_base_gets_whole_shards(net, tmp_path):
    """C removed v1 before v2 was published: it gets v2 identical with whole shards (no delta
    received, about v2's size on the wire) while B, which holds v1, still takes deltas."""
    ring(net, ["A", "B", "C"])
    b, c = net["B"], net["C"]
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    c.run("rm", "v1")
    assert not c.visible("v1")
    before = {n: replication(net[n]) for n in "BC"}

    net.wait_version("v2", net.publish("A", v2, "v2"))
    size = sum(os.path.getsize(os.path.join(v2, f)) for f in os.listdir(v2))
    after = {n: replication(net[n]) for n in "BC"}
    for n in (b, c):
        assert_identical(v2, n, "v2")
    wire_c = grew(before["C"], after["C"], "wire_bytes_received")
    assert grew(before["C"], after["C"], "delta", "received") == 0, after["C"]["delta"]
    assert 0.95 * size <= wire_c <= 1.05 * size, f"C received {wire_c} wire bytes for a {size}-byte v2"
    assert "can come as deltas" not in log_text(c), f"C's log:\n{c.log_tail()}"
    wire_b = grew(before["B"], after["B"], "wire_bytes_received")
    assert grew(before["B"], after["B"], "delta", "received") >= TENSORS, after["B"]["delta"]
    assert wire_b <= 0.08 * size, f"B received {wire_b} wire bytes for a {size}-byte v2"


@pytest.mark.limit(120)
def test_a_restarted_node_holding_the_base_pulls_deltas(net, tmp_path):
    """D pulled v1, then its daemon stopped; v2 is published to A, B, C; D mounted again on
    its store gets v2 (a late joiner, striped over the holders) as deltas against v1: at most
    8% of v2's bytes on the wire, byte-identical."""
    ring(net, ["A", "B", "C", "D"])
    a, d = net["A"], net["D"]
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    d.umount()
    assert wait_dead(d.pid, 10), "D's daemon still alive after hwfs umount"
    net.wait_dead("D", viewer=a)

    d2 = net.publish("A", v2, "v2")
    net.wait_version("v2", d2, nodes=[net[x] for x in "ABC"])
    size = os.path.getsize(os.path.join(v2, "model.safetensors"))

    d.mount()
    net.wait_version("v2", d2, nodes=[d], timeout=60)
    assert_identical(v2, d, "v2")
    r = replication(d)  # a fresh daemon: its counters start at 0
    print(f"D: {r['wire_bytes_received']} wire bytes for {r['bytes_received']} shard bytes; {r['delta']}")
    assert r["bytes_received"] >= TENSORS * TENSOR_BYTES, r
    assert r["wire_bytes_received"] <= 0.08 * size, \
        f"D received {r['wire_bytes_received']} wire bytes for a {size}-byte v2"
    assert r["delta"]["received"] >= TENSORS and r["delta"]["failed"] == 0, r["delta"]
    assert f"v2: {TENSORS} shard(s) can come as deltas against v1" in log_text(d), d.log_tail()


@pytest.mark.limit(90)
def test_base_removed_while_its_deltas_travel(net, tmp_path):
    """C was planned v2 with base v1 and asked its donor B for deltas, but B's answers are
    held back (its sends shaped to 8 kbit/s on loopback) so none arrives; C removes v1
    (hwfs rm); B's answers are let go and the deltas arrive against a base C no longer
    holds: C asks for those shards whole and v2 ends identical and intact on C — never a
    shard rebuilt from freed bytes, never a failed delta.

    Every step waits on a state, not on time: C is stopped (SIGSTOP) while v2 is planned and
    resumed once B holds v2 sealed, so B answers C's GETs with deltas (never MISSING because
    its own plan had not been read yet); the rm comes only after C's counters say it asked B
    for every tensor as a delta.  The hold on B is the shaping, not a signal: B keeps
    running, and whatever it answers stays in its queue until the shaping ends."""
    # C waits on its donor (no failover to A on silence), the coordinator keeps the stopped
    # C alive (no re-plan): the deltas C asked for can only come after the rm.
    start(net, ["A", "B", "C"], coord={"tunables": {"node_dead_ms": 60000}},
          extra=["-o", "donor_silence_ms=60000"])
    b, c = net["B"], net["C"]
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    before = replication(c)
    c_pid = int(c.status()["pid"])
    planned = f"v2: {TENSORS} shard(s) can come as deltas against v1"
    with shaped_from(b, "8kbit"):
        os.kill(c_pid, signal.SIGSTOP)  # C reads its plan of v2 only once B holds v2
        try:
            d2 = net.publish("A", v2, "v2")
            net.wait_version("v2", d2, nodes=[b])
        finally:
            os.kill(c_pid, signal.SIGCONT)
        assert poll(lambda: grew(before, replication(c), "delta", "asked") >= TENSORS,
                    timeout=30, interval=0.05), \
            f"C did not ask B for v2's deltas: {replication(c)}\n{c.log_tail()}"
        assert planned in log_text(c), f"C did not plan v2 with deltas against v1:\n{c.log_tail()}"
        got = replication(c)
        assert grew(before, got, "delta", "received") == 0 and not c.visible("v2"), \
            f"C got deltas past the shaping: {got['delta']}"
        c.run("rm", "v1")
        assert not c.visible("v1")
    net.wait_version("v2", d2, nodes=[b, c], timeout=60)
    assert_identical(v2, c, "v2")
    assert c.run("verify", "v2", check=False).returncode == 0, "C's v2 does not verify"
    after = replication(c)
    assert grew(before, after, "delta", "failed") == 0, after["delta"]
    assert "the base of a shard of v2 is gone here; asking for it whole" in log_text(c), c.log_tail()


@pytest.mark.limit(90)
@pytest.mark.parametrize("where", ["everywhere", "coordinator", "nodes"])
def test_delta_off_moves_whole_shards(net, tmp_path, where):
    """The tunable delta=0 (on every daemon and the coordinator; on the coordinator only: no
    base planned; on the nodes only: pullers name no base, donors encode nothing): v2 moves
    whole (about its size on the wire), every delta counter stays 0, v2 is identical."""
    coord = {"tunables": {"delta": 0}} if where in ("everywhere", "coordinator") else {}
    extra = ["-o", "delta=0"] if where in ("everywhere", "nodes") else []
    start(net, ["A", "B", "C"], coord=coord, extra=extra)
    v1, v2 = rl_versions(tmp_path)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    before = {n: replication(net[n]) for n in "BC"}
    net.wait_version("v2", net.publish("A", v2, "v2"))
    size = os.path.getsize(os.path.join(v2, "model.safetensors"))
    for x in "BC":
        n = net[x]
        assert_identical(v2, n, "v2")
        wire = grew(before[x], replication(n), "wire_bytes_received")
        assert 0.95 * size <= wire <= 1.05 * size, f"{x} received {wire} wire bytes for a {size}-byte v2"
    for n in net:
        dc = replication(n)["delta"]
        # With deltas off on the coordinator only, the publisher (delta=1) cannot know that
        # no plan will name a base: it encodes v2's deltas ahead of demand, and sends none.
        zero = ("decoded", "sent", "received", "failed", "whole", "ahead_hits", "forwarded")
        if where != "coordinator" or n.name != "A":
            zero += ("encoded",)
        else:
            assert dc["encoded"] == dc["ahead_encoded"], f"A encoded on demand: {dc}"
        assert all(dc[k] == 0 for k in zero), f"{n.name} used deltas with delta=0 ({where}): {dc}"
        assert "can come as deltas" not in log_text(n), n.log_tail()


@pytest.mark.limit(90)
def test_mixed_content(net, tmp_path):
    """v1 -> v2 with a bf16 tensor and an F32 one (width 4) updated in a few elements, a
    tensor whose dtype changes (BF16 -> F16, same bytes long), one whose shape grows, a new
    tensor, and a plain file changed in place (chunk deltas, width 1): B and C end
    identical; the retyped, grown and new tensors travel whole, the rest as deltas, so the
    wire carries about the whole ones plus a few percent of the others."""
    ring(net, ["A", "B", "C"])
    rng = np.random.default_rng(77)
    attn = to_bf16(rng.standard_normal((2048, 1024), dtype=np.float32) * 0.02)
    mlp = rng.standard_normal((1024, 1024), dtype=np.float32) * 0.02
    cast = rng.standard_normal((1024, 1024), dtype=np.float32) * 0.02
    grow = to_bf16(rng.standard_normal((768, 1024), dtype=np.float32) * 0.02)
    fresh = rng.standard_normal((256, 1024), dtype=np.float32)
    data = rng.integers(0, 256, 8 << 20, dtype=np.uint8)

    mlp2 = mlp.copy().reshape(-1).view(np.uint32)  # 2% of the f32 weights move in their low bits
    idx = rng.choice(mlp2.size, mlp2.size // 50, replace=False)
    mlp2[idx] += rng.integers(1, 1 << 10, idx.size, dtype=np.uint32)
    data2 = data.copy()  # 0.2% of the plain file's bytes rewritten in place
    pos = rng.choice(data2.size, data2.size // 500, replace=False)
    data2[pos] ^= rng.integers(1, 256, pos.size, dtype=np.uint8)

    def version(root, tensors, blob):
        os.makedirs(root)
        write_safetensors(os.path.join(root, "model.safetensors"), tensors)
        with open(os.path.join(root, "data.bin"), "wb") as f:
            f.write(blob.tobytes())
        with open(os.path.join(root, "config.json"), "w") as f:
            f.write('{"model": "mixed"}\n')
        return root

    v1 = version(str(tmp_path / "v1"), {
        "attn.weight": ("BF16", attn), "mlp.weight": ("F32", mlp),
        "cast.weight": ("BF16", to_bf16(cast)), "grow.weight": ("BF16", grow[:512])}, data)
    v2 = version(str(tmp_path / "v2"), {
        "attn.weight": ("BF16", rl_step({"t": attn}, 0.02, 3)["t"]),
        "mlp.weight": ("F32", mlp2.view(np.float32).reshape(mlp.shape)),
        "cast.weight": ("F16", cast.astype(np.float16)), "grow.weight": ("BF16", grow),
        "fresh.weight": ("F32", fresh)}, data2)
    whole = (cast.size * 2 + grow.nbytes + fresh.nbytes)  # retyped, grown, new: no base
    deltas = attn.nbytes + mlp.nbytes + data.nbytes         # same place, same dtype and length

    net.wait_version("v1", net.publish("A", v1, "v1"))
    before = {n: replication(net[n]) for n in "BC"}
    net.wait_version("v2", net.publish("A", v2, "v2"))
    for x in "BC":
        n = net[x]
        assert_identical(v2, n, "v2")
        after = replication(n)
        wire = grew(before[x], after, "wire_bytes_received")
        print(f"{x}: {wire} wire bytes; whole tensors {whole}, delta-able {deltas}; {after['delta']}")
        assert grew(before[x], after, "delta", "received") >= 4, after["delta"]  # attn, mlp, 2 chunks
        assert grew(before[x], after, "delta", "failed") == 0, after["delta"]
        assert whole <= wire <= whole + 0.08 * deltas, \
            f"{x} received {wire} wire bytes: want the {whole} bytes of new/retyped/grown tensors " \
            f"plus at most 8% of the {deltas} bytes that can come as deltas"


# --------------------------------------------------------------------------
# a hostile donor


DELTA_HDR = 16  # fs/common/delta.h: "HWDL", format 1, width, reserved, shard length


def delta_header(length, width=2):
    return b"HWDL" + bytes([1, width, 0, 0]) + struct.pack("<Q", length)


def zstd_zeros(nbytes, declare):
    """A zstd frame of @nbytes zero bytes (the zstd CLI at level 1: ~36 KiB for 1 GiB),
    declaring its content size in the frame header when @declare."""
    args = ["zstd", "-1", "-c", "-q"] + ([f"--stream-size={nbytes}"] if declare else [])
    head = subprocess.Popen(["head", "-c", str(nbytes), "/dev/zero"], stdout=subprocess.PIPE)
    try:
        cp = subprocess.run(args, stdin=head.stdout, capture_output=True, timeout=60)
    finally:
        head.stdout.close()
        head.wait(timeout=10)
    assert cp.returncode == 0 and cp.stdout[:4] == b"\x28\xb5\x2f\xfd", cp.stderr
    return cp.stdout


class RogueDonor:
    """Not an hwfs node: a DEALER joined to the coordinator as @name (an --insecure cluster)
    claiming to hold version @holds (name -> digest) complete, and a ROUTER it listens on
    for GETs, both served by a thread.  It heartbeats, ANNOUNCEs @announce (version,
    digest, manifest bytes) once welcomed, and answers each GET through @answer(hash, base,
    attempt) -> list of (fields, payload) SHARD pieces (or None: MISSING)."""

    def __init__(self, coord_url, name, holds, announce, answer):
        import zmq
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.url = f"tcp://127.0.0.1:{port}"
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.ROUTING_ID, name.encode())
        self.dealer.connect(coord_url)
        self.name, self.holds, self.announce, self.answer = name, holds, announce, answer
        self.welcomed = threading.Event()
        self.stop = threading.Event()
        self.attempts = {}  # hash -> GETs seen for it
        self.gets = []      # (hash, base) of every GET entry, in order
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _send(self, sock, t, payload=None, ident=None, **fields):
        hdr = json.dumps({"v": 2, "t": t, **fields}, separators=(",", ":")).encode()
        frames = ([ident] if ident is not None else []) + [hdr] + ([payload] if payload is not None else [])
        sock.send_multipart(frames)

    def _hello(self):
        self._send(self.dealer, "HELLO", node=self.name, listen=self.url, current=None,
                   versions=[{"name": v, "digest": d, "complete": True} for v, d in self.holds.items()])

    def _on_get(self, ident, h):
        hashes, bases = h["hashes"], h.get("bases") or []
        for i, hx in enumerate(hashes):
            base = bases[i] if i < len(bases) else "0" * 32
            k = self.attempts.get(hx, 0)
            self.attempts[hx] = k + 1
            self.gets.append((hx, base))
            pieces = self.answer(hx, None if base == "0" * 32 else base, k)
            if pieces is None:
                self._send(self.router, "MISSING", ident=ident, req=h["req"], hash=hx)
                continue
            for fields, payload in pieces:
                self._send(self.router, "SHARD", payload, ident=ident, req=h["req"], hash=hx,
                           size=len(payload), **fields)

    def _run(self):
        zmq = self.zmq
        poller = zmq.Poller()
        poller.register(self.dealer, zmq.POLLIN)
        poller.register(self.router, zmq.POLLIN)
        last = 0.0
        try:
            while not self.stop.is_set():
                if time.monotonic() - last >= 0.5:
                    self._hello()
                    last = time.monotonic()
                for sock, _ in poller.poll(50):
                    frames = sock.recv_multipart()
                    if sock is self.dealer:
                        msg = json.loads(frames[0])
                        if msg["t"] == "WELCOME" and not self.welcomed.is_set():
                            version, digest, manifest = self.announce
                            self._send(self.dealer, "ANNOUNCE", manifest, version=version, digest=digest)
                            self.welcomed.set()
                    else:
                        msg = json.loads(frames[1])
                        if msg["t"] == "GET":
                            self._on_get(frames[0], msg)
        except Exception as e:  # reported by the test
            self.error = repr(e)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)
        self.router.close(0)
        self.dealer.close(0)
        self.ctx.term()


def zstd(data):
    """@data compressed as one zstd frame (level 1) that declares its content size."""
    cp = subprocess.run(["zstd", "-1", "-c", "-q", f"--stream-size={len(data)}"], input=data,
                        capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def xor_delta(base, new, width=2):
    """The delta of @new against @base as fs/common/delta.h encodes it: the XOR, shuffled by
    element width (all first bytes of the elements, then all second bytes...), in one zstd
    frame behind the 16-byte header."""
    x = np.bitwise_xor(np.frombuffer(base, np.uint8), np.frombuffer(new, np.uint8))
    return delta_header(len(new), width) + zstd(x.reshape(-1, width).T.tobytes())


def shard_map(manifest, root):
    """hash -> (file path, offset, length) of every extent of @manifest (JSON bytes), the
    files being under @root."""
    out = {}
    for f in json.loads(manifest)["files"]:
        for off, length, h in f.get("extents", []):
            out[h] = (os.path.join(root, f["path"]), off, length)
    return out


def read_range(path, off, length):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(length)


@pytest.mark.limit(120)
def test_hostile_donor_deltas_are_refused(net, tmp_path):
    """A rogue peer joins the (--insecure) cluster claiming v1, announces v2 with its real
    manifest, and so becomes A's only donor of v2, with base v1.  To each GET it first
    answers with hostile deltas — a total larger than the shard, a base that was not asked,
    a piece past its total, then a decompression bomb (a zstd frame declaring 1 GiB, one
    declaring no size, one declaring the shard's 4 MiB but holding 1 GiB), a valid header
    followed by garbage, or the right delta followed by trailing bytes, and a delta where the
    shard was asked whole — and only then with the whole shard.  A stays alive, its peak RSS grows by far less than the bomb, it logs
    every refusal, and v2 ends byte-identical."""
    start(net, ["A"], extra=["-o", "donor_backoff_max_ms=400"])
    a = net["A"]
    v1, v2 = rl_versions(tmp_path)
    d1 = net.publish("A", v1, "v1")
    bases = shard_map(a.run("manifest", "v1").stdout.encode(), v1)

    # v2's real manifest and digest, from a separate single-node mount of the same files
    solo = HwfsMount()
    base._ACTIVE.append(solo)
    try:
        solo.mount()
        solo.run("publish", v2, "v2")
        manifest = solo.run("manifest", "v2").stdout.strip().encode()
        d2 = solo.version("v2")["digest"]
    finally:
        try:
            solo.cleanup()
        finally:
            base._ACTIVE.remove(solo)
    shards = shard_map(manifest, v2)
    gib = 1 << 30
    bomb_declared = zstd_zeros(gib, declare=True)       # frame content size: 1 GiB
    bomb_undeclared = zstd_zeros(gib, declare=False)    # no content size in the frame
    assert bomb_declared[4] & 0xC0 == 0x80 and struct.unpack("<I", bomb_declared[6:10])[0] == gib, \
        "the zstd CLI did not declare the frame's 1 GiB content size where expected"
    bomb_lying = bomb_declared[:6] + struct.pack("<I", TENSOR_BYTES) + bomb_declared[10:]  # says 4 MiB

    tensor_hashes = []

    def answer(h, base_hex, k):
        if h not in shards:
            return None
        path, off, length = shards[h]
        data = read_range(path, off, length)
        if h not in tensor_hashes:
            tensor_hashes.append(h)
        i = tensor_hashes.index(h)
        enc = {"enc": "xor-zstd", "base": base_hex}
        if base_hex is not None:
            if k == 0:    # a delta longer than the shard itself
                return [({**enc, "offset": 0, "total": length + 1}, b"\0" * 4096)]
            if k == 1:    # against a base that was not asked
                return [({**enc, "base": "ab" * 16, "offset": 0, "total": 4096}, b"\0" * 4096)]
            if k == 2:    # a piece past the delta's total (a first piece: a later one
                # that starts no transfer is a stray and is ignored, not refused)
                return [({**enc, "offset": 0, "total": 4096}, b"\0" * 8192)]
            if i % 5 == 4:  # the right delta, then trailing bytes
                body = xor_delta(read_range(*bases[base_hex]), data) + b"trailing"
            else:           # a bomb, or garbage behind a valid header
                body = delta_header(length) + [bomb_declared, bomb_undeclared, bomb_lying,
                                               os.urandom(2000)][i % 5]
            # each rebuild fails: the shard is asked whole
            return [({**enc, "offset": 0, "total": len(body)}, body)]
        if h not in asked_whole:  # a delta, though the shard was asked whole
            asked_whole.add(h)
            return [({"enc": "xor-zstd", "base": "cd" * 16, "offset": 0, "total": 4096}, b"\0" * 4096)]
        piece = 1 << 20
        return [({"offset": o, "total": length}, data[o:o + piece]) for o in range(0, length, piece)]

    asked_whole = set()
    pid = int(a.status()["pid"])
    hwm0 = base.proc_status_bytes(pid, "VmHWM")
    rogue = RogueDonor(net.coord.url, "R", {"v1": d1}, ("v2", d2, manifest), answer)
    try:
        assert rogue.welcomed.wait(10), f"the rogue was not welcomed\n{net.coord.log_tail()}"
        net.wait_version("v2", d2, nodes=[a], timeout=60)
    finally:
        rogue.close()
    assert rogue.error is None, f"the rogue's thread failed: {rogue.error}"
    assert a.healthy(), f"A died\n{a.log_tail()}"
    hwm1 = base.proc_status_bytes(pid, "VmHWM")
    assert_identical(v2, a, "v2")
    assert a.run("verify", "v2", check=False).returncode == 0, "A's v2 does not verify"

    log = log_text(a)
    for why in ("a delta of an impossible length", "a delta against another base",
                "a delta piece outside its delta", "a delta that was not asked for"):
        assert f"malformed piece from {rogue.url} for v2: {why}" in log, f"A did not log {why!r}:\n{a.log_tail()}"
    assert log.count(f"bad delta from {rogue.url} for v2") >= TENSORS, a.log_tail()
    for why in ("the zstd frame declares 1073741824 bytes, the shard has 4194304",
                "the zstd frame does not declare its content size", "zstd: ",  # (too small a buffer)
                "no zstd frame after the delta header", "8 trailing bytes after the zstd frame"):
        assert f"bad delta from {rogue.url} for v2 ({why}" in log, f"A did not log {why!r}:\n{a.log_tail()}"
    rd = replication(a)["delta"]
    assert rd["failed"] >= TENSORS and rd["received"] == 0, rd
    based = {h for h, b in rogue.gets if b != "0" * 32}
    assert len(based) == TENSORS, f"A asked {len(based)} shards with a base, want {TENSORS}: {rogue.gets}"
    print(f"A's VmHWM {hwm0 >> 20} MiB -> {hwm1 >> 20} MiB; {rd}")
    assert hwm1 - hwm0 < 256 << 20, \
        f"A's peak RSS grew by {(hwm1 - hwm0) >> 20} MiB facing 1 GiB decompression bombs"


@pytest.mark.limit(60)
def test_protocol_version_1_is_refused(net, tmp_path):
    """A version-1 HELLO to the coordinator and a version-1 GET to a node's data socket are
    refused with a clear log line on each side, get no answer, and change nothing."""
    import zmq
    start(net, ["A"])
    a = net["A"]
    src = model_dir(str(tmp_path / "v1"), bf16_model(1, n=1, nbytes=1 << 20))
    net.publish("A", src, "v1")
    h = json.loads(a.run("manifest", "v1").stdout)["shards"][0][0]
    before = replication(a)

    ctx = zmq.Context()
    socks = []
    try:
        for url, ident in ((net.coord.url, b"old"), (a.url, b"oldpuller")):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.ROUTING_ID, ident)
            s.connect(url)
            socks.append(s)
        socks[0].send(json.dumps({"v": 1, "t": "HELLO", "node": "old", "listen": "tcp://127.0.0.1:1",
                                  "versions": [], "current": None}).encode())
        socks[1].send(json.dumps({"v": 1, "t": "GET", "req": 1, "hashes": [h]}).encode())
        assert poll(lambda: V1_REFUSAL in net.coord.log_text() and V1_REFUSAL in log_text(a), timeout=10), \
            f"no {V1_REFUSAL!r} in the logs:\ncoordinator:\n{net.coord.log_tail()}\nA:\n{a.log_tail()}"
        replies = [s.recv_multipart() for s in socks if s.poll(500)]
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    assert replies == [], f"a version-1 message was answered: {replies}"
    cs = a.try_cluster_status()
    assert node_view(cs, "old") is None, f"a version-1 HELLO joined: {cs}"
    after = replication(a)
    assert (after["bytes_sent"], after["wire_bytes_sent"]) == (before["bytes_sent"], before["wire_bytes_sent"]), \
        f"A answered a version-1 GET: {before} -> {after}"


@pytest.mark.limit(60)
def test_coordinator_logs_a_version_1_peer_once(net, tmp_path):
    """20 version-1 HELLOs from one peer: the coordinator refuses each, and logs the refusal
    once, naming the peer (docs/protocol.md §6), so such a peer cannot flood its log."""
    import zmq
    start(net, ["A"])
    a = net["A"]
    refused0 = (a.try_cluster_status() or {}).get("refused_messages", 0)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    try:
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, b"oldnode")
        s.connect(net.coord.url)
        hello = json.dumps({"v": 1, "t": "HELLO", "node": "oldnode", "listen": "tcp://127.0.0.1:1",
                            "versions": [], "current": None}).encode()
        for _ in range(20):
            s.send(hello)
        # a version-2 message of a peer that never joined is refused and counted: once it
        # is, the coordinator has read the 20 before it (one connection, in order)
        s.send(json.dumps({"v": 2, "t": "STATUS_REQ", "req": 1}).encode())
        assert poll(lambda: (a.try_cluster_status() or {}).get("refused_messages", 0) > refused0,
                    timeout=15, interval=0.2), "the coordinator did not count the peer's STATUS_REQ"
    finally:
        s.close(0)
        ctx.term()
    lines = [x for x in net.coord.log_text().splitlines() if V1_REFUSAL in x]
    assert len(lines) == 1 and "oldnode" in lines[0], \
        f"the coordinator logged {len(lines)} line(s) for 20 version-1 messages of one peer: {lines[:3]}"
