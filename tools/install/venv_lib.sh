# venv_lib.sh — what tools/install/install-vllm.sh and tools/install/install-verl.sh share
# (sourced): a venv that reuses the system torch, kept current by a stamp.
#
# venv_begin SPEC: with ROOT, VENV, PYTHON, STAMP and die() set by the
# caller, sets `want` ("SPEC python=<hash of tools/python>") and exits the
# script (0) when $STAMP holds it already; else checks that $PYTHON has
# torch, makes $VENV with --system-site-packages when it is not there, and
# sets VPY (the venv's python) and log ($VENV/install.log, emptied).
# pip ARGS...: a quiet `pip install ARGS` into the venv, its output to $log;
# on failure the log's tail and die.

venv_begin() {
	local pkg_hash
	pkg_hash=$(cd "$ROOT" && find tools/python/hwfs tools/python/pyproject.toml \
		tools/python/setup.py fs/ns/tp_rules.def -type f \
		\( -name '*.py' -o -name '*.toml' -o -name '*.def' \) -not -path '*/__pycache__/*' -print0 |
		sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
	want="$1 python=$pkg_hash"
	if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
		exit 0
	fi
	"$PYTHON" -c 'import torch' 2>/dev/null ||
		die "$PYTHON has no torch: run tools/install/install-deps.sh first (the venv reuses the system torch)"
	[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV" ||
		die "cannot make the venv $VENV"
	VPY=$VENV/bin/python
	log=$VENV/install.log
	: >"$log"
}

pip() {
	"$VPY" -m pip install -q --disable-pip-version-check "$@" >>"$log" 2>&1 ||
		{ tail -30 "$log" >&2; die "pip install $* failed (log: $log)"; }
}
