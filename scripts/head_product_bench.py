"""The LM head's product for a few rows: `F.linear(x, W)` against the column form (W @ x^T)^T,
alone (caches flushed between calls; the whole head and a drafter-sized slice) and inside the verify forward (the head timed by hooks while
`measure_cost_curve` runs, with the column product off and on).

    python scripts/head_product_bench.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specserve.engine.forward.head import LmHead
from specserve.engine.tuning.cost import measure_cost_curve
from specserve.models.load import load_model

ROWS = (1, 2, 4, 8, 16)


def alone(weight: torch.Tensor, label: str, repeats: int = 15) -> None:
    """Median ms of each product per row count, a 256 MB buffer rewritten before every call."""
    junk = torch.empty(64 * 1024 * 1024)
    products = {"F.linear": lambda x: F.linear(x, weight), "column": lambda x: (weight @ x.T).T}
    for name, product in products.items():
        cells = []
        for m in ROWS:
            x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
            times = []
            for _ in range(repeats):
                junk.fill_(1.0)
                start = time.perf_counter()
                product(x)
                times.append(time.perf_counter() - start)
            cells.append(f"{m}: {statistics.median(times) * 1e3:.1f}")
        print(f"alone, {label}, {name} (ms by rows): " + ", ".join(cells))


def in_forward(model, sizes=(1, 2, 4, 8)) -> None:
    """The head's median ms by rows and the curve, column off then on (then both again)."""
    head = model.get_output_embeddings()
    for column in (False, True, False, True):
        lm = LmHead(head.weight, head.bias, column)
        times: dict[int, list[float]] = {}
        _time_head(lm, times)
        model.set_output_embeddings(lm)
        curve = measure_cost_curve(model, "bench", sizes=sizes, repeats=5)
        head_ms = {k: round(statistics.median(v) * 1e3, 1) for k, v in sorted(times.items())}
        print(f"column {column}: head ms by rows {head_ms}; verify forward ms {curve.ms}")
    model.set_output_embeddings(head)


def _time_head(lm: LmHead, times: dict[int, list[float]]) -> None:
    """Hooks appending each call's seconds to times[rows]."""
    lm.register_forward_pre_hook(lambda mod, args: setattr(mod, "_t0", time.perf_counter()))

    def done(mod, args, out) -> None:
        times.setdefault(out.shape[-2], []).append(time.perf_counter() - mod._t0)

    lm.register_forward_hook(done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft-vocab", type=int, default=6720, help="a drafter head's rows")
    args = ap.parse_args()
    model = load_model(args.model, dtype="float32").model
    weight = model.get_output_embeddings().weight.detach()
    print(f"head {tuple(weight.shape)} float32, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        alone(weight, "the head")
        # a drafter's head: the rows of its draft vocabulary (the shape is what matters)
        alone(weight[: args.draft_vocab].contiguous(), f"{args.draft_vocab} draft rows")
        in_forward(model)


if __name__ == "__main__":
    main()
