"""`python -m scripts.k8s_validate [OVERLAY ...]`: every overlay's problems; exit 1 if any."""

from scripts.k8s_validate.check import main

raise SystemExit(main())
