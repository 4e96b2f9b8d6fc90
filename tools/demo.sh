#!/usr/bin/env bash
# demo.sh — hwfs end to end on one node: two versions of a synthetic model,
# deduplicated, diffed and committed.  Everything lives in temporary dirs
# (the store on /dev/shm) that are unmounted and removed on exit.
#
#   tools/demo.sh            (or: make demo)
#   HWFS_BIN=/path/to/hwfs tools/demo.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HWFS=${HWFS_BIN:-$REPO/build/hwfs}
PYTHON=${PYTHON:-python3}
N_TENSORS=${DEMO_TENSORS:-40}
TENSOR_MIB=${DEMO_TENSOR_MIB:-6.4} # 40 x 6.4 MiB = 256 MiB

[ -x "$HWFS" ] || { echo "demo: $HWFS not found; run make first" >&2; exit 1; }

WORK=$(mktemp -d /dev/shm/hwfs-demo-XXXXXX)
MNT=$(mktemp -d /tmp/hwfs-demo-mnt-XXXXXX)
STORE=$WORK/store
SRC1=$WORK/src-v1
SRC2=$WORK/src-v2
mkdir -p "$STORE" "$SRC1" "$SRC2"
export HWFS_MOUNT=$MNT

mounted() { awk -v m="$MNT" '$2 == m { found = 1 } END { exit !found }' /proc/mounts; }

cleanup() {
	local rc=$?
	set +e
	if mounted; then
		timeout 60 "$HWFS" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT" 2>/dev/null
	fi
	mounted || rmdir "$MNT" 2>/dev/null
	rm -rf "$WORK"
	[ $rc -eq 0 ] || echo "demo: failed (exit $rc)" >&2
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -t 1 ]; then B=$'\033[1m' N=$'\033[0m'; else B='' N=''; fi
step() { printf '\n%s== %s%s\n' "$B" "$*" "$N"; }

step "Generating a synthetic model: $N_TENSORS tensors, ~256 MiB (v1), and v2 with a tenth of them changed"
"$PYTHON" - "$SRC1" "$SRC2" "$N_TENSORS" "$TENSOR_MIB" <<'EOF'
import json, sys
import numpy as np
from safetensors.numpy import save_file

src1, src2, n, mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rows = int(mib * (1 << 20)) // (4 * 1024)
changed = set(range(0, n, 10))  # every tenth tensor
v1, v2 = {}, {}
for i in range(n):
    rng = np.random.default_rng([42, i])
    bits = rng.integers(0, 1 << 32, size=(rows, 1024), dtype=np.uint32)
    # Random finite float32 (exponent kept below 0xFF).
    t = (bits & np.uint32(0xBFFFFFFF)).view(np.float32)
    v1[f"model.layers.{i}.weight"] = t
    v2[f"model.layers.{i}.weight"] = (t * np.float32(0.5)) if i in changed else t
cfg = {"architectures": ["DemoForCausalLM"], "num_hidden_layers": n, "hidden_size": 1024}
for d, tensors in ((src1, v1), (src2, v2)):
    save_file(tensors, f"{d}/model.safetensors", metadata={"format": "np"})
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
print(f"  {n} tensors of {rows * 4096 / 2**20:.1f} MiB; v2 changes {len(changed)}: "
      + ", ".join(f"model.layers.{i}.weight" for i in sorted(changed)))
EOF
ls -lh "$SRC1"

step "Mounting hwfs at $MNT (store $STORE)"
"$HWFS" mount "$MNT" --store "$STORE"
ls -la "$MNT"

step "v1: mkdir versions/v1, cp the model in, hwfs seal v1"
mkdir "$MNT/versions/v1"
cp -r "$SRC1/." "$MNT/versions/v1/"
"$HWFS" seal v1

step "v2: hwfs publish (import + seal in one step)"
"$HWFS" publish "$SRC2" v2

step "ls $MNT/versions"
ls -l "$MNT/versions"

step "Per-tensor view of v2 (first entries) and their xattrs"
ls "$MNT/versions/v2/tensors" | head -5 || true
getfattr -d -m 'user.hwfs' "$MNT/versions/v2/tensors/model.layers.0.weight" 2>/dev/null || true

step "hwfs diff v1 v2"
"$HWFS" diff v1 v2

step "hwfs status (deduplication: stored bytes vs logical bytes)"
"$HWFS" status
"$HWFS" status --json | "$PYTHON" -c '
import json, sys
s = json.load(sys.stdin)
used = s["store"]["used_bytes"]
logical = sum(v["bytes"] for v in s["versions"])
print(f"  logical bytes of all versions: {logical / 2**20:9.1f} MiB")
print(f"  bytes stored in the arena:     {used / 2**20:9.1f} MiB  ({used / logical:.0%} of logical)")
'

step "hwfs commit v2 (atomic flip of $MNT/current)"
"$HWFS" commit v2
ls -l "$MNT/current"
"$PYTHON" -c 'import sys; from safetensors import safe_open
f = safe_open(sys.argv[1], framework="numpy")
print("  current/model.safetensors opens with safetensors:", len(list(f.keys())), "tensors")' \
	"$MNT/current/model.safetensors"

step "hwfs umount"
"$HWFS" umount "$MNT"
echo "demo: done"
