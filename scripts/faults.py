"""The fault suite as a script: the same flags and code as `specserve faults` (specserve/cli/
faults.py over specserve/tools/faults). Usage: python scripts/faults.py [--url URL] [--config
serve.yaml] [--scenarios replica_kill,...] [--out report.json] [--markdown table.md]."""

from __future__ import annotations

import sys

from specserve.cli import main

if __name__ == "__main__":
    sys.exit(main(["faults", *sys.argv[1:]]))
