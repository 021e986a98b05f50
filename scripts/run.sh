#!/usr/bin/env bash
# Set up, pull SmolLM2-135M-Instruct into the cache and stream a Lookahead-decoded answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specserve models pull smollm2-135m
PROMPT=${1:-"Explain in three sentences why the sky is blue."}
exec .venv/bin/specserve generate --model smollm2-135m --strategy lookahead \
  --max-new-tokens 128 --prompt "$PROMPT"
