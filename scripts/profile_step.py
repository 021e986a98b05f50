"""Where one request's decode time goes outside the target forward (cProfile over `generate`).

    python scripts/profile_step.py --dtype auto --strategy ar --prompts 6 --max-tokens 128

Prints, per decode step, the milliseconds inside the model's forward, inside the rest of
`verify_forward` (mask and input building), and in propose / accept / commit / text streaming,
plus the plain `generate()` time per token on the same prompts for comparison.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

import torch

from specserve.engine.decode.engine import Engine
from specserve.engine.prompts import encode_prompt
from specserve.engine.sampling import SamplingParams
from specserve.models.load import load_model
from specserve.tools.bench import run_hf

PARTS = {  # label -> (file suffix, function name) whose cumulative time is reported
    "verify_forward": ("engine/forward/single.py", "verify_forward"),
    "model forward": ("torch/nn/modules/module.py", "_wrapped_call_impl"),
    "build_inputs": ("engine/forward/single.py", "build_inputs"),
    "propose": ("engine/decode/core.py", "propose"),
    "accept": ("engine/decode/core.py", "accept"),
    "commit": ("engine/decode/core.py", "commit"),
    "keep_rows": ("engine/hf_internals/cache.py", "keep_rows"),
    "text stream": ("engine/textstream.py", "push"),
}


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Seconds spent in (and under) the first top-level call of `name` in a file ending `suffix`
    (for `_wrapped_call_impl` only calls made from verify_forward, i.e. the model's own)."""
    total = 0.0
    for (file, _line, func), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
        if func == name and file.endswith(suffix):
            if name == "_wrapped_call_impl":  # only the top-level model, called by verify_forward
                ct = sum(v[3] for (f, _, fn), v in callers.items() if fn == "verify_forward")
            total += ct
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--strategy", default="ar")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    args = ap.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    engine = Engine.from_loaded(loaded)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()][::80][: args.prompts]
    prompts = [encode_prompt(loaded.tokenizer, r["turns"][0]) for r in rows]
    params = SamplingParams(max_new_tokens=args.max_tokens)
    engine.generate(prompts[0], SamplingParams(max_new_tokens=4), args.strategy)  # warm-up
    hf_s = hf_tokens = 0
    for ids in prompts:
        start = time.perf_counter()
        hf_tokens += len(run_hf(loaded.model, ids, args.max_tokens, loaded.eos_token_ids, False)[0])
        hf_s += time.perf_counter() - start
    profiler = cProfile.Profile()
    steps = tokens = 0
    start = time.perf_counter()
    profiler.enable()
    for ids in prompts:
        result = engine.generate(ids, params, args.strategy)
        steps += result.forwards
        tokens += len(result.output_ids)
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    print(
        f"{loaded.dtype}, {args.strategy}, {len(prompts)} prompts, {tokens} tokens, {steps} forwards"
    )
    print(
        f"wall {1000 * wall / steps:.1f} ms per forward (cProfile on; hf generate() "
        f"{1000 * hf_s / hf_tokens:.1f} ms per token without it)"
    )
    for label, (suffix, name) in PARTS.items():
        print(f"  {label:<15} {1000 * cumulative(stats, suffix, name) / steps:7.2f} ms per forward")
    print(f"torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
