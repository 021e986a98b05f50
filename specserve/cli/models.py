"""`specserve models list | pull NAME`: the model catalog, and a catalog model into the cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="list or pull catalog models")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list")
    pull = models_sub.add_parser("pull")
    pull.add_argument("name")
    pull.add_argument("--cache-dir", type=Path, default=None)
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from specserve.models.catalog import load_catalog
    from specserve.models.provision import pull_model

    if args.action == "list":
        for name, entry in load_catalog().items():
            print(f"{name}: {entry.description}")
        return 0
    path = pull_model(args.name, args.cache_dir, progress=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0
