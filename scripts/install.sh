#!/usr/bin/env bash
# Create a virtual environment with the CPU build of torch and this plugin installed.
set -euo pipefail
VENV="${VENV:-.venv}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
EXTRAS="${EXTRAS:-test,repro}"  # repro: sacremoses, subword-nmt (scripts/reproduce)
python3 -m venv "$VENV"
# Pin torch first: an unpinned torch (asked for by fairseq) would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install --quiet -e ".[$EXTRAS]"
