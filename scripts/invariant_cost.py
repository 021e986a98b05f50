"""Cost of the position-invariant attention against the plain (row / sdpa) attention: one
verify forward of k query rows (a chain draft; with `--shape tree` a binary tree, node i's
parent (i - 1) // 2; with `--shape branches` two chains from the pending token) over a
300-token cache (each as the engine serves it), paired and interleaved in one run, per width.
Prints JSON.
Usage: python scripts/invariant_cost.py [--dtype bfloat16] [--shape chain|tree|branches]."""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import time

import torch

from specserve.engine import hf_internals
from specserve.engine.forward import invariance
from specserve.engine.forward.single import verify_forward
from specserve.engine.tree import Draft, DraftTree
from specserve.models.load import load_model


def _cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Model name" in ln), "")
    return f"{name} ({'avx512_bf16' if 'avx512_bf16' in out else 'no avx512_bf16'})"


def _draft(width: int, shape: str) -> Draft:
    """k - 1 draft tokens after the pending one: a chain, a binary tree, or two chains from the
    pending token (`branches`: two n-gram matches, as prompt lookup drafts)."""
    n = width - 1
    if shape == "chain":
        parents = list(range(-1, n - 1))
    elif shape == "tree":
        parents = [(i - 1) // 2 for i in range(n)]
    else:
        half = (n + 1) // 2
        parents = [i - 1 for i in range(half)] + [
            -1 if i == half else i - 1 for i in range(half, n)
        ]
    tokens = [7 + (i == (n + 1) // 2 and shape == "branches") for i in range(n)]
    return Draft(DraftTree(tuple(tokens), tuple(parents)))


def _time(model, cache, past: int, width: int, shape: str = "chain") -> float:
    draft = _draft(width, shape)
    start = time.perf_counter()
    verify_forward(model, cache, past, [5], draft)
    took = time.perf_counter() - start
    hf_internals.keep_rows(cache, past, [])  # back to `past` positions
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shape", choices=("chain", "tree", "branches"), default="chain")
    args = parser.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    plain = loaded.model
    inv = copy.deepcopy(plain)
    report = invariance.apply(inv)
    hf_internals.enable_row_attention(plain)
    prompt = list(range(100, 100 + args.context))
    caches = {}
    for name, model in (("plain", plain), ("invariant", inv)):
        # each cache as the engine builds it: the invariant forward's appends in place
        caches[name] = hf_internals.new_cache(
            model.config, growing=hf_internals.is_invariant(model)
        )
        verify_forward(model, caches[name], 0, prompt, Draft())
    rows = {}
    for width in (1, 2, 4, 8, 16):
        times = {"plain": [], "invariant": []}
        for _ in range(args.repeats):
            for name, model in (("plain", plain), ("invariant", inv)):
                times[name].append(_time(model, caches[name], args.context, width, args.shape))
        ratio = [i / p for i, p in zip(times["invariant"], times["plain"], strict=True)]
        rows[width] = {
            "plain_ms": round(statistics.median(times["plain"]) * 1000, 2),
            "invariant_ms": round(statistics.median(times["invariant"]) * 1000, 2),
            "ratio_median": round(statistics.median(ratio), 3),
        }
    print(
        json.dumps(
            {
                "cpu": _cpu(),
                "machine": platform.machine(),
                "dtype": args.dtype,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "context": args.context,
                "shape": args.shape,
                "probe": report.model_dump(),
                "widths": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
