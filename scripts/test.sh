#!/usr/bin/env bash
# The test command: lint, type-check, then the test suite. Run scripts/setup.sh --dev first.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
echo "== ruff"; ruff check .
echo "== ruff format"; ruff format --check .
echo "== mypy"; mypy
echo "== pytest"; python -m pytest "$@"
