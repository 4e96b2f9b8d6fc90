"""Malformed *.safetensors files are stored byte-for-byte as plain files."""

import json
import os
import struct

import pytest

from conftest import assert_same_file, assert_tree_equal, make_tensors, pid_alive, save_model, sh


def _st(header, data, n=None):
    """A safetensors-like file: 8-byte LE length (@n overrides it), header, data."""
    if not isinstance(header, bytes):
        header = json.dumps(header, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header) if n is None else n) + header + data


F32x4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}

CASES = {
    "header_len_beyond_file": _st(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4,
                                  n=1000),
    "header_len_huge": _st(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4,
                           n=0xFFFFFFFFFFFFFFFF),
    "invalid_json": _st(b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]', b"\1" * 16),
    "not_an_object": _st(b'["a", 1, 2]     ', b""),
    "offsets_out_of_range": _st({"a": F32x4, "b": {"dtype": "F32", "shape": [4],
                                                   "data_offsets": [1 << 40, (1 << 40) + 16]}},
                                b"\2" * 32),
    "offsets_reversed": _st({"a": {"dtype": "F32", "shape": [0], "data_offsets": [16, 0]}}, b"\2" * 16),
    "overlapping_offsets": _st({"a": F32x4, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}},
                               b"\3" * 24),
    "unknown_dtype": _st({"a": {"dtype": "X17", "shape": [4], "data_offsets": [0, 16]}}, b"\4" * 16),
    "shape_size_mismatch": _st({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, b"\5" * 16),
    "truncated_data": _st({"a": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}},
                          b"\6" * 4000),
}


def _check_stored_as_plain(m, version, name, source, good_names):
    assert_same_file(source, m.vpath(version, name))
    v = m.version(version)
    assert v is not None and v["state"] == "sealed", v
    errs = [e for e in v["errors"] if e["file"] == name or e["file"].endswith("/" + name)]
    assert errs, f"{name} is not listed in status errors: {v['errors']}"
    assert all(isinstance(e["error"], str) and e["error"].strip() for e in errs), errs
    tdir = m.vpath(version, "tensors")
    listed = set(os.listdir(tdir)) if os.path.isdir(tdir) else set()
    assert listed == set(good_names), f"tensors/ has {sorted(listed - set(good_names))} from {name}"
    assert v["tensors"] == len(good_names)


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_stored_as_plain_file(mount, src, case):
    bad = src / f"{case}.safetensors"
    bad.write_bytes(CASES[case])
    good = make_tensors(600, n=3, prefix="good")
    save_model(src / "good.safetensors", good)
    pid = mount.pid
    os.mkdir(mount.vpath("bad"))
    sh(["cp", bad, src / "good.safetensors", mount.vpath("bad")])
    mount.run("seal", "bad")
    _check_stored_as_plain(mount, "bad", bad.name, bad, list(good))
    assert pid_alive(pid) and mount.status()["pid"] == pid, "the daemon died"
    assert mount.run("verify", "bad").returncode == 0
    mount.remount()
    _check_stored_as_plain(mount, "bad", bad.name, bad, list(good))


def test_malformed_via_publish(mount, src):
    for case, data in CASES.items():
        (src / f"{case}.safetensors").write_bytes(data)
    mount.run("publish", src, "p")
    v = mount.version("p")
    assert v["state"] == "sealed"
    assert v["tensors"] == 0
    files = {os.path.basename(e["file"]) for e in v["errors"]}
    assert files == {f"{c}.safetensors" for c in CASES}
    assert_tree_equal(src, mount.vpath("p"))


def test_only_safetensors_names_report_parse_errors(mount, src):
    """Tensors are found by content whatever the name (see
    test_hardening.py::test_hf_cache_blobs_get_a_tensor_view), but only a file
    named *.safetensors that fails to parse is reported in `errors`."""
    t = make_tensors(601, n=2)
    save_model(src / "weights.bin", t)  # valid safetensors bytes, other name
    (src / "notes.safetensors.txt").write_bytes(CASES["invalid_json"])
    mount.run("publish", src, "p")
    v = mount.version("p")
    assert v["errors"] == []
    assert_tree_equal(src, mount.vpath("p"))
