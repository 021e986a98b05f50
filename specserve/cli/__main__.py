"""`python -m specserve.cli ...`: the console script `specserve`."""

import sys

from specserve.cli import main

sys.exit(main())
