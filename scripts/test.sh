#!/usr/bin/env bash
# Set up a virtual environment (if missing) and run lint + the whole CPU test suite.
# Usage: bash scripts/test.sh [extra pytest args]
# TORCH_SPEC picks the torch build; the default is the CPU-only wheel this project is tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -e ".[test,eval,lab]"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/python" -m pytest "$@"
