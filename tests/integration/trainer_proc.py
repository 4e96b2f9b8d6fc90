"""One rank of the distributed trainer tests (test_trainers.py), started by
torch.distributed.run or by the test itself (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in the environment); gloo on the CPU.

    python trainer_proc.py SCENARIO MOUNT OUTDIR [ARGS...]

Every scenario builds the same tiny Llama (seeded) on every rank; rank 0
writes what the test compares against into OUTDIR (never into the mount).
Each rank writes OUTDIR/rank<r>.json with what it saw, and exits 0 when its
part went as the scenario expects.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

torch.set_num_threads(1)

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import hwfs  # noqa: E402
import hwfs.trainers  # noqa: E402
from hwfs.torch import PublishError, publish  # noqa: E402

SHARD0 = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
SHARD1 = ("o_proj", "down_proj")


def config():
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False)


def model(seed=1):
    torch.manual_seed(seed)
    return LlamaForCausalLM(config())


def placement_of(name):
    """The placements the tests shard a Llama tensor with (1-D mesh)."""
    from torch.distributed.tensor import Replicate, Shard
    if any(k in name for k in SHARD0):
        return [Shard(0)]
    if any(k in name for k in SHARD1):
        return [Shard(1)]
    if "norm" in name and "layers.1" in name:
        return [Replicate()]
    return None  # a plain tensor


def sharded(sd, mesh, mesh2d=None):
    """@sd with its weights turned into DTensors over @mesh (from their local
    chunks: no communication); with @mesh2d, the MLP weights of layer 1 are
    sharded on both dims of a 2-D mesh."""
    from torch.distributed.tensor import DTensor, Shard
    out = {}
    for name, t in sd.items():
        if mesh2d is not None and "layers.1.mlp" in name:
            pl = [Shard(0), Shard(1)]
            c = mesh2d.get_coordinate()
            local = torch.chunk(torch.chunk(t, mesh2d.size(0), 0)[c[0]], mesh2d.size(1), 1)[c[1]]
            out[name] = DTensor.from_local(local.clone(), mesh2d, pl, run_check=False,
                                           shape=t.shape, stride=t.stride())
            continue
        pl = placement_of(name)
        if pl is None:
            out[name] = t
            continue
        if hasattr(pl[0], "dim"):
            local = torch.chunk(t, mesh.size(), pl[0].dim)[mesh.get_local_rank()].clone()
        else:
            local = t.clone()
        out[name] = DTensor.from_local(local, mesh, pl, run_check=False, shape=t.shape,
                                       stride=t.stride())
    return out


def save_reference(sd, path):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, path)


# What the swap scenario does at each step: rank 0 commits a version after the
# training step, and sets the policy every rank uses for the next swap.
SCHEDULE = {2: ("v2", "keep"), 4: ("v3", "reset"), 6: ("v4", "attenuate"), 8: ("v5", "keep")}
# the tensor each version changes (v5 changes a shape: refused)
CHANGES = {"v2": "model.layers.0.self_attn.q_proj.weight", "v3": "model.layers.1.mlp.down_proj.weight",
           "v4": "model.embed_tokens.weight", "v5": "model.layers.0.mlp.gate_proj.weight"}


def local_of(t):
    return t.to_local() if hasattr(t, "to_local") else t


def full_of(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def swap_scenario(mode, mnt, mesh, report):
    """Train a tiny Llama under DDP or FSDP2 while rank 0 commits v2..v5; swap
    at step boundaries with a policy per swap; check everything on every rank."""
    from safetensors.torch import load_file
    from hwfs.torch import TrainerSwap
    m = model(seed=99)  # not v1: the first swap must change every weight
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(m)
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        net = m
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    swap = TrainerSwap(net, opt, mnt, policy="keep", factor=0.25)
    params = dict(m.named_parameters())
    if mode == "fsdp":
        report["placements"] = sorted({str(p.placements) for p in params.values()})
    report["swaps"], report["checks"] = [], []
    g = torch.Generator().manual_seed(dist.get_rank())
    policy_next = "keep"
    for step in range(10):
        before = {n: {k: local_of(v).clone() for k, v in opt.state[p].items()}
                  for n, p in params.items() if p in opt.state}
        pbefore = {n: local_of(p).detach().clone() for n, p in params.items()}
        swap.policy = policy_next
        v = swap.maybe_swap(step)
        if v is not None:
            report["swaps"].append([step, v, swap.changed])
            want = load_file(f"{mnt}/versions/{v}/model.safetensors")
            for n, p in params.items():
                assert torch.equal(full_of(p.detach()), want[n]), f"{v}: {n} differs after the swap"
            for n, st in before.items():
                changed = n == CHANGES.get(v)
                for k, old in st.items():
                    new = local_of(opt.state[params[n]][k])
                    if k == "step" or not changed or swap.policy == "keep":
                        exp = old
                    elif swap.policy == "reset":
                        exp = torch.zeros_like(old)
                    else:
                        exp = old * 0.25
                    assert torch.equal(new, exp), f"{v} {swap.policy}: state {k} of {n}"
            report["checks"].append([v, swap.policy])
        elif swap.refused is not None and swap.refused[0] == "v5" and "refused" not in report:
            report["refused"] = swap.refused[1]
            for n, p in params.items():
                assert torch.equal(local_of(p).detach(), pbefore[n]), f"refused swap changed {n}"
        x = torch.randint(0, 128, (2, 8), generator=g)
        loss = net(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step in SCHEDULE:
            ver, policy_next = SCHEDULE[step]
            if dist.get_rank() == 0:
                r = swap.mount.call({"op": "commit", "version": ver})
                assert r.get("ok", True) is not False, r
    report["final_version"] = swap.version
    return 0


def main():
    scenario, mnt, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    args = sys.argv[4:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    report = {"rank": rank, "world": world}
    rc = 0
    if scenario == "publish":
        version, max_file = args[0], int(args[1])
        m = model()
        sd = m.state_dict()
        mesh2d = init_device_mesh("cpu", (2, world // 2)) if world >= 4 else None
        if rank == 0:
            save_reference(sd, os.path.join(outdir, "reference.safetensors"))
        names = publish(sharded(sd, mesh, mesh2d), version, mnt, max_file_bytes=max_file,
                        files={"config.json": config().to_json_string()})
        report["files"] = names
        # a state dict that differs on one rank: refused on every rank, nothing made
        bad = dict(sd)
        if rank == 1:
            bad["extra.weight"] = torch.zeros(3)
        try:
            publish(bad, version + "-bad", mnt)
            rc = 1
        except PublishError as e:
            report["mismatch"] = str(e)
    elif scenario == "publish_kill":
        # where the victim dies: among its own writes ("local"), or in the
        # middle of the ranks' exchange of Shard(1) rows ("exchange")
        version, victim, where = args[0], int(args[1]), args[2]
        sd = sharded(model().state_dict(), mesh)
        if rank != victim:
            # torchrun SIGTERMs the survivors once it sees the victim die; the survivor's
            # answer is what its publish raises (the broken collective), so it must live
            # to write it: SIGTERM is ignored here (torchrun's SIGKILL after its grace
            # period still ends a survivor that hangs, and the test's timeout sees it)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if rank == victim:
            calls = [0]
            fn = "_write_local" if where == "local" else "_write_exchanged"
            real = getattr(hwfs.trainers, fn)

            def die_mid_write(*a, **kw):
                calls[0] += 1
                if calls[0] == 3:
                    with open(os.path.join(outdir, f"rank{rank}.dying"), "w"):
                        pass
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*a, **kw)
            setattr(hwfs.trainers, fn, die_mid_write)
        try:
            publish(sd, version, mnt)
            report["error"] = None
            rc = 1  # it must not succeed
        except (PublishError, RuntimeError) as e:
            report["error"] = f"{type(e).__name__}: {e}"
    elif scenario == "swap":
        rc = swap_scenario(args[0], mnt, mesh, report)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    if scenario != "publish_kill":
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(rc)  # a dead peer can leave gloo's threads stuck at exit


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
