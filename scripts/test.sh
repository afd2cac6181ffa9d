#!/usr/bin/env bash
# The test command: lint, type-check, the client library on every Python it supports, then the test suite.
# Run scripts/setup.sh --dev first.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
echo "== ruff"; ruff check .
echo "== ruff format"; ruff format --check .
echo "== mypy"; mypy
echo "== mypy (the client library on Python 3.10)"; mypy --python-version 3.10 client_lib/perseus_client
echo "== the client library on Python 3.10-3.13"; scripts/test_client_pythons.sh
echo "== pytest"; python -m pytest "$@"
