"""The device cost curve (`engine/tuning/cost.py`) measured over caches of several lengths:
relative cost of a k-row chain and binary tree against one row, per context, to see how far the
one cached curve (200 positions) holds for long prompts.

  python scripts/cost_by_context.py --contexts 100,200,400,800 [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import platform

import torch

from specserve.engine.tuning.cost import measure_cost_curve
from specserve.models.load import load_model

WIDTHS = (2, 4, 8, 12, 16, 24)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="100,200,400,800")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.dtype}")
    print("context  1 row ms  " + "  ".join(f"chain {w:>2} / tree" for w in WIDTHS))
    for context in (int(c) for c in args.contexts.split(",")):
        curve = measure_cost_curve(
            loaded.model, loaded.model_id, context=context, repeats=args.repeats
        )
        cells = (f"{curve.relative(w):8.3f} / {curve.relative_tree(w):.3f}" for w in WIDTHS)
        print(f"{context:7d}  {curve.ms[1]:8.1f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
