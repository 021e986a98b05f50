"""One decode step of the engine loop over R requests (mixed Spec-Bench prompts, 8 LoRA variants),
with transformers' sdpa against specserve's row-wise attention, alternated on the same batch so the
machine's drift hits both. Prints the median step time of each and their ratio.

    python scripts/bench_batch_step.py --strategy ar --rows 16
    python scripts/bench_batch_step.py --strategy lookahead --rows 16
    python scripts/bench_batch_step.py --rows 16 --profile   # then torch.profiler's top ops
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.engine import hf_internals
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
    ap.add_argument("--adapter", type=Path, default=default_cache_dir() / "adapters" / "pydocs-v2")
    ap.add_argument("--strategy", default="ar")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30, help="decode steps in all (alternated)")
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    ap.add_argument(
        "--profile", action="store_true", help="then profile 5 row-attention steps (top ops)"
    )
    args = ap.parse_args()

    loaded = load_model(args.model)
    limits = AdapterLimits(root=args.adapter.parent)
    adapters = ResidentAdapters(loaded.model, base_model_names(args.model), limits)
    names = [f"v{i}" for i in range(8)]
    for name in names:
        adapters.ensure(name, str(args.adapter))
    engine = Engine(adapters.model, loaded.tokenizer, loaded.eos_token_ids)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    texts = interleave_tasks(rows)[: args.rows]
    scheduler = Scheduler(engine, BatchSettings(prefill_chunk=1 << 20))  # all prefilled at once
    params = SamplingParams(max_new_tokens=10 * args.steps, ignore_eos=True)
    for i, text in enumerate(texts):
        prompt = encode_messages(loaded.tokenizer, [{"role": "user", "content": text}])
        name = names[i % len(names)]
        state = engine.start(prompt, params, args.strategy, None, None, name)
        scheduler.submit(state, name, False, lambda step, finished: None)
    while len(scheduler.decoding) < len(texts):
        scheduler.step()
    base = engine.model  # the plain LlamaForCausalLM (adapters sit in its LoRAStore)
    times: dict[str, list[float]] = {"sdpa": [], hf_internals.ROW_ATTENTION: []}
    for i in range(args.steps):
        impl = list(times)[i % 2]
        base.set_attn_implementation(impl)  # sdpa ignores the row extents the batch passes
        started = time.perf_counter()
        scheduler._decode()
        times[impl].append(time.perf_counter() - started)
    sdpa, rows_ms = (statistics.median(t) * 1000 for t in times.values())
    lengths = [len(t.state.tokens) for t in scheduler.decoding]
    print(
        f"{args.strategy}, {len(texts)} rows (context {min(lengths)}-{max(lengths)} tokens): "
        f"median step sdpa {sdpa:.0f} ms, row attention {rows_ms:.0f} ms, ratio {sdpa / rows_ms:.2f}"
    )
    if args.profile:
        base.set_attn_implementation(hf_internals.ROW_ATTENTION)  # the serving attention
        _profile(scheduler)


def _profile(scheduler: Scheduler, steps: int = 5) -> None:
    """torch.profiler over `steps` decode steps of the serving attention: the ops by self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            scheduler._decode()
    print(f"{steps} steps:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
