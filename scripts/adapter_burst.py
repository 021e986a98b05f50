"""Many tenants on one replica, through ModelService (its engine-loop thread, its loader path):

1. memory: the default budget, and `--resident` variants loaded at once (MiB, process RSS);
2. cold loads (disk to first token) p50/p99: `--cold` new variants one at a time, idle replica,
   against the same requests once resident;
3. a burst over `--burst` new variants at once (more than a batch holds) while `--streams`
   long requests of a warm variant decode: refusals, and the decoding rows' per-token gap p50/p99
   during the burst against before it.

    python scripts/adapter_burst.py --resident 128 --cold 20 --burst 100 --streams 4

Every variant is a copy of one adapter directory (`scripts/bench_batch.py` saves a random rank-8
one); distinct names are distinct resident tensors, as distinct fine-tunes would be.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import psutil

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.sampling import SamplingParams
from specserve.models.load import load_model
from specserve.paths import default_cache_dir
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.service import ModelService
from specserve.policies.settings import PolicySettings

PROMPT = "Write a short note about the history of the printing press and its effect on science."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", type=Path, default=default_cache_dir() / "adapters" / "random-r8")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--resident", type=int, default=128)
    ap.add_argument("--cold", type=int, default=20)
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=BatchSettings().max_batch)
    args = ap.parse_args()
    asyncio.run(_main(args))


async def _main(args) -> None:
    loaded = load_model(args.model, dtype=args.dtype)
    rss0 = psutil.Process(os.getpid()).memory_info().rss
    adapters = ResidentAdapters(
        loaded.model, base_model_names(args.model), AdapterLimits(root=args.adapter.parent)
    )
    print(
        f"{loaded.dtype}; default budget {adapters.budget_bytes / 2**20:.0f} MiB "
        f"(share of free memory), room for {adapters.capacity} rank-8 adapters"
    )
    timings = _time_loads(adapters)
    batch = BatchSettings(max_batch=args.max_batch, max_queue=4 * args.burst)
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings(), batch=batch).start()
    try:
        started = time.perf_counter()
        for i in range(args.resident):
            adapters.ensure(f"r{i}@1", args.adapter)
        rss = psutil.Process(os.getpid()).memory_info().rss
        print(
            f"1. {len(adapters.names)} variants resident at once: "
            f"{adapters.resident_bytes / 2**20:.0f} MiB of LoRA weights, process RSS "
            f"+{(rss - rss0) / 2**20:.0f} MiB, loaded in {time.perf_counter() - started:.1f} s"
        )
        await _cold_loads(service, args)
        timings["prepare"].clear()
        timings["install"].clear()
        await _burst(service, args, "3. cold:")
        prepare, install = timings["prepare"], timings["install"]
        print(
            f"   the burst's {len(prepare)} loads: read + validate + convert (a worker thread) p50 "
            f"{1000 * _pct(prepare, 0.5):.1f} ms, p99 {1000 * _pct(prepare, 0.99):.1f} ms; "
            f"hand-over on the engine loop p50 {1000 * _pct(install, 0.5):.2f} ms, p99 "
            f"{1000 * _pct(install, 0.99):.2f} ms, max {1000 * max(install):.2f} ms"
        )
        await _burst(service, args, "4. resident (the control):")
    finally:
        service.stop()


def _time_loads(adapters: ResidentAdapters) -> dict[str, list[float]]:
    """Seconds of each `prepare` that converted something and each `install` (the two halves
    of a cold load), recorded by wrapping the instance's methods."""
    timings: dict[str, list[float]] = {"prepare": [], "install": []}
    prepare, install = adapters.prepare, adapters.install

    def timed_prepare(name, path):
        started = time.perf_counter()
        prepared = prepare(name, path)
        if prepared is not None:
            timings["prepare"].append(time.perf_counter() - started)
        return prepared

    def timed_install(prepared):
        started = time.perf_counter()
        try:
            return install(prepared)
        finally:
            timings["install"].append(time.perf_counter() - started)

    adapters.prepare, adapters.install = timed_prepare, timed_install
    return timings


def _request(name: str, path: Path, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        target=Target(name=name, version=1, adapter_path=str(path)),
        messages=[{"role": "user", "content": PROMPT}],
        params=SamplingParams(max_new_tokens=max_tokens, ignore_eos=True),  # lengths as asked
        strategy="ar",
    )


async def _first_token(service: ModelService, request: GenerateRequest) -> tuple[float, str]:
    """(seconds to the first delta, finish: 'done' or the error's class name)."""
    started = time.perf_counter()
    first = None
    try:
        async for event in service.generate(request):
            if first is None:
                first = time.perf_counter() - started
        return first if first is not None else time.perf_counter() - started, "done"
    except Exception as err:  # noqa: BLE001 - counted as a refusal by kind
        return time.perf_counter() - started, type(err).__name__


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _cold_loads(service: ModelService, args) -> None:
    cold = [
        await _first_token(service, _request(f"c{i}", args.adapter, 4)) for i in range(args.cold)
    ]
    warm = [
        await _first_token(service, _request(f"c{i}", args.adapter, 4)) for i in range(args.cold)
    ]
    assert all(outcome == "done" for _, outcome in cold + warm), cold + warm
    cold_s, warm_s = [t for t, _ in cold], [t for t, _ in warm]
    print(
        f"2. time to first token over {args.cold} variants, idle replica: cold (disk to first "
        f"token) p50 {1000 * _pct(cold_s, 0.5):.0f} ms, p99 {1000 * _pct(cold_s, 0.99):.0f} ms; "
        f"resident p50 {1000 * _pct(warm_s, 0.5):.0f} ms, p99 {1000 * _pct(warm_s, 0.99):.0f} ms"
    )


async def _burst(service: ModelService, args, label: str) -> None:
    """`args.burst` requests over as many variants (b0, b1, ...) while `args.streams` long
    requests of one variant decode; the same burst again finds every variant resident."""
    gaps = service.scheduler.recent_token_gaps
    streams = [
        asyncio.create_task(_first_token(service, _request("warm", args.adapter, 160)))
        for _ in range(args.streams)
    ]
    await asyncio.sleep(3.0)  # the streams decode alone for a while: the baseline gaps
    before = list(gaps)
    gaps.clear()
    loads_before = service.adapters.stats.loads
    started = time.perf_counter()
    burst = await asyncio.gather(
        *[_first_token(service, _request(f"b{i}", args.adapter, 8)) for i in range(args.burst)]
    )
    seconds = time.perf_counter() - started
    during = list(gaps)
    await asyncio.gather(*streams)
    outcomes: dict[str, int] = {}
    for _, outcome in burst:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    ttft = [t for t, _ in burst]
    print(
        f"{label} burst of {args.burst} requests over {args.burst} variants (max batch "
        f"{args.max_batch}) beside {args.streams} decoding streams: {outcomes} in {seconds:.1f} s, "
        f"{service.adapters.stats.loads - loads_before} loads, {service.adapters.stats.evictions} "
        f"evictions so far; time to first token p50 {_pct(ttft, 0.5):.2f} s, p99 "
        f"{_pct(ttft, 0.99):.2f} s"
    )
    print(
        f"   decoding rows' per-token gap (hand-overs + decode step): before the burst p50 "
        f"{1000 * statistics.median(before):.0f} ms, p99 {1000 * _pct(before, 0.99):.0f} ms "
        f"({len(before)} steps); during it p50 {1000 * statistics.median(during):.0f} ms, p99 "
        f"{1000 * _pct(during, 0.99):.0f} ms ({len(during)} steps, up to {args.max_batch} rows)"
    )


if __name__ == "__main__":
    main()
