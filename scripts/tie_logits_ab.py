"""Verification logits in the model's dtype vs float32 (`--logits float32`): the measured tie
tolerance (logit-gap noise between 1-row, k-row and cache-free forwards) and the forward cost.

    python scripts/tie_logits_ab.py --dtype bfloat16
"""

from __future__ import annotations

import argparse

from specserve.engine.forward.head import install_head
from specserve.engine.ties import measure_tolerance, tolerance_sequences
from specserve.engine.tuning.cost import measure_cost_curve
from specserve.models.load import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    sequences = tolerance_sequences(loaded.tokenizer, loaded.model.config.vocab_size)
    for label in ("model dtype", "float32 head"):
        if label == "float32 head":
            install_head(loaded.model, float32=True)
        tol = measure_tolerance(loaded.model, sequences)
        cost = measure_cost_curve(loaded.model, "ab", sizes=(1, 4), repeats=5)
        print(
            f"{label}: tolerance {tol.tolerance} (by width {tol.by_width}, vs plain "
            f"{tol.vs_plain}); forward ms {cost.ms}"
        )


if __name__ == "__main__":
    main()
