"""The probe's batch check: requests of mixed prompt lengths, strategies and adapters (the LoRA
and the base) joining a `Scheduler` at different steps each decode what they decode alone.
"""

from __future__ import annotations

from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.probe.checks import ADAPTER, STRATEGIES, CheckFailed, Probe, same_tokens
from specserve.engine.probe.result import CheckFailure
from specserve.engine.sampling import SamplingParams

MAX_NEW = 12
MAX_STEPS = 400


def _requests(p: Probe) -> list[dict]:
    long = p.prompts[1]
    lengths = (1, 5, 17, 30, 9, 14)
    adapters = (BASE_ADAPTER, ADAPTER, ADAPTER, BASE_ADAPTER, ADAPTER, BASE_ADAPTER)
    names = list(STRATEGIES) + ["ar"]
    return [
        {
            "prompt": (long if n <= len(long) else long * 2)[-n:],
            "strategy": names[i],
            "adapter": adapters[i],
            "join": (0, 0, 1, 2, 4, 6)[i],
            "temperature": 0.9 if i == 5 else 0.0,  # one seeded sampled row
        }
        for i, n in enumerate(lengths)
    ]


def _start(p: Probe, req: dict):
    params = SamplingParams(
        max_new_tokens=MAX_NEW, ignore_eos=True, temperature=req["temperature"], seed=11
    )
    strategy = req["strategy"]
    return p.engine.start(
        req["prompt"], params, strategy, STRATEGIES[strategy], None, req["adapter"]
    )


def batched_equal_alone(p: Probe) -> None:
    reqs = _requests(p)
    scheduler = Scheduler(p.engine, BatchSettings(max_batch=4, prefill_chunk=16))
    seen: dict[int, list[int]] = {i: [] for i in range(len(reqs))}
    done: set[int] = set()
    step = 0
    while len(done) < len(reqs):
        for i, req in enumerate(reqs):
            if req["join"] == step:

                def sink(result, finished, i=i):
                    if result is not None:
                        seen[i].extend(result.new_ids)
                    if finished:
                        done.add(i)

                scheduler.submit(_start(p, req), "probe", True, sink)
        scheduler.step()
        step += 1
        if step > MAX_STEPS:
            raise CheckFailed(
                CheckFailure(check="batched = alone", detail="the batch stopped making progress")
            )
    for i, req in enumerate(reqs):
        state = _start(p, req)
        for _ in p.engine.stream(state):
            pass
        detail = f"row {i}: {req['strategy']}, {len(req['prompt'])}-token prompt, {req['adapter']}"
        same_tokens("batched = alone", state.output_ids, seen[i], detail)
