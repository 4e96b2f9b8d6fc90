"""Element-level deltas (docs/delta.md): an RL-like update moves only its changed elements.

Models are bf16 safetensors written by hand (numpy has no bfloat16): v1 random bf16
weights, v2 = v1 with ~2% of the elements of every tensor moved by one ulp, what the
bf16 rounding of a small optimizer step does.
"""

import json
import os
import struct

import numpy as np
import pytest

from .conftest import assert_identical, ring

TENSORS = 8
TENSOR_BYTES = 4 << 20  # each tensor is one shard (max_shard is 64 MiB)


def write_bf16(path, tensors):
    """Write @tensors (name -> uint16 array of bf16 bit patterns) as a BF16 safetensors file."""
    header, off = {}, 0
    for name, arr in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for arr in tensors.values():
            f.write(arr.tobytes())


def bf16_model(seed):
    """Random bf16 weights (normal, std 0.02) as uint16 bit patterns, per tensor name."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(TENSORS):
        w = (rng.standard_normal(TENSOR_BYTES // 2, dtype=np.float32) * 0.02).view(np.uint32)
        out[f"layers.{i}.weight"] = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype(np.uint16).reshape(-1, 1024)
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


def replication(node):
    return node.status()["replication"]


@pytest.mark.limit(150)
def test_rl_update_moves_only_changed_elements(net, tmp_path):
    """v2 = v1 with 2% of every tensor's elements changed reaches B and C byte-identical,
    each receiving at most 8% of v2's bytes over the wire; A encodes each delta once and
    B, a relay, forwards A's deltas as they came (it encodes nothing)."""
    ring(net, ["A", "B", "C"])
    w1 = bf16_model(1)
    v1 = model_dir(str(tmp_path / "v1"), w1)
    net.wait_version("v1", net.publish("A", v1, "v1"))
    before = {n: replication(net[n]) for n in "ABC"}

    v2 = model_dir(str(tmp_path / "v2"), rl_step(w1, 0.02, 2))
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
