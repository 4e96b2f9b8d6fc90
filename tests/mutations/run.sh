#!/bin/bash
# tests/mutations/run.sh — the tests can fail: each mutation breaks one
# feature on purpose, and the test that guards it must then fail.
#
#   tests/mutations/run.sh [NAME...]      (make test-mutations)
#
# Every tests/mutations/NAME.patch is a `git diff` of the tree that breaks
# one thing, headed by two lines:
#
#   # breaks: what the patch breaks, in words
#   # test: KIND COMMAND
#
# KIND says how the tree is built and COMMAND run: `unit` (make all; a unit
# binary), `tsan` (make tsan; a unit binary of build-tsan/ under
# ThreadSanitizer, whose report exits 66), `fuzz` (the command builds what it
# needs: make fuzz-replay), `pytest` (make all; pytest with make test's
# options on the test ids given), `vllm` (as pytest, with the repository's
# build/venv-vllm: make vllm-deps first).  Each patch is applied to a scratch
# worktree of HEAD, built, and its test run; the tree is restored before the
# next.  A mutation is "caught" when the test fails, "MISSED" when it passes
# (a test that cannot fail: the run fails), "no build" when the broken tree
# does not build (the patch needs mending: the run fails).  Logs go to
# build/mutations/NAME.log of the repository.  Not part of `make test`: one
# rebuild per mutation (and one ThreadSanitizer build), some minutes in all.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
JOBS=$(nproc 2>/dev/null || echo 2)
LOGS=$ROOT/build/mutations
mkdir -p "$LOGS"
WT=$(mktemp -d "${TMPDIR:-/tmp}/hwfs-mutations.XXXXXX")
cleanup() {
	git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null
	rm -rf "$WT"
}
trap cleanup EXIT
git -C "$ROOT" worktree add -q --detach "$WT" HEAD || exit 1
cd "$WT" || exit 1

PYTEST="python3 -m pytest -q -rs -p no:cacheprovider -p pytest_allowed_skips"
TSAN_OPTS="suppressions=$WT/tests/tsan.supp halt_on_error=0 exitcode=66"
bad=0
n=0
printf '%-30s %-8s %s\n' MUTATION RESULT TEST
for p in "$ROOT"/tests/mutations/*.patch; do
	name=$(basename "$p" .patch)
	if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qxF "$name"; then
		continue
	fi
	n=$((n + 1))
	spec=$(sed -n 's/^# test: //p' "$p" | head -1)
	kind=${spec%% *}
	cmd=${spec#* }
	log=$LOGS/$name.log
	case $kind in
	unit) build="make -s -j$JOBS all" run="$cmd" ;;
	tsan) build="make -s -j$JOBS tsan" run="env TSAN_OPTIONS='$TSAN_OPTS' $cmd" ;;
	fuzz) build=":" run="$cmd" ;;
	pytest) build="make -s -j$JOBS all" run="env PYTHONPATH=$WT/tests $PYTEST $cmd" ;;
	vllm)
		# the repository's vLLM venv (make vllm-deps); the tests put the
		# worktree's tools/python first on the servers' and hwfs-vllm's path
		build="make -s -j$JOBS all && test -x $ROOT/build/venv-vllm/bin/python"
		run="env PYTHONPATH=$WT/tests HWFS_VLLM_VENV=$ROOT/build/venv-vllm $PYTEST $cmd"
		;;
	*)
		printf '%-30s %-8s %s\n' "$name" "bad kind" "$spec"
		bad=1
		continue
		;;
	esac
	if ! git apply "$p" 2>"$log"; then
		result="no apply"
		bad=1
	elif ! eval "$build" >>"$log" 2>&1; then
		result="no build"
		bad=1
	elif eval "timeout 1200 $run" >>"$log" 2>&1; then
		result="MISSED"
		bad=1
	else
		result="caught"
	fi
	printf '%-30s %-8s %s\n' "$name" "$result" "$spec"
	git checkout -q -- . && git clean -qfd -e build -e build-asan -e build-tsan
done
[ "$n" -gt 0 ] || { echo "no mutation named $*" >&2; exit 2; }
exit $bad
