#!/bin/bash
# tools/bench_gpu.sh — the host-to-device benchmark (`make bench-gpu`;
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
#   GPU_BENCH_GIB=4 GPU_BENCH_GPU=0 GPU_BENCH_STREAMS=4 GPU_BENCH_REPS=3 tools/bench_gpu.sh
#
# Binaries and carried libraries are found as tests/gpu/run.sh finds them
# ($HWFS_GPU_BIN, build/, build/carry/bin).  Needs root or a user allowed to
# pin GIB+1 GiB; the stores live in /dev/shm (about 3x GIB of memory at peak).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
CARRY=$ROOT/build/carry
GIB=${GPU_BENCH_GIB:-4}
GPU=${GPU_BENCH_GPU:-0}
STREAMS=${GPU_BENCH_STREAMS:-4}
REPS=${GPU_BENCH_REPS:-3}
case $GIB in '' | *[!0-9]* | 0) echo "bench-gpu: GPU_BENCH_GIB must be a whole number of GiB >= 1"; exit 2 ;; esac

if [ -n "${HWFS_GPU_BIN:-}" ]; then
	BIN=$HWFS_GPU_BIN
elif [ -x "$ROOT/build/hwfs-gpubench" ]; then
	BIN=$ROOT/build
elif [ -x "$CARRY/bin/hwfs-gpubench" ]; then
	BIN=$CARRY/bin
else
	echo "bench-gpu: no build/hwfs-gpubench nor build/carry/bin/hwfs-gpubench (make bench-gpu, or make gpu-carry)"
	exit 1
fi
[ -d "$CARRY/lib" ] && export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -d "$CARRY/bin" ] && export PATH="$CARRY/bin:$PATH"
HWFS=$BIN/hwfs
B=$BIN/hwfs-gpubench
for b in "$HWFS" "$B" "$BIN/hwfs-gputest"; do
	[ -x "$b" ] || { echo "bench-gpu: $b is missing"; exit 1; }
done
if ! probe=$("$BIN/hwfs-gputest" probe 2>&1); then
	rt=$(ls "$CARRY"/cuda/libcudart.so.* 2>/dev/null | head -n 1)
	if [ -z "${HWFS_CUDART:-}" ] && [ -n "$rt" ] && [[ $probe == *"no CUDA runtime"* ]]; then
		export HWFS_CUDART=$rt
		probe=$("$BIN/hwfs-gputest" probe 2>&1) || { echo "${probe/test-gpu/bench-gpu}"; exit 1; }
	else
		echo "${probe/test-gpu/bench-gpu}"
		exit 1
	fi
fi
echo "$probe"

TOP=$(mktemp -d /dev/shm/hwfs-gpubench.XXXXXX) || exit 1
M1=$(mktemp -d /tmp/hwfs-gpubench-pin.XXXXXX) || exit 1
M2=$(mktemp -d /tmp/hwfs-gpubench-page.XXXXXX) || exit 1
PIDS=()
mounted() { grep -q " $1 fuse" /proc/mounts; }
cleanup() {
	for m in "$M1" "$M2"; do
		if mounted "$m"; then
			"$HWFS" umount "$m" >/dev/null 2>&1
			mounted "$m" && { fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; }
		fi
		rmdir "$m" 2>/dev/null
	done
	for p in "${PIDS[@]}"; do
		[ -r "/proc/$p/cmdline" ] && grep -q hwfs "/proc/$p/cmdline" && kill -9 "$p" 2>/dev/null
	done
	rm -rf "$TOP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CAP=$((GIB + GIB / 4 + 1))G
mkdir -p "$TOP/src"
t0=$(date +%s%N)
for i in $(seq 1 "$GIB"); do
	f=$(printf 'model-%05d-of-%05d.safetensors' "$i" "$GIB")
	"$B" mkst "$TOP/src/$f" "$i" $((1 << 30)) || exit 1
done
echo "wrote $GIB GiB of safetensors in $((($(date +%s%N) - t0) / 1000000)) ms"

mount_one() { # MNT STORE EXTRA...
	local m=$1 s=$2
	shift 2
	if ! "$HWFS" mount "$m" --store "$s" --capacity "$CAP" -o gpu_streams="$STREAMS" "$@"; then
		echo "bench-gpu: hwfs mount $m failed"; tail -n 20 "$s/hwfs.log" 2>/dev/null; exit 1
	fi
	PIDS+=("$("$BIN/hwfs-gputest" pid "$m")")
}
mount_one "$M1" "$TOP/pinned" --pin
mount_one "$M2" "$TOP/pageable"
for m in "$M1" "$M2"; do
	"$HWFS" publish "$TOP/src" bench -m "$m" || { echo "bench-gpu: publish into $m failed"; exit 1; }
done
rm -rf "$TOP/src"
"$HWFS" status -m "$M1" | grep -i -E 'gpu|pin' || true

"$B" run --pinned "$M1" --pageable "$M2" --version bench --gpu "$GPU" --streams "$STREAMS" \
	--reps "$REPS" --ipc 20
rc=$?
"$HWFS" umount "$M1" && "$HWFS" umount "$M2"
exit $rc
