#!/usr/bin/env bash
# Set up if needed, then lint, type-check and run the tests; extra arguments go to pytest
# (e.g. `scripts/test.sh -m "not e2e"` for the fast tiers only).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest -q "$@"
