"""In-process ceiling of the engine loop: C requests kept in flight (a finished one is replaced at
once) over 8 resident copies of one LoRA adapter, `ar`, no HTTP, no Ray. Prints tokens/s.

    python scripts/bench_batch.py --concurrency 16 --requests 32 --max-tokens 128 --mix
    python scripts/bench_batch.py --concurrency 1 --requests 4 --max-tokens 128 --mix

`--mix` interleaves the six Spec-Bench tasks (as `specserve loadtest` does); without it the file's
order (MT-bench's short prompts first).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.engine.decode import Engine
from specserve.engine.dtype_choice import Workload
from specserve.engine.models import default_cache_dir, load_model
from specserve.engine.prompts import encode_messages
from specserve.engine.sampling import SamplingParams
from specserve.engine.scheduler import BatchSettings, Scheduler
from specserve.loadtest import interleave_tasks
from specserve.platform.settings import PlatformSettings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", type=Path, default=default_cache_dir() / "adapters" / "pydocs-v2")
    ap.add_argument("--variants", type=int, default=8)
    ap.add_argument(
        "--random-rank",
        type=int,
        default=8,
        help="when --adapter does not exist, save a random LoRA of this rank (q/k/v/o) there",
    )
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    ap.add_argument("--mix", action="store_true", help="interleave the six tasks")
    ap.add_argument("--prefill-chunk", type=int, default=BatchSettings().prefill_chunk)
    ap.add_argument("--first", type=int, default=0, help="start at this prompt of the sequence")
    ap.add_argument("--dtype", default="auto", help="auto (measured, cached) / float32 / bfloat16")
    ap.add_argument(
        "--dtype-rows",
        type=int,
        default=PlatformSettings().dtype_rows,
        help="decode rows auto prices at (default: the model server's)",
    )
    args = ap.parse_args()

    loaded = load_model(args.model, dtype=args.dtype, workload=Workload(rows=args.dtype_rows))
    print(f"dtype {loaded.dtype}", loaded.dtype_choice.reason if loaded.dtype_choice else "")
    if not args.adapter.exists():
        _random_adapter(loaded.model, args.adapter, args.random_rank, args.model)
    limits = AdapterLimits(
        root=args.adapter.parent, max_resident=max(args.variants, 1), max_resident_bytes=2**40
    )
    adapters = ResidentAdapters(loaded.model, base_model_names(args.model), limits)
    names = [f"v{i}" for i in range(args.variants)]
    for name in names:
        adapters.ensure(name, str(args.adapter))
    engine = Engine(adapters.model, loaded.tokenizer, loaded.eos_token_ids)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    texts = interleave_tasks(rows) if args.mix else [r["turns"][0] for r in rows]
    prompts = [encode_messages(loaded.tokenizer, [{"role": "user", "content": t}]) for t in texts]
    params = SamplingParams(max_new_tokens=args.max_tokens)
    scheduler = Scheduler(engine, BatchSettings(prefill_chunk=args.prefill_chunk))
    count = {"next": 0, "done": 0, "tokens": 0}

    def submit() -> None:
        i = count["next"]
        count["next"] += 1
        state = engine.start(
            prompts[(args.first + i) % len(prompts)],
            params,
            "ar",
            None,
            None,
            names[i % len(names)],
        )
        scheduler.submit(state, names[i % len(names)], True, sink)

    def sink(step, finished: bool) -> None:
        if step is not None:
            count["tokens"] += len(step.new_ids)
        if finished:
            count["done"] += 1
            if count["next"] < args.requests:
                submit()

    start = time.perf_counter()
    for _ in range(args.concurrency):
        submit()
    while count["done"] < args.requests:
        scheduler.step()
    seconds = time.perf_counter() - start
    stats = scheduler.stats()
    print(
        f"concurrency {args.concurrency}, {args.requests} requests, {args.max_tokens} max tokens, "
        f"{'mixed tasks' if args.mix else 'file order'}, prefill chunk {args.prefill_chunk}: "
        f"{count['tokens'] / seconds:.1f} tok/s ({count['tokens']} tokens in {seconds:.1f} s, "
        f"{scheduler.steps} steps; decode {stats['decode_seconds']:.1f} s at "
        f"{stats['decode_rows'] / max(stats['decode_steps'], 1):.1f} rows per step, prefill "
        f"{stats['prefill_seconds']:.1f} s for {stats['prefill_tokens']} prompt tokens)"
    )
    step_ms = 1000 * stats["decode_seconds"] / max(stats["decode_steps"], 1)
    prefill_ms = 1000 * stats["prefill_seconds"] / max(stats["prefill_tokens"], 1)
    resident_mb = adapters.resident_bytes / 2**20
    print(
        f"{args.variants} variants resident ({resident_mb:.0f} MB of LoRA weights): decode step "
        f"{step_ms:.1f} ms, prefill {prefill_ms:.2f} ms/token"
    )


def _random_adapter(model, path: Path, rank: int, base_name: str) -> None:
    """A random non-zero LoRA adapter on a copy of `model`'s attention projections (throughput
    only: what it computes does not matter here)."""
    import copy

    import peft
    import torch

    config = peft.LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
    )
    torch.manual_seed(0)
    wrapped = peft.get_peft_model(copy.deepcopy(model).float(), config)
    wrapped.save_pretrained(path)
    config_path = path / "adapter_config.json"
    saved = json.loads(config_path.read_text())
    saved["base_model_name_or_path"] = base_name
    config_path.write_text(json.dumps(saved, indent=2))


if __name__ == "__main__":
    main()
