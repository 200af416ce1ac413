#!/usr/bin/env bash
# Set up if needed, then run `triton-chat serve` with the given flags (see `--help`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/triton-chat" serve "$@"
