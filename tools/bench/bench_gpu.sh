#!/bin/bash
# tools/bench/bench_gpu.sh — the host-to-device benchmark (`make bench-gpu`;
# docs/gpu.md, "Benchmark").
#
# Writes a version of GPU_BENCH_GIB GiB (default 4; whole GiB, one 1 GiB
# safetensors file per GiB) with `hwfs-gpubench mkst`, publishes it into two
# mounts of one machine, one with --pin (the arena registered with CUDA) and
# one without (a pageable arena), and runs `hwfs-gpubench run` on them: load
# throughput from each arena against cudaMemcpyAsync from cudaMallocHost and
# from malloc memory, and the IPC open latency.  Prints a table and one JSON
# line ({"bench": "gpu", ...}).  Both mounts get -o gpu_streams=STREAMS and the
# baselines use as many streams.
#
#   GPU_BENCH_GIB=4 GPU_BENCH_GPU=0 GPU_BENCH_STREAMS=4 GPU_BENCH_REPS=3 tools/bench/bench_gpu.sh
#
# Binaries, carried libraries (for our programs only) and the CUDA runtime
# (the machine's, else carried .13, else .12) are found as tests/gpu/run.sh
# finds them (tests/gpu/gpuenv.sh).  Needs root or a user allowed to pin
# GIB+1 GiB; the stores live in /dev/shm when it has room for them (about
# 3.25x GIB + 2 GiB), else in a private tmpfs of that size (root only),
# unmounted at the end like the mounts; only processes it started are stopped.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
GIB=${GPU_BENCH_GIB:-4}
GPU=${GPU_BENCH_GPU:-0}
STREAMS=${GPU_BENCH_STREAMS:-4}
REPS=${GPU_BENCH_REPS:-3}
case $GIB in '' | *[!0-9]* | 0) echo "bench-gpu: GPU_BENCH_GIB must be a whole number of GiB >= 1"; exit 2 ;; esac

WHO=bench-gpu
# shellcheck source=tests/gpu/gpuenv.sh
. "$ROOT/tests/gpu/gpuenv.sh"
gpuenv_bin hwfs-gpubench || exit 1
# Our programs, run with the carried libraries (RUN); nothing else gets them.
HW=("${RUN[@]}" "$BIN/hwfs")
B=("${RUN[@]}" "$BIN/hwfs-gpubench")
T=("${RUN[@]}" "$BIN/hwfs-gputest")
for b in "$BIN/hwfs" "$BIN/hwfs-gpubench" "$BIN/hwfs-gputest"; do
	[ -x "$b" ] || { echo "bench-gpu: $b is missing"; exit 1; }
done
# A device, or one line saying why not (gpuenv.sh: the machine's runtime, then carried ones).
gpuenv_cudart || exit 1

M1=""
M2=""
PIDS=()
# shellcheck disable=SC2317 # used by the trap
mounted() { grep -q " $1 fuse" /proc/mounts; }
# shellcheck disable=SC2317 # run by the trap
cleanup() {
	for m in "$M1" "$M2"; do
		[ -n "$m" ] || continue
		if mounted "$m"; then
			"${HW[@]}" umount "$m" >/dev/null 2>&1
			mounted "$m" && { "${RUN[@]}" fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; }
		fi
		rmdir "$m" 2>/dev/null
	done
	gpuenv_kill ${PIDS[@]+"${PIDS[@]}"}
	# shellcheck disable=SC2046 # pids
	gpuenv_kill $(gpuenv_ours)
	gpuenv_tmp_free
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Peak room for the stores: the sources (GIB), the pinned arena (CAP, preallocated), the
# pageable store (GIB), and 1 GiB to spare.
gpuenv_tmp hwfs-gpubench $(((3 * GIB + GIB / 4 + 2) * 1024)) || exit 1
M1=$(mktemp -d /tmp/hwfs-gpubench-pin.XXXXXX) || exit 1
M2=$(mktemp -d /tmp/hwfs-gpubench-page.XXXXXX) || exit 1

CAP=$((GIB + GIB / 4 + 1))G
mkdir -p "$TOP/src"
t0=$(date +%s%N)
for i in $(seq 1 "$GIB"); do
	f=$(printf 'model-%05d-of-%05d.safetensors' "$i" "$GIB")
	"${B[@]}" mkst "$TOP/src/$f" "$i" $((1 << 30)) || exit 1
done
echo "wrote $GIB GiB of safetensors in $((($(date +%s%N) - t0) / 1000000)) ms"

mount_one() { # MNT STORE EXTRA...
	local m=$1 s=$2
	shift 2
	if ! "${HW[@]}" mount "$m" --store "$s" --capacity "$CAP" -o gpu_streams="$STREAMS" "$@"; then
		echo "bench-gpu: hwfs mount $m failed"; tail -n 20 "$s/hwfs.log" 2>/dev/null; exit 1
	fi
	PIDS+=("$("${T[@]}" pid "$m")")
}
mount_one "$M1" "$TOP/pinned" --pin
mount_one "$M2" "$TOP/pageable"
for m in "$M1" "$M2"; do
	"${HW[@]}" publish "$TOP/src" bench -m "$m" || { echo "bench-gpu: publish into $m failed"; exit 1; }
done
rm -rf "$TOP/src"
"${HW[@]}" status -m "$M1" | grep -i -E 'gpu|pin' || true

"${B[@]}" run --pinned "$M1" --pageable "$M2" --version bench --gpu "$GPU" --streams "$STREAMS" \
	--reps "$REPS" --ipc 20
rc=$?
"${HW[@]}" umount "$M1" && "${HW[@]}" umount "$M2"
exit $rc
