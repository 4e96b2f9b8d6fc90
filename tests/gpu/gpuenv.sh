# shellcheck shell=bash
# tests/gpu/gpuenv.sh — sourced (bash) by tests/gpu/run.sh and tools/bench/bench_gpu.sh:
# finding the programs, the CUDA runtime and room for the stores on a bare
# GPU machine (docs/gpu.md, "Running on a GPU machine").  The caller has set
# ROOT (the repository root) and WHO ("test-gpu" or "bench-gpu", the prefix
# of its one-line refusals).
#
#   gpuenv_bin PROG      BIN: $HWFS_GPU_BIN, else build/ when build/PROG exists,
#                        else build/carry/bin; RUN: the command prefix that runs
#                        one of our programs (env with build/carry/lib on
#                        LD_LIBRARY_PATH when it exists; only our programs get
#                        it, never coreutils); build/carry/bin joins PATH
#   gpuenv_cudart        prints nvidia-smi's view, then finds a runtime that
#                        sees a device: $HWFS_CUDART alone when set, else the
#                        machine's own, then build/carry/cuda/libcudart.so.13,
#                        then .12 (each tried with `hwfs-gputest probe`); exports
#                        HWFS_CUDART for a carried one.  Else one line, status 1
#   gpuenv_tmp PREFIX MIB   TOP: a private directory with MIB MiB free, in
#                        /dev/shm when it has room, else a tmpfs of that size
#                        mounted on a directory of /tmp (root only; a Docker
#                        /dev/shm is 64 MiB).  Status 1 with one line if neither
#   gpuenv_tmp_free      removes TOP (unmounting its tmpfs); call it after every
#                        process that used TOP has ended
#   gpuenv_kill PID...   kill -9 each PID that is still an hwfs process and wait
#                        (up to 5 s) until it is gone, so TOP can be unmounted
#   gpuenv_ours          the pids of the hwfs processes whose command line names
#                        TOP (our daemons, also one whose `hwfs mount` failed
#                        before its pid was learned): only this run's, as TOP
#                        is a fresh mktemp directory

CARRY=$ROOT/build/carry
TOP=""
TOP_TMPFS=""

gpuenv_bin() {
	local prog=$1
	if [ -n "${HWFS_GPU_BIN:-}" ]; then
		BIN=$HWFS_GPU_BIN
	elif [ -x "$ROOT/build/$prog" ]; then
		BIN=$ROOT/build
	elif [ -x "$CARRY/bin/$prog" ]; then
		BIN=$CARRY/bin
	else
		echo "$WHO: no build/$prog nor build/carry/bin/$prog (make $WHO, or make gpu-carry)"
		return 1
	fi
	RUN=(env)
	if [ -d "$CARRY/lib" ]; then
		RUN=(env "LD_LIBRARY_PATH=$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
	fi
	if [ -d "$CARRY/bin" ]; then
		export PATH="$CARRY/bin:$PATH"
	fi
	return 0
}

gpuenv_cudart() {
	local probe out rt notes=""
	if command -v nvidia-smi >/dev/null 2>&1; then
		echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
			2>&1 | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
	fi
	if [ -n "${HWFS_CUDART:-}" ]; then # the caller's choice, alone
		probe=$("${RUN[@]}" "$BIN/hwfs-gputest" probe 2>&1) || {
			echo "${probe/test-gpu/$WHO} (HWFS_CUDART=$HWFS_CUDART)"
			return 1
		}
		echo "$probe"
		return 0
	fi
	if probe=$("${RUN[@]}" "$BIN/hwfs-gputest" probe 2>&1); then
		echo "$probe"
		return 0
	fi
	for rt in "$CARRY/cuda/libcudart.so.13" "$CARRY/cuda/libcudart.so.12"; do
		[ -e "$rt" ] || continue
		if out=$("${RUN[@]}" "HWFS_CUDART=$rt" "$BIN/hwfs-gputest" probe 2>&1); then
			export HWFS_CUDART=$rt
			echo "$out (the carried runtime; the machine's own: ${probe#*: })"
			return 0
		fi
		notes+="; carried ${rt##*/}: ${out#*: }"
	done
	echo "${probe/test-gpu/$WHO}$notes"
	return 1
}

gpuenv_tmp() {
	local prefix=$1 mib=$2 free err
	free=$(df -P -k /dev/shm 2>/dev/null | awk 'NR == 2 {print int($4 / 1024)}')
	if [ -n "$free" ] && [ "$free" -ge "$mib" ]; then
		TOP=$(mktemp -d "/dev/shm/$prefix.XXXXXX") || return 1
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "$WHO: /dev/shm has ${free:-no} MiB free, $mib MiB are needed, and only root may" \
			"mount a tmpfs of its own"
		return 1
	fi
	TOP=$(mktemp -d "/tmp/$prefix.XXXXXX") || return 1
	if ! err=$(mount -t tmpfs -o "size=${mib}m,mode=0700" hwfs-gputmp "$TOP" 2>&1); then
		echo "$WHO: /dev/shm has ${free:-no} MiB free, $mib MiB are needed, and mount -t tmpfs" \
			"on $TOP failed: $err"
		rmdir "$TOP"
		TOP=""
		return 1
	fi
	TOP_TMPFS=1
	echo "note: /dev/shm has ${free:-no} MiB free: the stores are in a tmpfs of $mib MiB on $TOP"
	return 0
}

gpuenv_tmp_free() {
	[ -n "$TOP" ] || return 0
	if [ -n "$TOP_TMPFS" ]; then
		umount "$TOP" 2>/dev/null || umount -l "$TOP" 2>/dev/null
		TOP_TMPFS=""
		rmdir "$TOP" 2>/dev/null
	else
		rm -rf "$TOP"
	fi
	TOP=""
}

gpuenv_kill() {
	local p i
	for p in "$@"; do
		[ -n "$p" ] && [ -r "/proc/$p/cmdline" ] && grep -q hwfs "/proc/$p/cmdline" 2>/dev/null &&
			kill -9 "$p" 2>/dev/null
	done
	for p in "$@"; do
		for i in $(seq 1 50); do
			# gone, or a zombie (its files are closed already)
			{ [ -n "$p" ] && [ -r "/proc/$p/stat" ]; } || break
			[ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" = Z ] && break
			[ "$i" -lt 50 ] && sleep 0.1
		done
	done
}

gpuenv_ours() {
	local f p
	[ -n "$TOP" ] || return 0
	for f in /proc/[0-9]*/cmdline; do
		p=${f#/proc/}
		p=${p%/cmdline}
		[ "$p" != "$$" ] || continue
		case $(cat "/proc/$p/comm" 2>/dev/null) in hwfs*) ;; *) continue ;; esac
		tr '\0' ' ' <"$f" 2>/dev/null | grep -q -F -e "$TOP/" && echo "$p"
	done
	return 0
}
