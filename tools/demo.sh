#!/usr/bin/env bash
# demo.sh — the whole mission on one machine: a coordinator and three nodes
# (A, B, C) on loopback, a C engine registered on each node, a trainer writing
# v1 into A's mount and publishing v2, then two trainer ranks publishing v3
# shard by shard (hwfs.torch.publish), replication to B and C, the engines
# shadow-loading each version as it arrives, one cluster-wide `hwfs commit`
# per version, and every engine then answering the committed version (its
# digest checked against the daemon's).  Prints a timeline: arrival per node,
# loaded per engine, commit start/end, serving and swap pause per engine.
#
# Everything lives in temporary dirs (stores on /dev/shm); everything this
# script starts (coordinator, daemons, engines) is stopped by its pid and the
# dirs removed on exit, also on failure or Ctrl-C.
#
#   tools/demo.sh            (or: make demo)
#   HWFS_BIN=/path/to/hwfs HWFS_ENGINE_BIN=/path/to/hwfs-engine tools/demo.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HWFS=${HWFS_BIN:-$REPO/build/hwfs}
ENGINE=${HWFS_ENGINE_BIN:-$REPO/build/hwfs-engine}
PYTHON=${PYTHON:-python3}
N_TENSORS=${DEMO_TENSORS:-40}
TENSOR_MIB=${DEMO_TENSOR_MIB:-6.4} # 40 x 6.4 MiB = 256 MiB
NODES=(A B C)

[ -x "$HWFS" ] || { echo "demo: $HWFS not found; run make first" >&2; exit 1; }
[ -x "$ENGINE" ] || { echo "demo: $ENGINE not found; run make first" >&2; exit 1; }

WORK=$(mktemp -d /dev/shm/hwfs-demo-XXXXXX)
MNTROOT=$(mktemp -d /tmp/hwfs-demo-mnt-XXXXXX)
SRC2=$WORK/src-v2
mkdir -p "$SRC2"
declare -A MNT STORE ENGPID
for n in "${NODES[@]}"; do
	MNT[$n]=$MNTROOT/$n
	STORE[$n]=$WORK/store-$n
	mkdir -p "${MNT[$n]}" "${STORE[$n]}"
done
COORDPID= WATCH=
export HWFS_MOUNT=${MNT[A]}

mounted() { awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/mounts; }

# Give a process we started 5 s to exit, then SIGKILL it.
wait_or_kill() {
	local pid=$1 i
	for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null || true
}

# Stop a process we started: SIGTERM, then SIGKILL after 5 s.
stop_pid() {
	local pid=$1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	wait_or_kill "$pid"
}

cleanup() {
	local rc=$? n pid
	set +e
	stop_pid "$WATCH"
	for n in "${NODES[@]}"; do stop_pid "${ENGPID[$n]:-}"; done
	for n in "${NODES[@]}"; do
		mounted "${MNT[$n]}" || continue
		pid=$("$HWFS" status --json -m "${MNT[$n]}" 2>/dev/null |
			"$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null)
		timeout 60 "$HWFS" umount "${MNT[$n]}" >/dev/null 2>&1 || fusermount3 -u -z "${MNT[$n]}" 2>/dev/null
		[ -n "$pid" ] && wait_or_kill "$pid"
	done
	stop_pid "$COORDPID"
	for n in "${NODES[@]}"; do mounted "${MNT[$n]}" || rmdir "${MNT[$n]}" 2>/dev/null; done
	rmdir "$MNTROOT" 2>/dev/null
	rm -rf "$WORK"
	[ $rc -eq 0 ] || echo "demo: failed (exit $rc)" >&2
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -t 1 ]; then B=$'\033[1m' N=$'\033[0m'; else B='' N=''; fi
step() { printf '\n%s== %s%s\n' "$B" "$*" "$N"; }

# The demo's small Python helpers (model, engine sockets and logs, timeline)
# in one file, called as `py VERB ARGS`.
cat >"$WORK/demo_helpers.py" <<'EOF'
import json, os, socket, subprocess, sys, time

def engine_query(path):
    """One request line to the engine's unix socket @path: its JSON answer
    (version, digest, ...)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"{}\n")
        buf = b""
        while not buf.endswith(b"\n"):
            c = s.recv(1 << 16)
            if not c:
                break
            buf += c
    return json.loads(buf)

def status(mnt):
    """`hwfs status --json` of the mount @mnt."""
    return json.loads(subprocess.run([os.environ["HWFS"], "status", "--json", "-m", mnt],
                                     stdout=subprocess.PIPE, check=True).stdout)

def model(v1dir, v2dir, n, mib):
    """The trainer: v1 straight into A's mount with safetensors, v2 into a dir to publish."""
    import numpy as np
    from safetensors.numpy import save_file
    rows = int(mib * (1 << 20)) // (4 * 1024)
    v1, v2 = {}, {}
    for i in range(n):
        rng = np.random.default_rng([42, i])
        bits = rng.integers(0, 1 << 32, size=(rows, 1024), dtype=np.uint32)
        t = (bits & np.uint32(0xBFFFFFFF)).view(np.float32)  # finite float32
        v1[f"model.layers.{i}.weight"] = t
        # an RL step: 2% of the elements of every tensor move by one ulp
        step = t.copy().reshape(-1)
        idx = rng.choice(step.size, step.size // 50, replace=False)
        step[idx] = np.nextafter(step[idx], np.float32(np.inf))
        v2[f"model.layers.{i}.weight"] = step.reshape(t.shape)
    cfg = {"architectures": ["DemoForCausalLM"], "num_hidden_layers": n, "hidden_size": 1024}
    for d, tensors in ((v1dir, v1), (v2dir, v2)):
        save_file(tensors, f"{d}/model.safetensors", metadata={"format": "np"})
        with open(f"{d}/config.json", "w") as f:
            json.dump(cfg, f, indent=2)
    print(f"  {n} tensors of {rows * 4096 / 2**20:.1f} MiB; v2 moves 2% of the elements of "
          "every tensor by one ulp (an RL step)")

def wire(out, nodes):
    """Each node's replication counters into @out; with an earlier @out, what v2 moved."""
    now = {n: status(m)["replication"] for n, m in (x.split("=", 1) for x in nodes)}
    if os.path.exists(out):
        with open(out) as f:
            was = json.load(f)
        for n, r in now.items():
            got = r["bytes_received"] - was[n]["bytes_received"]
            wire = r["wire_bytes_received"] - was[n]["wire_bytes_received"]
            deltas = r["delta"]["received"] - was[n]["delta"]["received"]
            if got:
                print(f"  node {n}: {got / 2**20:6.1f} MiB of shards rebuilt from "
                      f"{wire / 2**20:5.1f} MiB on the wire ({wire / got:.1%}; {deltas} deltas)")
    with open(out, "w") as f:
        json.dump(now, f)

def watch(version, t0, out, nodes):
    """Until the engine of every node of @nodes (names) logged @version loaded:
    print each arrival (the engine's "arrived" event, sent by its daemon when
    the version is sealed there) and each load as it happens, in ms after @t0
    (epoch s)."""
    t0, seen, end = float(t0), {}, time.time() + 120
    while time.time() < end:
        for name in nodes:
            ev = engine_log(os.path.join(os.environ["WORK"], f"eng-{name}.log"), version)
            if "refused" in ev:
                sys.exit(f"demo: eng-{name} refused {version}: {ev['refused'][1]}")
            for what, label in (("arrived", f"node {name}: {version} sealed there"),
                                ("loaded", f"engine eng-{name}: {version} shadow-loaded")):
                if what in ev and (name, what) not in seen:
                    seen[(name, what)] = ev[what]
                    print(f"  {(ev[what] - t0) * 1000:+8.0f} ms  {label}", flush=True)
        if all((name, "loaded") in seen for name in nodes):
            break
        time.sleep(0.02)
    else:
        sys.exit(f"demo: {version} not loaded everywhere after 120 s: {sorted(seen)}")
    json.dump({"t0": t0}, open(out, "w"))

def commit(mnt, version, out):
    """`hwfs commit` on @mnt, timed (the engines' swaps are read from their logs)."""
    t0 = time.time()
    p = subprocess.run([os.environ["HWFS"], "commit", version, "-m", mnt], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    t1 = time.time()
    sys.stdout.write("".join("  | " + l + "\n" for l in p.stdout.splitlines()))
    print(f"  ({(t1 - t0) * 1000:.1f} ms)")
    if p.returncode != 0:
        sys.exit(f"demo: hwfs commit {version} failed ({p.returncode})")
    json.dump({"start": t0, "end": t1}, open(out, "w"))

def engine_log(path, version):
    """What an engine's stderr says about @version: {"arrived": t, "loaded": t,
    "refused": (t, reason), "swapped": (t, pause)}, t in epoch seconds; its lines
    start with a UTC timestamp (2026-11-23T15:09:53.731Z hwfs-engine[NAME]: ...)."""
    import datetime
    out = {}
    for line in open(path, errors="replace"):
        parts = line.split(" ", 2)
        if len(parts) < 3:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=datetime.timezone.utc).timestamp()
        except ValueError:
            continue
        msg = parts[2].strip()
        if msg == f"arrived {version}":
            out.setdefault("arrived", t)
        elif msg.startswith(f"loaded {version}:"):
            out["loaded"] = t
        elif msg.startswith(f"refused {version}:"):
            out["refused"] = (t, msg.split(": ", 1)[1])
        elif msg.startswith("swapped ") and f"-> {version}: pause" in msg:
            out["swapped"] = (t, msg.rsplit("pause ", 1)[1])
    return out

def check(version, nodes_engines):
    """Every engine answers @version with the digest its node's daemon has for it."""
    bad = 0
    for arg in nodes_engines:
        mnt, name, path = arg.split("=", 2)
        digest = next(v["digest"] for v in status(mnt)["versions"] if v["name"] == version)
        end = time.time() + 10   # the engine swaps when its daemon tells it; give it a moment
        ans = engine_query(path)
        while ans.get("version") != version and time.time() < end:
            time.sleep(0.01)
            ans = engine_query(path)
        ok = ans.get("version") == version and ans.get("digest") == digest
        bad += not ok
        print(f"  {name}: {json.dumps(ans)}  {'ok' if ok else 'WRONG, daemon digest ' + digest}")
    if bad:
        sys.exit(f"demo: {bad} engine(s) do not serve {version}")

def timeline(version, watchf, commitf, nodes):
    """One chronological list from the own log lines (1 ms) of the engines of
    @nodes (names) and the commit, timed around the command."""
    t0, c = json.load(open(watchf))["t0"], json.load(open(commitf))
    ev = [(c["start"], f"hwfs commit {version}: start"),
          (c["end"], f"hwfs commit {version}: end ({(c['end'] - c['start']) * 1000:.1f} ms)")]
    for name in nodes:
        path = os.path.join(os.environ["WORK"], f"eng-{name}.log")
        end = time.time() + 5    # the log line follows the swap by a moment
        log = engine_log(path, version)
        while "swapped" not in log and time.time() < end:
            time.sleep(0.05)
            log = engine_log(path, version)
        if "swapped" not in log:
            sys.exit(f"demo: eng-{name} logged no swap to {version}")
        if "arrived" in log:
            ev.append((log["arrived"], f"node {name}: {version} sealed there (its engine is told)"))
        ev.append((log["loaded"], f"engine eng-{name}: {version} shadow-loaded (mapped, every byte verified)"))
        ev.append((log["swapped"][0], f"engine eng-{name}: swapped to {version}, serving pause {log['swapped'][1]}"))
    for t, what in sorted(ev):
        print(f"  {(t - t0) * 1000:+9.1f} ms  {what}")
    print("  (engine lines carry 1 ms timestamps; the engine reports its pause in whole\n"
          "   microseconds, rounded up: 1 us is a pointer swap under 1 us)")

verb, args = sys.argv[1], sys.argv[2:]
if verb == "model":
    model(args[0], args[1], int(args[2]), float(args[3]))
elif verb == "watch":
    watch(args[0], args[1], args[2], args[3:])
elif verb == "commit":
    commit(args[0], args[1], args[2])
elif verb == "check":
    check(args[0], args[1:])
elif verb == "timeline":
    timeline(args[0], args[1], args[2], args[3:])
elif verb == "wire":
    wire(args[0], args[1:])
elif verb == "query":
    print(json.dumps(engine_query(args[0])))
else:
    sys.exit(f"demo_helpers: unknown verb {verb}")
EOF
py() { HWFS=$HWFS WORK=$WORK "$PYTHON" "$WORK/demo_helpers.py" "$@"; }
now() { date +%s.%N; }
CHECK_ARGS=()
for n in "${NODES[@]}"; do CHECK_ARGS+=("${MNT[$n]}=eng-$n=$WORK/eng-$n.sock"); done

step "A coordinator on loopback (it picks its port)"
"$HWFS" coord --listen 'tcp://127.0.0.1:*' --state "$WORK/coord" --insecure -f >"$WORK/coord.log" 2>&1 &
COORDPID=$!
COORD=
for i in $(seq 100); do
	COORD=$(sed -n 's/.*coord: listening on \(tcp:[^ ]*\).*/\1/p' "$WORK/coord.log" | head -1)
	[ -n "$COORD" ] && break
	kill -0 "$COORDPID" 2>/dev/null || { cat "$WORK/coord.log" >&2; exit 1; }
	sleep 0.1
done
[ -n "$COORD" ] || { echo "demo: the coordinator did not log its endpoint" >&2; exit 1; }
echo "  coordinator pid $COORDPID listening on $COORD (--insecure: no keys, loopback only)"

step "Three nodes join it: hwfs mount MNT --join $COORD --node N --listen tcp://127.0.0.1:*"
for n in "${NODES[@]}"; do
	"$HWFS" mount "${MNT[$n]}" --store "${STORE[$n]}" --capacity 1G \
		--join "$COORD" --node "$n" --listen 'tcp://127.0.0.1:*' --insecure
done
for i in $(seq 300); do
	alive=$("$HWFS" status --cluster --json -m "${MNT[A]}" | "$PYTHON" -c \
		'import json,sys; print(sum(1 for n in json.load(sys.stdin).get("nodes", []) if n.get("alive")))')
	[ "$alive" = "${#NODES[@]}" ] && break
	sleep 0.1
done
[ "$alive" = "${#NODES[@]}" ] || { echo "demo: the cluster did not form" >&2; exit 1; }
"$HWFS" status --cluster -m "${MNT[A]}"

step "A C engine on each node: hwfs-engine -m MNT --name eng-N --listen SOCKET"
for n in "${NODES[@]}"; do
	"$ENGINE" -m "${MNT[$n]}" --name "eng-$n" --listen "$WORK/eng-$n.sock" 2>"$WORK/eng-$n.log" &
	ENGPID[$n]=$!
done
for n in "${NODES[@]}"; do
	for i in $(seq 100); do
		[ -S "$WORK/eng-$n.sock" ] && py query "$WORK/eng-$n.sock" >/dev/null 2>&1 && break
		kill -0 "${ENGPID[$n]}" 2>/dev/null || { cat "$WORK/eng-$n.log" >&2; exit 1; }
		sleep 0.1
	done
	echo "  eng-$n (pid ${ENGPID[$n]}) answers: $(py query "$WORK/eng-$n.sock")"
done

step "v1: the trainer writes it with safetensors straight into A's mount, then hwfs seal v1"
echo "  ($N_TENSORS tensors, ~256 MiB; v2, an RL step of it, is written to $SRC2)"
T0=$(now)
py watch v1 "$T0" "$WORK/watch-v1.json" "${NODES[@]}" >"$WORK/watch-v1.txt" &
WATCH=$!
mkdir "${MNT[A]}/versions/v1"
py model "${MNT[A]}/versions/v1" "$SRC2" "$N_TENSORS" "$TENSOR_MIB"
"$HWFS" seal v1 -m "${MNT[A]}"
wait $WATCH
cat "$WORK/watch-v1.txt"
ls -l "${MNT[C]}/versions/v1"

step "hwfs commit v1 (two-phase: every node's engine has v1 loaded, so every node is ready)"
py commit "${MNT[B]}" v1 "$WORK/commit-v1.json"
py check v1 "${CHECK_ARGS[@]}"

step "v2: hwfs publish on A (import + seal in one step); B and C receive deltas of the changed elements"
WIRE_ARGS=()
for n in "${NODES[@]}"; do WIRE_ARGS+=("$n=${MNT[$n]}"); done
py wire "$WORK/wire.json" "${WIRE_ARGS[@]}"
T0=$(now)
py watch v2 "$T0" "$WORK/watch-v2.json" "${NODES[@]}" >"$WORK/watch-v2.txt" &
WATCH=$!
"$HWFS" publish "$SRC2" v2 -m "${MNT[A]}"
wait $WATCH
cat "$WORK/watch-v2.txt"
py wire "$WORK/wire.json" "${WIRE_ARGS[@]}"
for n in "${NODES[@]}"; do "$HWFS" status -m "${MNT[$n]}" | sed -n "s/^engine: */  node $n: engine /p"; done

step "Per-tensor view of v2 on C (first entries) and their xattrs"
ls "${MNT[C]}/versions/v2/tensors" | head -5 || true
getfattr -d -m 'user.hwfs' "${MNT[C]}/versions/v2/tensors/model.layers.0.weight" 2>/dev/null || true

step "hwfs diff v1 v2 --elements (last lines: the total)"
"$HWFS" diff v1 v2 --elements -m "${MNT[C]}" | tail -4

step "Deduplication on every node: stored bytes vs logical bytes"
for n in "${NODES[@]}"; do
	"$HWFS" status --json -m "${MNT[$n]}" | "$PYTHON" -c '
import json, sys
s = json.load(sys.stdin)
used = s["store"]["used_bytes"]
logical = sum(v["bytes"] for v in s["versions"])
print(f"  node {sys.argv[1]}: logical {logical / 2**20:6.1f} MiB, stored {used / 2**20:6.1f} MiB ({used / logical:.0%})")
' "$n"
done

step "hwfs commit v2, from node B: every engine swaps to the v2 it already loaded"
py commit "${MNT[B]}" v2 "$WORK/commit-v2.json"
py check v2 "${CHECK_ARGS[@]}"
for n in "${NODES[@]}"; do echo "  node $n: current -> $(readlink "${MNT[$n]}/current")"; done
for n in "${NODES[@]}"; do "$HWFS" status -m "${MNT[$n]}" | sed -n "s/^engine: */  node $n: engine /p"; done
"$PYTHON" -c 'import sys; from safetensors import safe_open
f = safe_open(sys.argv[1], framework="numpy")
print("  C: current/model.safetensors opens with safetensors:", len(list(f.keys())), "tensors")' \
	"${MNT[C]}/current/model.safetensors"

step "v3: a sharded trainer step: 2 ranks (torch.distributed.run, gloo) publish into A's mount"
echo "  each rank maps v2 zero-copy, takes its half of every tensor (DTensor Shard(0)), moves it"
echo "  by one ulp and writes only that half with hwfs.torch.publish; sealed once both are in"
cat >"$WORK/sharded_step.py" <<'EOF2'
import sys, numpy as np, torch, torch.distributed as dist, hwfs
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from hwfs.torch import publish
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
sd = {}
with hwfs.open(sys.argv[1]) as m, m.map("v2") as v:
    for name in v:
        full = torch.from_numpy(np.array(v[name]))  # (a demo: the copy stands for training)
        mine = torch.chunk(full, world, 0)[rank]
        mine = torch.nextafter(mine, torch.tensor(float("inf")))
        sd[name] = DTensor.from_local(mine, mesh, [Shard(0)], run_check=False,
                                      shape=full.shape, stride=full.stride())
files = publish(sd, "v3", sys.argv[1], files={"config.json": open(sys.argv[2], "rb").read()})
if rank == 0:
    print(f"  rank 0: published v3 ({', '.join(files)}), each rank wrote "
          f"{sum(t.to_local().numel() * 4 for t in sd.values()) / 2**20:.0f} MiB")
dist.destroy_process_group()
EOF2
T0=$(now)
py watch v3 "$T0" "$WORK/watch-v3.json" "${NODES[@]}" >"$WORK/watch-v3.txt" &
WATCH=$!
PYTHONPATH="$REPO/tools/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
	"$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 2 \
	"$WORK/sharded_step.py" "${MNT[A]}" "$SRC2/config.json" 2>"$WORK/sharded.err" ||
	{ cat "$WORK/sharded.err" >&2; exit 1; }
wait $WATCH
cat "$WORK/watch-v3.txt"
echo "  tensor-parallel views of v3 on C (computed, not stored): ls -U tp/ -> $(ls -U "${MNT[C]}/versions/v3/tp" | tr '\n' ' ')"
py commit "${MNT[B]}" v3 "$WORK/commit-v3.json"
py check v3 "${CHECK_ARGS[@]}"

step "GPU plane on C: status, hwfs load v2 --gpu 0, v2's tensors as DLPack (no copy)"
"$HWFS" status -m "${MNT[C]}" | sed -n 's/^gpu: */  gpu: /p'
if "$HWFS" load v2 --gpu 0 -m "${MNT[C]}" 2>"$WORK/load.err"; then
	"$HWFS" unload v2 --gpu 0 -m "${MNT[C]}"
else
	echo "  hwfs load v2 --gpu 0 refused (as it must be without a GPU): $(cat "$WORK/load.err")"
fi
PYTHONPATH="$REPO/tools/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c '
import sys, numpy as np, hwfs
with hwfs.open(sys.argv[1]) as m, m.map("v2") as v:
    name = sorted(v.keys())[0]
    a = np.from_dlpack(v.dlpack(name))
    same = a.ctypes.data == v.address(name)
    print(f"  numpy.from_dlpack({name}): {a.dtype} {a.shape}, read-only: {not a.flags.writeable},"
          f" same address as the arena mapping: {same}")
    if not same: sys.exit("demo: DLPack made a copy")
' "${MNT[C]}"

step "Timeline of v1 (ms after the trainer started writing it)"
py timeline v1 "$WORK/watch-v1.json" "$WORK/commit-v1.json" "${NODES[@]}"
step "Timeline of v2 (ms after hwfs publish v2 started)"
py timeline v2 "$WORK/watch-v2.json" "$WORK/commit-v2.json" "${NODES[@]}"

step "The engines' own event lines (stderr)"
for n in "${NODES[@]}"; do sed "s/^/  eng-$n: /" "$WORK/eng-$n.log" | tail -6; done

step "Stopping: engines, then hwfs umount on every node, then the coordinator"
for n in "${NODES[@]}"; do stop_pid "${ENGPID[$n]}"; ENGPID[$n]=; done
for n in "${NODES[@]}"; do "$HWFS" umount "${MNT[$n]}"; done
stop_pid "$COORDPID"
COORDPID=
echo "demo: done"
