#!/bin/bash
# tools/bench/gpu_carry.sh BUILD — gather what the GPU test and benchmark need on a
# bare GPU machine into BUILD/carry (`make gpu-carry`; docs/gpu.md, "Running
# on a GPU machine").
#
#   carry/bin   hwfs, hwfs-core, hwfs-gputest, hwfs-gpubench (debug info stripped) and
#               fusermount3 (libfuse falls back to it when mount(2) is refused,
#               e.g. in a container without CAP_SYS_ADMIN; `hwfs umount` and the
#               test's clean-up use it too)
#   carry/lib   every shared library they load (ldd), except the C library's
#               own (libc, libm, libpthread, libdl, librt, libresolv, libutil,
#               ld-linux: they must be the machine's) and CUDA's driver and
#               runtime (libcuda, libcudart: the machine's, matching its driver)
#   carry/cuda  CUDA runtimes as fallbacks: libcudart.so.13 (driver >= 580)
#               and libcudart.so.12 (driver >= 525; from this machine, else from
#               the PyPI wheel nvidia-cuda-runtime-cu12, cached in
#               BUILD/cuda-cache).  tests/gpu/run.sh and tools/bench/bench_gpu.sh try
#               the machine's own runtime first, then these in that order
#               (through $HWFS_CUDART), and keep the first that finds a device
#   carry/MANIFEST  what was copied, from where
#
# tests/gpu/run.sh and tools/bench/bench_gpu.sh run our programs (only those) with
# carry/lib on LD_LIBRARY_PATH, and put carry/bin on PATH (fusermount3).  The binaries need the same or a newer
# glibc than the build machine's.
set -eu
BUILD=${1:-build}
C=$BUILD/carry
PROGS="$BUILD/hwfs $BUILD/hwfs-core $BUILD/hwfs-gputest $BUILD/hwfs-gpubench"
for p in $PROGS; do
	[ -x "$p" ] || { echo "gpu_carry: $p is missing (make all gpu-progs)" >&2; exit 1; }
done
rm -rf "$C"
mkdir -p "$C/bin" "$C/lib" "$C/cuda"
: >"$C/MANIFEST"

strip_copy() { # SRC DST: copy, dropping debug info when strip is there
	cp -L "$1" "$2"
	if command -v strip >/dev/null; then strip --strip-debug "$2" 2>/dev/null || true; fi
	echo "$2 <- $1" >>"$C/MANIFEST"
}

for p in $PROGS; do
	strip_copy "$p" "$C/bin/$(basename "$p")"
done
FM=$(command -v fusermount3 || true)
if [ -n "$FM" ]; then
	strip_copy "$FM" "$C/bin/fusermount3"
	chmod 4755 "$C/bin/fusermount3" 2>/dev/null || true
	PROGS="$PROGS $FM"
else
	echo "gpu_carry: note: no fusermount3 here; the GPU machine must mount as root with mount(2)"
fi

# ldd: "libfoo.so.1 => /usr/lib/x86_64-linux-gnu/libfoo.so.1 (0x...)"
for p in $PROGS; do
	ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
	case $name in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so* | \
		libutil.so* | ld-linux* | libcuda.so* | libcudart.so*)
		continue ;;
	esac
	strip_copy "$path" "$C/lib/$name"
done

# The CUDA runtimes: .13 (needs driver >= 580) and .12 (any driver >= 525, by
# CUDA's minor-version compatibility), from this machine, else .12 from the
# PyPI wheel nvidia-cuda-runtime-cu12 (pinned version and sha256 below; pip
# checks the hash, and so do we), cached in BUILD/cuda-cache.
CU12_WHEEL_VERSION=12.9.79
CU12_WHEEL=nvidia_cuda_runtime_cu12-$CU12_WHEEL_VERSION-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
CU12_SHA256=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3
find_rt() { # NAME: the path of NAME on this machine, or nothing
	for dir in $(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF}' | xargs -r -n1 dirname) \
		/usr/local/cuda/lib64; do
		if [ -e "$dir/$1" ]; then
			echo "$dir/$1"
			return
		fi
	done
}
fetch_cu12() { # the cached libcudart.so.12 from the wheel, fetching it when missing
	local cache=$BUILD/cuda-cache whl tmp
	if [ ! -e "$cache/libcudart.so.12" ]; then
		command -v pip >/dev/null || command -v pip3 >/dev/null || return 1
		command -v python3 >/dev/null || return 1
		tmp=$(mktemp -d) || return 1
		if ! $(command -v pip || command -v pip3) download --quiet --no-deps --only-binary=:all: \
			--platform manylinux2014_x86_64 --python-version 3.11 -d "$tmp" \
			"nvidia-cuda-runtime-cu12==$CU12_WHEEL_VERSION" >"$tmp/pip.log" 2>&1; then
			tail -n 3 "$tmp/pip.log" >&2
			rm -rf "$tmp"
			return 1
		fi
		whl=$tmp/$CU12_WHEEL
		if [ ! -e "$whl" ] || [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$CU12_SHA256" ]; then
			echo "gpu_carry: $CU12_WHEEL is missing or its sha256 is not $CU12_SHA256" >&2
			rm -rf "$tmp"
			return 1
		fi
		mkdir -p "$cache"
		python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(
			"nvidia/cuda_runtime/lib/libcudart.so.12"))' "$whl" >"$cache/libcudart.so.12.part" &&
			mv "$cache/libcudart.so.12.part" "$cache/libcudart.so.12"
		rm -rf "$tmp"
		[ -e "$cache/libcudart.so.12" ] || return 1
		echo "$CU12_WHEEL sha256 $CU12_SHA256" >"$cache/SOURCE"
	fi
	echo "$cache/libcudart.so.12"
}
rt13=$(find_rt libcudart.so.13)
if [ -n "$rt13" ]; then
	strip_copy "$rt13" "$C/cuda/libcudart.so.13"
else
	echo "gpu_carry: note: no libcudart.so.13 here; only .12 is carried"
fi
rt12=$(find_rt libcudart.so.12)
[ -n "$rt12" ] || rt12=$(fetch_cu12) || rt12=""
if [ -n "$rt12" ]; then
	strip_copy "$rt12" "$C/cuda/libcudart.so.12"
	[ -e "$BUILD/cuda-cache/SOURCE" ] && [ "$rt12" = "$BUILD/cuda-cache/libcudart.so.12" ] &&
		echo "  (from $(cat "$BUILD/cuda-cache/SOURCE"))" >>"$C/MANIFEST"
else
	echo "gpu_carry: note: no libcudart.so.12 here and none fetched from PyPI" \
		"(nvidia-cuda-runtime-cu12): a GPU machine whose driver is older than 580 needs its own"
fi

# Every library must resolve with the carried ones alone (plus the C library).
missing=$(for p in "$C"/bin/*; do LD_LIBRARY_PATH="$C/lib" ldd "$p" | grep 'not found' || true; done)
if [ -n "$missing" ]; then
	echo "gpu_carry: unresolved libraries:" >&2
	echo "$missing" >&2
	exit 1
fi
echo "gpu_carry: $(du -sh "$C" | cut -f1) in $C ($(find "$C/lib" -type f | wc -l) libraries); carry it with the tree" \
	"and run tests/gpu/run.sh or tools/bench/bench_gpu.sh"
