"""In-process ceiling of the engine loop: C requests kept in flight (a finished one is replaced at
once) over N resident copies of one LoRA adapter, `ar`, no HTTP, no Ray. Prints tokens/s.

    python scripts/bench_batch.py --concurrency 16 --requests 32 --max-tokens 64 --mix \
        --variants 8,64,256 --rounds 2

Each request's variant is drawn (seeded) over all N, so a large N touches adapters across the whole
resident set. Every count of `--variants` runs `--rounds` times, the counts alternating (8, 64, 256, 8, ...) on
one loaded model holding max(counts) adapters, after one warm-up run; the table gives each count's
median and the median over rounds of its ratio to the first count in the same round (paired, so
the drift of a noisy machine between rounds cancels). `--concurrency 16,1` alternates stream
counts the same way, on the same requests (the 16 / 1 scaling, paired round by round). `--mix` interleaves the six
Spec-Bench tasks (as `specserve loadtest` does); without it the file's order.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.forward import compiled_batch
from specserve.engine.prompts import encode_messages
from specserve.engine.sampling import SamplingParams
from specserve.engine.tuning.dtype_choice import Workload
from specserve.models.load import load_model
from specserve.paths import default_cache_dir
from specserve.platform.settings import PlatformSettings
from specserve.tools.loadtest import interleave_tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", type=Path, default=default_cache_dir() / "adapters" / "random-r8")
    ap.add_argument("--variants", default="8", help="comma-separated counts of distinct variants")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each count, alternating")
    ap.add_argument(
        "--random-rank",
        type=int,
        default=8,
        help="when --adapter does not exist, save a random LoRA of this rank (q/k/v/o) there",
    )
    ap.add_argument("--concurrency", default="16", help="comma-separated stream counts")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    ap.add_argument("--mix", action="store_true", help="interleave the six tasks")
    ap.add_argument("--prefill-chunk", type=int, default=BatchSettings().prefill_chunk)
    ap.add_argument("--dtype", default="auto", help="auto (measured, cached) / float32 / bfloat16")
    ap.add_argument(
        "--dtype-rows",
        type=int,
        default=PlatformSettings().dtype_rows,
        help="rows of the serving step auto times (default: the model server's)",
    )
    ap.add_argument(
        "--compile",
        choices=("off", "on"),
        default="off",
        help="on: warm the compiled batched forward, then run every count eager and compiled "
        "in alternation (paired ratios)",
    )
    args = ap.parse_args()
    counts = [int(c) for c in args.variants.split(",")]
    streams = [int(c) for c in args.concurrency.split(",")]

    loaded = load_model(args.model, dtype=args.dtype, workload=Workload(rows=args.dtype_rows))
    print(f"dtype {loaded.dtype}", loaded.dtype_choice.reason if loaded.dtype_choice else "")
    if not args.adapter.exists():
        _random_adapter(loaded.model, args.adapter, args.random_rank, args.model)
    adapters = ResidentAdapters(
        loaded.model, base_model_names(args.model), AdapterLimits(root=args.adapter.parent)
    )
    started = time.perf_counter()
    names = [f"v{i}" for i in range(max(counts))]
    for name in names:
        adapters.ensure(name, str(args.adapter))
    print(
        f"{len(names)} adapters loaded in {time.perf_counter() - started:.1f} s: "
        f"{adapters.resident_bytes / 2**20:.0f} MiB of {adapters.budget_bytes / 2**20:.0f} MiB "
        f"budget (default settings: room for {adapters.capacity} rank-8 adapters)"
    )
    engine = Engine(adapters.model, loaded.tokenizer, loaded.eos_token_ids)
    target = None
    if args.compile == "on":
        target = compiled_batch.attach_batch(adapters.model, compiled_batch.BatchCompileSettings())
        record = target.warm(args.model)
        print(f"compiled batched forward: {record.model_dump_json()}", flush=True)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    texts = interleave_tasks(rows) if args.mix else [r["turns"][0] for r in rows]
    prompts = [encode_messages(loaded.tokenizer, [{"role": "user", "content": t}]) for t in texts]
    modes = ["eager", "compiled"] if target is not None else ["eager"]
    keys = [(n, c, m) for n in streams for c in counts for m in modes]
    runs: dict[tuple, list[dict]] = {k: [] for k in keys}
    _run(engine, args, prompts, names[: counts[0]], streams[0])  # warm-up: first forwards
    for _ in range(args.rounds):
        for key in keys:
            n, count, mode = key
            if target is not None:
                target.enabled = mode == "compiled"
            runs[key].append(_run(engine, args, prompts, names[:count], n))
            r = runs[key][-1]
            print(
                f"  {n} streams, {count} variants {mode}: {r['tok_s']:.1f} tok/s, decode step "
                f"{r['step_ms']:.1f} ms at {r['rows']:.1f} rows, prefill {r['prefill_ms']:.3f} "
                "ms/token",
                flush=True,
            )
    first = runs[keys[0]]
    print(
        f"{args.requests} requests, {args.max_tokens} max tokens, "
        f"{'mixed tasks' if args.mix else 'file order'}, medians of {args.rounds}:"
    )
    print(
        "| streams | variants | forward | tok/s | vs first (paired) | decode step "
        "| prefill per token | vs first |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in keys:
        n, count, mode = key
        got = runs[key]
        med = {k: statistics.median(r[k] for r in got) for k in got[0]}
        tok = [r["tok_s"] / f["tok_s"] for r, f in zip(got, first, strict=True)]
        pre = [r["prefill_ms"] / f["prefill_ms"] for r, f in zip(got, first, strict=True)]
        print(
            f"| {n} | {count} | {mode} | {med['tok_s']:.1f} | {statistics.median(tok):.3f}x "
            f"({', '.join(f'{x:.2f}' for x in tok)}) | {med['step_ms']:.1f} ms at "
            f"{med['rows']:.1f} rows | {med['prefill_ms']:.3f} ms | {statistics.median(pre):.3f}x "
            f"({', '.join(f'{x:.2f}' for x in pre)}) |"
        )


def _run(engine, args, prompts, names: list[str], concurrency: int) -> dict:
    """One run: `args.requests` requests over `names`, `concurrency` in flight."""
    params = SamplingParams(max_new_tokens=args.max_tokens)
    scheduler = Scheduler(engine, BatchSettings(prefill_chunk=args.prefill_chunk))
    count = {"next": 0, "done": 0, "tokens": 0}
    # each request's variant drawn over all of `names` (the same draws for every run of a count),
    # so 256 variants touch adapters across the whole resident set, not the first `requests`
    rng = random.Random(len(names))
    picks = [rng.choice(names) for _ in range(args.requests)]

    def submit() -> None:
        i = count["next"]
        count["next"] += 1
        name = picks[i]
        state = engine.start(prompts[i % len(prompts)], params, "ar", None, None, name)
        scheduler.submit(state, name, True, sink)

    def sink(step, finished: bool) -> None:
        if step is not None:
            count["tokens"] += len(step.new_ids)
        if finished:
            count["done"] += 1
            if count["next"] < args.requests:
                submit()

    start = time.perf_counter()
    for _ in range(concurrency):
        submit()
    while count["done"] < args.requests:
        scheduler.step()
    seconds = time.perf_counter() - start
    stats = scheduler.stats()
    return {
        "tok_s": count["tokens"] / seconds,
        "step_ms": 1000 * stats.decode_seconds / max(stats.decode_steps, 1),
        "rows": stats.decode_rows / max(stats.decode_steps, 1),
        "prefill_ms": 1000 * stats.prefill_seconds / max(stats.prefill_tokens, 1),
    }


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
