#!/usr/bin/env bash
# install-deps.sh — install the Debian and Python packages hwfs needs.
#
# Idempotent and silent when everything is present.  Missing Debian packages
# are installed with apt-get (through sudo when not root); missing Python
# modules with `python3 -m pip install`, retried with --break-system-packages
# when pip refuses to touch an externally managed (Debian system) Python.
# Exits non-zero with a message saying what failed.
set -uo pipefail

DEB_PKGS=(build-essential pkg-config iproute2 libfuse3-dev fuse3 libsqlite3-dev libzmq3-dev
          libxxhash-dev libjansson-dev libcmocka-dev libzstd-dev libdlpack-dev zstd inotify-tools
          attr rsync curl python3 python3-pip
          libmicrohttpd-dev libsystemd-dev prometheus chromium systemd fio)
# libmicrohttpd-dev: the --http server (fs/common/http.c, which dlopens libmicrohttpd.so.12);
# libsystemd-dev: no longer linked (fs/common/sdnotify.c sends the Type=notify units' datagram
# itself); prometheus: promtool and the server of
# tests/integration/cluster/test_prometheus.py; chromium: the headless browser of
# tests/integration/test_status_page.py; systemd: systemd-analyze verify of the units;
# fio: the parallel-reader rows of `make bench` (tools/bench/bench.py).
# Python modules as IMPORT_NAME:PIP_NAME (the pip name is the import name when
# no ':' is given).  torch and transformers are for the tests of the Python
# package (tests/integration/test_torch_engine.py); torch's default wheel is
# large (about 3 GB with its CUDA libraries) and is only installed when missing.
# build (python -m build) makes the package's sdist and wheel
# (tests/integration/test_packaging.py).
PY_MODS=(numpy safetensors pytest zmq:pyzmq setuptools build torch transformers)
PYTHON=${PYTHON:-python3}

die() {
	echo "install-deps: error: $*" >&2
	exit 1
}

# (not `dpkg -s | grep -q`: grep -q leaves at the first match, and with pipefail
# the SIGPIPE of a long `dpkg -s` (prometheus's) reads as "not installed")
deb_installed() {
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null 2>&1 || die "not root and sudo is not available; run this script as root"
	SUDO=(sudo)
fi

# ---- Debian packages -------------------------------------------------------
command -v dpkg >/dev/null 2>&1 || die "dpkg not found: this script supports Debian/Ubuntu only"
missing_deb=()
for p in "${DEB_PKGS[@]}"; do
	deb_installed "$p" || missing_deb+=("$p")
done

if [ "${#missing_deb[@]}" -gt 0 ]; then
	echo "install-deps: installing Debian packages: ${missing_deb[*]}"
	log=$(mktemp)
	if ! ${SUDO[@]+"${SUDO[@]}"} apt-get update -q >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		die "apt-get update failed"
	fi
	if ! ${SUDO[@]+"${SUDO[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing_deb[@]}" >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		die "apt-get install failed for: ${missing_deb[*]}"
	fi
	rm -f "$log"
	still=()
	for p in "${missing_deb[@]}"; do
		deb_installed "$p" || still+=("$p")
	done
	[ "${#still[@]}" -eq 0 ] || die "still not installed after apt-get: ${still[*]}"
fi

# ---- Python modules --------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
# Imported from / : run from the repository, the folder build/ would pass for
# the module build (a namespace package), and it would never be installed.
py_has() {
	(cd / && "$PYTHON" -c "import $1") >/dev/null 2>&1
}
missing_py=()
for m in "${PY_MODS[@]}"; do
	py_has "${m%%:*}" || missing_py+=("$m")
done

if [ "${#missing_py[@]}" -gt 0 ]; then
	echo "install-deps: installing Python modules: ${missing_py[*]#*:}"
	"$PYTHON" -m pip --version >/dev/null 2>&1 ||
		die "$PYTHON -m pip is not available (install python3-pip for this interpreter)"
	export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
	for spec in "${missing_py[@]}"; do
		m=${spec#*:}   # what pip installs
		mod=${spec%%:*} # what python imports
		log=$(mktemp)
		if ! "$PYTHON" -m pip install -q "$m" >"$log" 2>&1; then
			if grep -qi 'externally-managed-environment\|externally managed' "$log"; then
				if ! "$PYTHON" -m pip install -q --break-system-packages "$m" >"$log" 2>&1; then
					cat "$log" >&2
					rm -f "$log"
					die "pip install --break-system-packages $m failed"
				fi
			else
				cat "$log" >&2
				rm -f "$log"
				die "pip install $m failed"
			fi
		fi
		rm -f "$log"
		py_has "$mod" ||
			die "module $mod still cannot be imported by $PYTHON after pip install"
	done
fi
exit 0
