"""How loading and prefill scale with the number of resident adapters (one process, in order):
the time of each `ResidentAdapters.ensure` (validate + convert into the store) at a few counts, and a
one-request prefill of 200 tokens with its own adapter (median of 6) at each mark.

    python scripts/adapter_scaling.py --adapter ~/.cache/specserve/adapters/random-r8 --marks 8,32,64

The adapter directory is the one `scripts/bench_batch.py` saves (a random rank-8 LoRA); every
variant is a copy of it. dtype float32 (the exact mode; a replica's `auto` choice on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams
from specserve.models.load import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", type=Path, required=True)
    ap.add_argument("--marks", default="8,32,64")
    args = ap.parse_args()
    marks = [int(m) for m in args.marks.split(",")]
    loaded = load_model(args.model, dtype="float32")
    limits = AdapterLimits(root=args.adapter.parent)
    resident = ResidentAdapters(loaded.model, base_model_names(args.model), limits)
    prompt = [(7 * i + 3) % loaded.model.config.vocab_size for i in range(200)]
    count = 0
    for mark in marks:
        started = time.perf_counter()
        load_s = []
        while count < mark:
            t = time.perf_counter()
            resident.ensure(f"v{count}", str(args.adapter))
            load_s.append(time.perf_counter() - t)
            count += 1
        engine = Engine(resident.model, loaded.tokenizer, frozenset())
        times = []
        for _ in range(7):
            t = time.perf_counter()
            engine.generate(prompt, SamplingParams(max_new_tokens=1), "ar", adapter="v0")
            times.append(time.perf_counter() - t)
        print(
            f"{mark} resident: loads {time.perf_counter() - started:.0f} s (first {load_s[0]:.2f} s,"
            f" last {load_s[-1]:.2f} s); prefill 200 tokens with its adapter "
            f"{statistics.median(times[1:]) * 1000:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
