#!/usr/bin/env bash
# Set up (if needed) and run the test suite; slow and GPU tests are deselected by marker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
