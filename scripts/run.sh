#!/usr/bin/env bash
# Set up, pull SmolLM2-135M-Instruct into the cache and run the platform on http://127.0.0.1:8000
# (`specserve up`: a private redis-server, a local Ray, the gateway and one model server).
# Extra arguments go to `specserve up` (e.g. --port 8080). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specserve models pull smollm2-135m
exec .venv/bin/specserve up "$@"
