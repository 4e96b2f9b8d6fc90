"""verl's checkpoint-engine contract, with hwfs.verl's "hwfs" backend, on a real mount.

Run with build/venv-verl's python (`make test-verl`; tools/install/install-verl.sh makes
the venv).  Each round is tests/verl/verl_round.py in its own process: verl's
actor and rollout code paths, the engine built through verl's registry from a
CheckpointEngineConfig(backend="hwfs", custom_backend_module="hwfs.verl"), and
verl's own MockServerAdapter as the receiver (that file says what runs).
Checked here: the tensors the rollout received are bit-exact, the version is
sealed and committed on the mount with the same bytes, and a second round that
changes a few elements of two tensors stores only those two tensors' shards.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hwfs_integration_conftest import HWFS, REPO, scaled

HERE = Path(__file__).resolve().parent
ROUND = HERE / "verl_round.py"
DOC = REPO / "docs" / "engines.md"

# Two tensors of round 2 change, a few elements each (flat index, delta).
PERTURB = [["model.layers.0.self_attn.q_proj.weight", 5, 0.5],
           ["model.layers.0.self_attn.q_proj.weight", 900, -0.25],
           ["model.layers.1.mlp.down_proj.weight", 17, 1.0]]


def make_model(root):
    """A small Llama (bf16, about 1 MiB) saved as a Hugging Face checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(root, safe_serialization=True)
    return load_file(root / "model.safetensors")


def doc_overrides(mount):
    """The verl overrides of docs/engines.md ("verl"), as written, for @mount:
    Hydra's `+` (add a key) and the `actor_rollout_ref.rollout.` prefix
    dropped, since the test applies them to verl's rollout config node itself."""
    text = DOC.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    block = next(b for b in blocks if "checkpoint_engine.backend=hwfs" in b)
    out = []
    for line in block.splitlines():
        line = line.strip().rstrip("\\").strip()
        if "checkpoint_engine." not in line:
            continue
        item = line.lstrip("+").removeprefix("actor_rollout_ref.rollout.")
        out.append(item.replace("/hotweights", mount.mnt))
    assert len(out) >= 3, block
    return out


def run_round(mount, model_dir, step, out, perturb=(), verl_check=False):
    args = [sys.executable, str(ROUND), "--mount", mount.mnt, "--model", str(model_dir),
            "--step", str(step), "--out", str(out), "--perturb", json.dumps(list(perturb)),
            "--hwfs-bin", HWFS, "--overrides", json.dumps(doc_overrides(mount))]
    if verl_check:
        args.append("--verl-check")
    cp = subprocess.run(args, capture_output=True, text=True, timeout=scaled(300), cwd=REPO)
    assert cp.returncode == 0, (f"verl round {step} failed ({cp.returncode}):\n"
                                f"{cp.stdout[-4000:]}\n{cp.stderr[-6000:]}\n"
                                f"daemon log:\n{mount.log_tail()}")
    return json.loads(cp.stdout.strip().splitlines()[-1]), cp.stdout


def bits(t):
    """The raw bytes of @t, for a bit-exact comparison."""
    return t.contiguous().view(-1).view(torch.uint8)


def assert_bit_exact(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: names differ"
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, (what, name)
        assert torch.equal(bits(got[name]), bits(t)), f"{what}: {name} differs"


@pytest.mark.limit(600)
def test_verl_send_receive_rounds(mount, tmp_path):
    model_dir = tmp_path / "model"
    want1 = make_model(model_dir)

    # round 1: the whole model, checked by verl's own MockServerAdapter too
    r1, out1 = run_round(mount, model_dir, 1, tmp_path / "r1.safetensors", verl_check=True)
    assert "Check passed, all weights are equal!" in out1
    assert r1["version"] == r1["rollout_version"] == "step-1"
    assert r1["engine"] == "hwfs.verl"
    assert_bit_exact(load_file(tmp_path / "r1.safetensors"), want1, "round 1 received")
    v1 = mount.version("step-1")
    assert v1 is not None and v1["state"] == "sealed", v1
    assert mount.status()["current"] == "step-1"  # commit=True
    assert_bit_exact(load_file(mount.vpath("step-1", "model.safetensors")), want1,
                     "round 1 on the mount")

    # round 2: a few elements of two tensors changed
    want2 = {k: v.clone() for k, v in want1.items()}
    for name, idx, delta in PERTURB:
        want2[name].view(-1)[idx] += delta
    changed = sorted({p[0] for p in PERTURB})
    assert all(not torch.equal(want1[n], want2[n]) for n in changed)
    used = mount.used_bytes()
    r2, _ = run_round(mount, model_dir, 2, tmp_path / "r2.safetensors", perturb=PERTURB)
    assert r2["version"] == r2["rollout_version"] == "step-2"
    assert_bit_exact(load_file(tmp_path / "r2.safetensors"), want2, "round 2 received")
    assert mount.status()["current"] == "step-2"
    assert_bit_exact(load_file(mount.vpath("step-2", "model.safetensors")), want2,
                     "round 2 on the mount")

    # only the changed tensors' shards are new (one shard per tensor; the
    # header is one more small shard)
    changed_bytes = sum(want2[n].numel() * want2[n].element_size() for n in changed)
    growth = mount.used_bytes() - used
    assert changed_bytes <= growth <= changed_bytes + 64 * 1024, (growth, changed_bytes)
    d = json.loads(mount.run("diff", "step-1", "step-2", "--json").stdout)
    assert d["tensors_changed"] == len(changed), d
    assert sorted(d["changed"]) == changed, d["changed"]
    assert d["tensors_same"] == len(want1) - len(changed)
    assert changed_bytes <= d["new_shard_bytes"] <= changed_bytes + 64 * 1024, d
