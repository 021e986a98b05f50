"""`python -m specserve`: the command line (specserve.cli)."""

import sys

from specserve.cli import main

sys.exit(main())
