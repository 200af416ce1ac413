#!/usr/bin/env bash
# The engine and end-to-end tiers on CUDA, where this machine has an NVIDIA GPU and a CUDA build
# of torch: the model-loading fixtures then load on `cuda` (TRITON_CHAT_TEST_DEVICE) and the
# tests of tests/model, tests/engine and tests/e2e run against it. Anywhere else it says why it
# skipped and exits 0. Extra arguments go to pytest (e.g. `scripts/gpu-check.sh -x`).
#
# Environment:
#   PYTHON  the interpreter with triton-chat installed (default: .venv/bin/python)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-.venv/bin/python}"

skip() {
    echo "gpu-check.sh: skipped: $*" >&2
    exit 0
}

command -v nvidia-smi >/dev/null 2>&1 || skip "no NVIDIA GPU on this machine (nvidia-smi not found)"
nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi finds no GPU"
[[ -x "$PYTHON" ]] || skip "$PYTHON not found; run scripts/setup.sh or set PYTHON"
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || skip "torch sees no CUDA device (a CPU build of torch? README.md, Installing, says how to get a CUDA one)"

"$PYTHON" -c 'import torch; print("gpu-check.sh: torch", torch.__version__, "on", torch.cuda.get_device_name(0))' >&2
export TRITON_CHAT_TEST_DEVICE=cuda
exec "$PYTHON" -m pytest -q tests/model tests/engine tests/e2e "$@"
