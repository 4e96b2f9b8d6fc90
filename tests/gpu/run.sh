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
# until unloaded, and a new version of its name cannot be loaded beside it;
# (g) `hwfs commit V` with an engine registered on GPU 0 (hwfs_watch_open_gpu)
# returns once V is loaded there, also racing a `hwfs load V`, and an engine
# on a GPU the node lacks refuses the commit; (h) a load's answer says
# "source": "pinned" on the --pin mount and "pageable" on a second mount
# without --pin (whose device copy is compared too).
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
MNT2=""
DPID=""
DPID2=""
EPIDS=()
PASSED=0
FAILED=0
FAILS=()

mounted() { grep -q " $1 fuse" /proc/mounts; }

cleanup() {
	local m
	gpuenv_kill ${EPIDS[@]+"${EPIDS[@]}"}
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
	gpuenv_kill "$DPID" "$DPID2"
	# shellcheck disable=SC2046 # pids
	gpuenv_kill $(gpuenv_ours)
	gpuenv_tmp_free
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Room for the stores: the 1 GiB pinned arena, a 256 MiB pageable one, the sources.
gpuenv_tmp hwfs-gputest 1800 || exit 1
MNT=$(mktemp -d /tmp/hwfs-gpumnt.XXXXXX) || exit 1
STORE=$TOP/store

log_tail() { echo "--- daemon log (last 20 lines)"; tail -n 20 "$STORE/hwfs.log" 2>/dev/null; echo "---"; }

# verdict NAME RC: a PASS when RC is 0.
verdict() {
	if [ "$2" -eq 0 ]; then
		echo "PASS: $1"
		PASSED=$((PASSED + 1))
	else
		echo "FAIL: $1 (exit $2)"
		FAILED=$((FAILED + 1))
		FAILS+=("$1")
	fi
}

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

# start_engine NAME GPU: `hwfs-gputest engine` in the background (its pid in EPIDS), waiting
# (up to 30 s) for its "registered" line; 0 when it registered.
start_engine() {
	local name=$1 gpu=$2 i
	"${T[@]}" engine "$MNT" "$name" "$gpu" >"$TOP/engine-$name.log" 2>&1 &
	EPIDS+=("$!")
	disown "$!" # killed by pid at the end; no "Killed" job notice
	for i in $(seq 1 300); do
		grep -q "registered" "$TOP/engine-$name.log" 2>/dev/null && return 0
		kill -0 "${EPIDS[-1]}" 2>/dev/null || break
		sleep 0.1
	done
	cat "$TOP/engine-$name.log"
	return 1
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
make_src "$TOP/v3" 31 $((6 << 20)) $((1 << 20)) || exit 1
make_src "$TOP/v4" 41 $((6 << 20)) $((1 << 20)) || exit 1

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

echo "== (g) commit barrier with an engine registered on GPU 0 (hwfs_watch_open_gpu)"
ok "publish v3" "${HW[@]}" publish "$TOP/v3" v3 -m "$MNT"
ok "publish v4" "${HW[@]}" publish "$TOP/v4" v4 -m "$MNT"
start_engine g0 0
verdict "engine g0 registered with GPU 0" $?
ok "hwfs commit v3 (the node loads v3 on GPU 0 for engine g0)" "${HW[@]}" commit v3 -m "$MNT"
ok "after the commit v3 is loaded on GPU 0 and current is v3" "${T[@]}" resident "$MNT" v3 0
"${HW[@]}" load v4 --gpu 0 -m "$MNT" >"$TOP/load-v4.out" 2>&1 &
LPID=$!
ok "hwfs commit v4 while a hwfs load v4 runs" "${HW[@]}" commit v4 -m "$MNT"
wait "$LPID"
lrc=$?
cat "$TOP/load-v4.out"
verdict "the racing hwfs load v4 succeeded too" "$lrc"
ok "after the commit v4 is loaded on GPU 0 and current is v4" "${T[@]}" resident "$MNT" v4 0
ok "compare v4 (loaded by the barrier or the racing load)" "${T[@]}" compare "$MNT" v4 0
start_engine g99 99
verdict "engine g99 registered with GPU 99 (this node lacks it)" $?
refused "a commit with engine g99 is refused by it" "engine g99 refused v3: this node has" \
	"${HW[@]}" commit v3 -m "$MNT"
ok "the refused commit left current at v4" "${T[@]}" resident "$MNT" v4 0
gpuenv_kill ${EPIDS[@]+"${EPIDS[@]}"}
EPIDS=()
ok "hwfs commit v3 once the engines are gone" "${HW[@]}" commit v3 -m "$MNT"
ok "hwfs unload v3" "${HW[@]}" unload v3 -m "$MNT"
ok "hwfs unload v4" "${HW[@]}" unload v4 -m "$MNT"

echo "== (h) a load's source: the pinned arena, and a pageable arena (a mount without --pin)"
ok "load v2 from the --pin mount says \"pinned\"" "${T[@]}" source "$MNT" v2 0 pinned
ok "hwfs unload v2 --gpu 0 (the pinned mount)" "${HW[@]}" unload v2 --gpu 0 -m "$MNT"
MNT2=$(mktemp -d /tmp/hwfs-gpumnt2.XXXXXX) || exit 1
if $TO "${HW[@]}" mount "$MNT2" --store "$TOP/store2" --capacity 256M -o max_shard=1M; then
	DPID2=$("${T[@]}" pid "$MNT2")
	ok "publish v2 into the pageable mount" "${HW[@]}" publish "$TOP/v2" v2 -m "$MNT2"
	ok "load v2 from the mount without --pin says \"pageable\"" \
		"${T[@]}" source "$MNT2" v2 0 pageable
	ok "compare v2 loaded from the pageable arena" "${T[@]}" compare "$MNT2" v2 0
	ok "hwfs unload v2 (the pageable mount)" "${HW[@]}" unload v2 -m "$MNT2"
	ok "hwfs umount of the pageable mount" "${HW[@]}" umount "$MNT2"
else
	echo "FAIL: hwfs mount without --pin"
	FAILED=$((FAILED + 1))
	FAILS+=("mount without --pin")
fi

if ! $TO "${HW[@]}" umount "$MNT"; then
	echo "FAIL: hwfs umount"
	FAILED=$((FAILED + 1))
	FAILS+=("umount")
fi

summary="test-gpu: $PASSED passed, $FAILED failed"
[ "$FAILED" -gt 0 ] && summary+=": $(IFS=';'; echo "${FAILS[*]}")"
echo "$summary"
[ "$FAILED" -eq 0 ]
