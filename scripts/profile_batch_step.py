"""Where a 16-row decode step of the engine loop goes, by operator (torch.profiler): mixed
Spec-Bench prompts, 8 LoRA variants, one dtype. Prints a Markdown table of the operators with
the most self CPU time and their share of the profiled steps.

    python scripts/profile_batch_step.py --dtype bfloat16 --rows 16 --steps 6
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.prompts import encode_messages
from specserve.engine.sampling import SamplingParams
from specserve.models.load import load_model
from specserve.paths import default_cache_dir
from specserve.tools.loadtest import interleave_tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", type=Path, default=default_cache_dir() / "adapters" / "random-r8")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--strategy", default="ar")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6, help="decode steps profiled")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    args = ap.parse_args()

    loaded = load_model(args.model, dtype=args.dtype)
    adapters = ResidentAdapters(
        loaded.model, base_model_names(args.model), AdapterLimits(root=args.adapter.parent)
    )
    names = [f"v{i}" for i in range(8)]
    for name in names:
        adapters.ensure(name, str(args.adapter))
    engine = Engine(adapters.model, loaded.tokenizer, loaded.eos_token_ids)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    texts = interleave_tasks(rows)[: args.rows]
    scheduler = Scheduler(engine, BatchSettings())
    params = SamplingParams(max_new_tokens=40 + args.steps * 8, ignore_eos=True)
    for i, text in enumerate(texts):
        prompt = encode_messages(loaded.tokenizer, [{"role": "user", "content": text}])
        state = engine.start(prompt, params, args.strategy, None, None, names[i % len(names)])
        scheduler.submit(state, names[i % len(names)], False, lambda step, finished: None)
    while len(scheduler.decoding) < len(texts):
        scheduler.step()
    scheduler._decode()  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            scheduler._decode()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    lengths = [len(t.state.tokens) for t in scheduler.decoding]
    print(
        f"{args.dtype}, {args.strategy}, {len(lengths)} rows, context {min(lengths)}-"
        f"{max(lengths)} tokens, invariant {engine.invariance.invariant}: "
        f"{total / args.steps / 1000:.1f} ms of operator time a step"
    )
    print("| operator | share | ms a step | calls a step |")
    print("| --- | --- | --- | --- |")
    for e in events[: args.top]:
        share = e.self_cpu_time_total / total
        ms = e.self_cpu_time_total / args.steps / 1000
        print(f"| `{e.key}` | {share:.1%} | {ms:.2f} | {e.count // args.steps} |")


if __name__ == "__main__":
    main()
