#!/bin/bash
# tests/gpu/run.sh — the GPU plane on a real CUDA device (`make test-gpu`;
# docs/gpu.md, "Running on a GPU machine").
#
# Mounts a real hwfs with --pin in a temporary directory, publishes versions
# written by `hwfs-gputest mkst` (max_shard 1 MiB, so the largest tensors are
# stored in several shards) and runs the checks: (a) the arena is pinned for
# CUDA; the CLI's load/unload and their refusals; (d) device memory taken by
# a load and given back by the unload (deferred while a gpumap is open);
# (b) every tensor read back from the device equals the host map; (f) DLPack
# tensors of device and host maps; (c) several processes open the IPC
# handles at once; (e) a loaded version removed with `hwfs rm` stays usable
# until unloaded, and a new version of its name cannot be loaded beside it.
# Every check prints PASS or FAIL; the exit status is 1 when any failed.
#
# Needs only bash, coreutils and our binaries: it runs from a carried build
# (build/carry, made by `make gpu-carry`) on a machine that compiles nothing.
# Binaries: $HWFS_GPU_BIN if set, else build/ when build/hwfs-gputest exists,
# else build/carry/bin.  Our programs (only they) run with build/carry/lib on
# LD_LIBRARY_PATH, build/carry/bin joins PATH (fusermount3); the CUDA runtime
# is the machine's if it sees a device, else a carried one (build/carry/cuda:
# .13, then .12); /dev/shm is used when it has room, else a private tmpfs
# (tests/gpu/gpuenv.sh).  Whatever happens, the mounts are unmounted, the
# processes this script started stopped (by pid) and the tmpfs unmounted.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
WHO=test-gpu
# shellcheck source=tests/gpu/gpuenv.sh
. "$ROOT/tests/gpu/gpuenv.sh"

gpuenv_bin hwfs-gputest || exit 1
# Our programs, run with the carried libraries (RUN); nothing else gets them.
HW=("${RUN[@]}" "$BIN/hwfs")
T=("${RUN[@]}" "$BIN/hwfs-gputest")
for b in "$BIN/hwfs" "$BIN/hwfs-gputest"; do
	[ -x "$b" ] || { echo "test-gpu: $b is missing"; exit 1; }
done

# A device, or one line saying why not (gpuenv.sh: the machine's runtime, then carried ones).
gpuenv_cudart || exit 1
[ -c /dev/fuse ] || { echo "test-gpu needs FUSE: /dev/fuse is missing"; exit 1; }

TO=""
command -v timeout >/dev/null && TO="timeout 300"
MNT=""
DPID=""
PASSED=0
FAILED=0
FAILS=()

mounted() { grep -q " $1 fuse" /proc/mounts; }

cleanup() {
	local m
	for m in "$MNT" "${MNT2:-}"; do
		[ -n "$m" ] || continue
		if mounted "$m"; then
			$TO "${HW[@]}" umount "$m" >/dev/null 2>&1
			if mounted "$m"; then
				"${RUN[@]}" fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
			fi
		fi
		rmdir "$m" 2>/dev/null
	done
	gpuenv_kill "$DPID"
	gpuenv_tmp_free
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Room for the stores: the 1 GiB pinned arena, a 256 MiB pageable one, the sources.
gpuenv_tmp hwfs-gputest 1800 || exit 1
MNT=$(mktemp -d /tmp/hwfs-gpumnt.XXXXXX) || exit 1
STORE=$TOP/store

log_tail() { echo "--- daemon log (last 20 lines)"; tail -n 20 "$STORE/hwfs.log" 2>/dev/null; echo "---"; }

# ok NAME CMD...: CMD must exit 0 (its output is shown).
ok() {
	local name=$1
	shift
	if $TO "$@"; then
		echo "PASS: $name"
		PASSED=$((PASSED + 1))
	else
		echo "FAIL: $name (exit $?: $*)"
		FAILED=$((FAILED + 1))
		FAILS+=("$name")
		log_tail
	fi
}

# refused NAME PATTERN CMD...: CMD must exit non-zero with PATTERN in its output.
refused() {
	local name=$1 pat=$2 out rc
	shift 2
	out=$($TO "$@" 2>&1)
	rc=$?
	if [ $rc -ne 0 ] && [[ $out == *"$pat"* ]]; then
		echo "PASS: $name ($out)"
		PASSED=$((PASSED + 1))
	else
		echo "FAIL: $name: want a refusal with \"$pat\", got exit $rc: $out"
		FAILED=$((FAILED + 1))
		FAILS+=("$name")
	fi
}

# A version: two safetensors files (BIG and SMALL bytes) and a config.json.
make_src() {
	local dir=$1 seed=$2 big=$3 small=$4
	mkdir -p "$dir"
	"${T[@]}" mkst "$dir/model-00001-of-00002.safetensors" "$seed" "$big" &&
		"${T[@]}" mkst "$dir/model-00002-of-00002.safetensors" $((seed + 1)) "$small" &&
		echo "{\"seed\": $seed}" >"$dir/config.json"
}

make_src "$TOP/v1" 1 $((24 << 20)) $((6 << 20)) || exit 1
make_src "$TOP/v2" 11 $((8 << 20)) $((2 << 20)) || exit 1
make_src "$TOP/v1b" 21 $((20 << 20)) $((4 << 20)) || exit 1

out=$($TO "${HW[@]}" mount "$MNT" --store "$STORE" --capacity 1G --pin -o max_shard=1M 2>&1)
rc=$?
[ -n "$out" ] && echo "$out"
if [ $rc -ne 0 ]; then
	echo "FAIL: hwfs mount --pin (exit $rc)"
	log_tail
	exit 1
fi
DPID=$("${T[@]}" pid "$MNT")
if [[ $out == *"note: no GPU"* ]]; then
	echo "FAIL: the daemon found no GPU although this process did: $out"
	exit 1
fi

ok "publish v1" "${HW[@]}" publish "$TOP/v1" v1 -m "$MNT"
ok "publish v2" "${HW[@]}" publish "$TOP/v2" v2 -m "$MNT"

echo "== (a) pinned arena"
ok "status: pinned for CUDA" "${T[@]}" pinned "$MNT"

echo "== CLI load/unload"
ok "hwfs load v2 --gpu 0" "${HW[@]}" load v2 --gpu 0 -m "$MNT"
ok "hwfs load v2 --gpu 0 --json (already loaded)" "${HW[@]}" load v2 --gpu 0 --json -m "$MNT"
refused "load on a GPU this node lacks" "this node has" "${HW[@]}" load v2 --gpu 99 -m "$MNT"
refused "load of a missing version" "no such version" "${HW[@]}" load nosuch --gpu 0 -m "$MNT"
refused "unload of a version not loaded" "it is not loaded" "${HW[@]}" unload v1 --gpu 0 -m "$MNT"

echo "== (d) device memory: load, unload deferred by a gpumap, unload"
ok "device memory follows load and unload" "${T[@]}" memory "$MNT" v1 0

ok "hwfs load v1 --gpu 0" "${HW[@]}" load v1 --gpu 0 -m "$MNT"
echo "== (b) device bytes equal the host map"
ok "compare v1" "${T[@]}" compare "$MNT" v1 0
ok "compare v2" "${T[@]}" compare "$MNT" v2 0
echo "== (f) DLPack"
ok "dlpack of device and host maps" "${T[@]}" dlpack "$MNT" v1 0
echo "== (c) IPC handles opened by other processes"
ok "3 processes map v1 at once" "${T[@]}" ipc "$MNT" v1 0 3

echo "== (e) rm of a loaded version"
ok "removed v1 stays loaded and mappable" "${T[@]}" removed "$MNT" v1 0
ok "publish a new v1" "${HW[@]}" publish "$TOP/v1b" v1 -m "$MNT"
refused "loading the new v1 beside the removed copy" "unload it first" "${HW[@]}" load v1 --gpu 0 -m "$MNT"
ok "hwfs unload v1 --gpu 0 (the removed copy)" "${HW[@]}" unload v1 --gpu 0 -m "$MNT"
ok "hwfs load v1 --gpu 0 (the new v1)" "${HW[@]}" load v1 --gpu 0 -m "$MNT"
ok "compare the new v1" "${T[@]}" compare "$MNT" v1 0
ok "hwfs unload v1 (every device)" "${HW[@]}" unload v1 -m "$MNT"
ok "hwfs unload v2 --gpu 0" "${HW[@]}" unload v2 --gpu 0 -m "$MNT"

if ! $TO "${HW[@]}" umount "$MNT"; then
	echo "FAIL: hwfs umount"
	FAILED=$((FAILED + 1))
	FAILS+=("umount")
fi

summary="test-gpu: $PASSED passed, $FAILED failed"
[ "$FAILED" -gt 0 ] && summary+=": $(IFS=';'; echo "${FAILS[*]}")"
echo "$summary"
[ "$FAILED" -eq 0 ]
