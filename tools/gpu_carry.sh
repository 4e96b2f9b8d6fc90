#!/bin/bash
# tools/gpu_carry.sh BUILD — gather what the GPU test and benchmark need on a
# bare GPU machine into BUILD/carry (`make gpu-carry`; docs/gpu.md, "Running
# on a GPU machine").
#
#   carry/bin   hwfs, hwfs-gputest, hwfs-gpubench (debug info stripped) and
#               fusermount3 (libfuse falls back to it when mount(2) is refused,
#               e.g. in a container without CAP_SYS_ADMIN; `hwfs umount` and the
#               test's clean-up use it too)
#   carry/lib   every shared library they load (ldd), except the C library's
#               own (libc, libm, libpthread, libdl, librt, libresolv, libutil,
#               ld-linux: they must be the machine's) and CUDA's driver and
#               runtime (libcuda, libcudart: the machine's, matching its driver)
#   carry/cuda  a CUDA runtime (libcudart.so.13/.12) as a fallback, used by
#               tests/gpu/run.sh and tools/bench_gpu.sh only when the machine
#               has none (then through $HWFS_CUDART)
#   carry/MANIFEST  what was copied, from where
#
# tests/gpu/run.sh and tools/bench_gpu.sh put carry/lib on LD_LIBRARY_PATH and
# carry/bin on PATH when they exist.  The binaries need the same or a newer
# glibc than the build machine's.
set -eu
BUILD=${1:-build}
C=$BUILD/carry
PROGS="$BUILD/hwfs $BUILD/hwfs-gputest $BUILD/hwfs-gpubench"
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

for rt in libcudart.so.13 libcudart.so.12; do
	for dir in $(ldconfig -p 2>/dev/null | awk -v n="$rt" '$1 == n {print $NF}' | xargs -r -n1 dirname) \
		/usr/local/cuda/lib64; do
		if [ -e "$dir/$rt" ]; then
			strip_copy "$dir/$rt" "$C/cuda/$rt"
			break
		fi
	done
done

# Every library must resolve with the carried ones alone (plus the C library).
missing=$(for p in "$C"/bin/*; do LD_LIBRARY_PATH="$C/lib" ldd "$p" | grep 'not found' || true; done)
if [ -n "$missing" ]; then
	echo "gpu_carry: unresolved libraries:" >&2
	echo "$missing" >&2
	exit 1
fi
echo "gpu_carry: $(du -sh "$C" | cut -f1) in $C ($(ls "$C/lib" | wc -l) libraries); carry it with the tree" \
	"and run tests/gpu/run.sh or tools/bench_gpu.sh"
