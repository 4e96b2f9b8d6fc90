#!/usr/bin/env python3
"""bench_trainers.py — a sharded publish from every rank against gathering on
rank 0 and saving with safetensors (`make bench-trainers`).

A model of --gib GiB (bf16 matrices [4096, 8192], 64 MiB each; two thirds
Shard(0), one third Shard(1), over a 1-D mesh of --ranks ranks, plus a few f32
norms as plain replicated tensors) is built on every rank, each rank holding
only its own shards (random bytes, from a seed).  gloo on the CPU.  Each
repetition times, back to back, from a barrier to the end on every rank:

  publish    hwfs.torch.publish(state_dict, V, MNT): every rank pwrite()s its
             shards into the version's files; sealed once all are in
  gather     every shard gathered to rank 0 (dist.gather, tensor by tensor, so
             rank 0 ends with the full model), then safetensors.torch.save_file
             into --tmpfs (the baseline of the issue)
  gather+seal  (info) the baseline's file then copied into the mount with
             `hwfs publish`, so that it is a version too

The mount's store and the baseline files are on /dev/shm.  --preallocate
mounts the store as a serving node would (docs/design.md, section 5: its pages
allocated once, at mount), so that publishing does not pay tmpfs page
allocation, which the baseline's save_file pays in write(2).  The byte-equality
of the published version with the gathered file is checked once.  The median
of --reps is printed, with the ratio (gather / publish; > 1: publish is
faster).  Run as root (it mounts a private hwfs).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HWFS = str(REPO / "build" / "hwfs")


def worker(args):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: F401

    from hwfs.torch import publish

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    rows, cols = 4096, 8192
    n = max(1, int(args.gib * (1 << 30)) // (rows * cols * 2))
    sd, shard_info = {}, {}
    for i in range(n):
        dim = 1 if i % 3 == 2 else 0
        shape = [rows, cols]
        lshape = list(shape)
        lshape[dim] //= world
        g = torch.Generator().manual_seed(i * 1000 + rank)
        local = torch.randint(-32768, 32767, lshape, generator=g, dtype=torch.int16).view(torch.bfloat16)
        sd[f"layers.{i}.weight"] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False,
                                                      shape=torch.Size(shape), stride=(cols, 1))
        shard_info[f"layers.{i}.weight"] = dim
    for i in range(4):
        sd[f"layers.{i}.norm"] = torch.ones(rows, dtype=torch.float32) * (i + 1)
    times = {"publish": [], "gather": [], "gather+seal": []}
    for rep in range(args.reps):
        # publish
        dist.barrier()
        t0 = time.perf_counter()
        publish(sd, f"p{rep}", args.mount, max_file_bytes=args.max_file_bytes)
        dist.barrier()
        times["publish"].append(time.perf_counter() - t0)
        # gather on rank 0, save_file
        dist.barrier()
        t0 = time.perf_counter()
        full = {}
        for name, v in sd.items():
            if isinstance(v, DTensor):
                local = v.to_local().contiguous()
                parts = [torch.empty_like(local) for _ in range(world)] if rank == 0 else None
                dist.gather(local, parts, dst=0)
                if rank == 0:
                    full[name] = torch.cat(parts, dim=shard_info[name])
            elif rank == 0:
                full[name] = v
        if rank == 0:
            from safetensors.torch import save_file
            save_file(full, os.path.join(args.tmpfs, "model.safetensors"))
        del full
        dist.barrier()
        times["gather"].append(time.perf_counter() - t0)
        if rank == 0:  # (one version at a time in the arena: the machine may be small)
            if rep == 0:
                check_equal(args.mount, f"p{rep}", os.path.join(args.tmpfs, "model.safetensors"))
            subprocess.run([HWFS, "rm", f"p{rep}", "-m", args.mount], check=True,
                           capture_output=True)
            t1 = time.perf_counter()
            subprocess.run([HWFS, "publish", args.tmpfs, f"g{rep}", "-m", args.mount],
                           check=True, capture_output=True)
            times["gather+seal"].append(times["gather"][-1] + time.perf_counter() - t1)
            os.unlink(os.path.join(args.tmpfs, "model.safetensors"))
            subprocess.run([HWFS, "rm", f"g{rep}", "-m", args.mount], check=True,
                           capture_output=True)
        dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"tensors": len(sd), "bytes": sum(
                (v.numel() * v.element_size()) for v in sd.values()), "times": times}, f)
    dist.destroy_process_group()


def check_equal(mnt, version, ref):
    """Every tensor of @version byte-equal to those of file @ref."""
    from safetensors import safe_open
    vdir = os.path.join(mnt, "versions", version)
    got = {}
    for fn in sorted(os.listdir(vdir)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(vdir, fn), "pt") as f:
                for k in f.keys():
                    got[k] = os.path.join(vdir, fn)
    with safe_open(ref, "pt") as r:
        assert set(r.keys()) == set(got), "tensor names differ"
        for k in r.keys():
            with safe_open(got[k], "pt") as f:
                a, b = r.get_tensor(k), f.get_tensor(k)
                if not (a.shape == b.shape and a.view(-1).view(dtype=__import__("torch").uint8)
                        .equal(b.view(-1).view(dtype=__import__("torch").uint8))):
                    raise SystemExit(f"tensor {k} differs between publish and gather")
    print("check: the published version is byte-equal to the gathered file", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-file-bytes", type=int, default=1 << 30)
    ap.add_argument("--preallocate", action="store_true",
                    help="mount with --preallocate (the arena's pages allocated and touched "
                         "at mount, as on a serving node: no page allocation while publishing)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mount", help=argparse.SUPPRESS)
    ap.add_argument("--tmpfs", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    top = tempfile.mkdtemp(prefix="hwfs-bench-trainers-", dir="/dev/shm")
    store, base = os.path.join(top, "store"), os.path.join(top, "base")
    mnt = tempfile.mkdtemp(prefix="hwfs-bench-trainers-mnt-")
    os.makedirs(store)
    os.makedirs(base)
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools" / "python"), OMP_NUM_THREADS="1",
               HWFS_LIBRARY=str(REPO / "build" / "libhwfs.so.1"))
    out = os.path.join(top, "result.json")
    extra = ["--preallocate", "--capacity", f"{int(args.gib + 1)}G"] if args.preallocate else []
    subprocess.run([HWFS, "mount", "--store", store, mnt, *extra], check=True)
    try:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={args.ranks}", __file__, "--worker", "--mount", mnt,
                        "--tmpfs", base, "--out", out, "--reps", str(args.reps),
                        "--gib", str(args.gib), "--max-file-bytes", str(args.max_file_bytes)],
                       check=True, env=env)
        with open(out) as f:
            res = json.load(f)
    finally:
        if subprocess.run([HWFS, "umount", mnt], capture_output=True).returncode:
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
        try:
            os.rmdir(mnt)
        except OSError as e:
            print(f"note: {mnt} left behind: {e}", file=sys.stderr)
    t = res["times"]
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"\n{args.ranks} ranks, {res['tensors']} tensors, {res['bytes'] / (1 << 30):.2f} GiB, "
          f"max_file_bytes {args.max_file_bytes}, {args.reps} reps, {os.cpu_count()} CPUs, "
          f"arena {'preallocated' if args.preallocate else 'sparse'}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'method':14} {'median s':>9} {'GiB/s':>7}  all (s)")
    for k in ("publish", "gather", "gather+seal"):
        print(f"{k:14} {med[k]:9.3f} {res['bytes'] / (1 << 30) / med[k]:7.2f}  "
              + " ".join(f"{x:.3f}" for x in t[k]))
    print(f"ratio gather / publish: {med['gather'] / med['publish']:.2f}")


if __name__ == "__main__":
    main()
