"""`specserve models list | pull NAME | show NAME_OR_PATH`: the model catalog, a catalog model
into the cache, and whether (and why) a model's architecture is served."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="list, pull or show models")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list")
    pull = models_sub.add_parser("pull")
    pull.add_argument("name")
    pull.add_argument("--cache-dir", type=Path, default=None)
    show = models_sub.add_parser("show", help="the model's family and why it is served")
    show.add_argument("name", help="catalog name, HF model directory or .gguf file")
    show.add_argument("--cache-dir", type=Path, default=None)
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from specserve.models.catalog import load_catalog  # lazy: +10 ms (yaml)
    from specserve.models.provision import pull_model  # lazy: +2.8 s (torch, transformers)

    if args.action == "list":
        for name, entry in load_catalog().items():
            print(f"{name}: {entry.description}")
        return 0
    if args.action == "show":
        return _show(args)
    path = pull_model(args.name, args.cache_dir, progress=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0


def _show(args) -> int:
    from specserve.models.catalog import ModelLoadError  # lazy: +10 ms (yaml)
    from specserve.models.load import model_family  # lazy: +2.8 s (torch, transformers)

    try:
        family = model_family(args.name, args.cache_dir)
    except ModelLoadError as e:
        print(f"{args.name}: refused: {e}")
        return 1
    print(f"{args.name}: {family.model_type} ({family.name})")
    print(f"  served: {family.reason or family.admitted}")
    print(f"  default LoRA targets: {', '.join(family.lora_targets)}")
    if family.features:
        print(f"  attention features: {', '.join(family.features)}")
    return 0
