#!/usr/bin/env bash
# Set up if needed, then run `triton-chat serve` with the given flags (see `--help`).
# `-h`/`--help` answers at once and installs nothing: the full flag list from an existing .venv,
# else this script's usage.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for arg in "$@"; do
    if [[ "$arg" == "--" ]]; then
        break
    fi
    if [[ "$arg" == "-h" || "$arg" == "--help" ]]; then
        if [[ -x "$ROOT/.venv/bin/triton-chat" ]]; then
            exec "$ROOT/.venv/bin/triton-chat" serve --help
        fi
        cat <<USAGE
usage: scripts/serve.sh [triton-chat serve flags...]

Sets up .venv/ on its first run (scripts/setup.sh: torch, triton-chat with tritonserver, the demo
model; a few minutes), then runs \`triton-chat serve\` with the flags given, e.g.

  scripts/serve.sh --model /path/to/Qwen2.5-0.5B-Instruct --max-model-len 4096 -tp 1

Common flags (vLLM's names): --model DIR, --served-model-name NAME, --dtype, --device,
--max-model-len N, -tp/--tensor-parallel-size N, --max-num-seqs N, --enable-prefix-caching,
--lora-modules NAME=DIR, --speculative-config JSON, --host, --port, --api-key,
--ssl-certfile/--ssl-keyfile, --log-level.

The full list with every default needs the set-up: run scripts/setup.sh, then
scripts/serve.sh --help again (or see docs/configuration.md).
USAGE
        exit 0
    fi
done
bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/triton-chat" serve "$@"
