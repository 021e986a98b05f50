"""THE GATE for continuous batching: every request stepped in a batch (mixed adapters, strategies,
prompt lengths, chunked prefill, requests joining and leaving at random steps) decodes exactly
what it decodes alone, greedy in fp32; plus admission, fairness, cancellation and memory bounds.
"""

from __future__ import annotations

import copy
import os
import random
import threading

import pytest
from schedules import ADAPTERS, alone, prompt, requests, run, with_adapters

from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.batch.tickets import QueueFull
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec
from specserve.engine.sampling import SamplingParams
from specserve.platform.api.metrics import LOOP_TOTALS

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def lora_model(tiny_llama):
    """A tiny Llama holding three resident LoRA adapters that each change the output."""
    return with_adapters(tiny_llama(1, init_range=0.1), ADAPTERS)


@pytest.fixture(scope="module")
def engine(lora_model, tokenizer, random_drafter):
    drafters = {
        "medusa": random_drafter(lora_model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(lora_model, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    return Engine(lora_model, tokenizer, frozenset(), drafters=drafters)


def _linear_cost(k: int) -> float:
    return float(k)  # every token costs the same: speculation never pays, drafts are cut to 0


def _flat_cost(k: int) -> float:
    return 1.0 + k / 1000


@pytest.mark.parametrize(
    ("seed", "cost"), [(0, None), (1, None), (2, None), (3, _linear_cost), (4, _flat_cost)]
)
def test_batched_rows_equal_each_requestalone(engine, seed, cost):
    """Random schedules: 14 requests over 3 adapters + base and 5 strategies, greedy and seeded
    sampling, prompts longer than the prefill chunk, joins and cancellations at random steps."""
    reqs = requests(seed, 14)
    engine.pad_width = (lambda k: 2 * k) if seed == 2 else None  # seed 2: padded batches
    scheduler = Scheduler(engine, BatchSettings(max_batch=6, prefill_chunk=16), cost)
    try:
        seen = run(engine, scheduler, reqs)
    finally:
        engine.pad_width = None
    checked = 0
    for i, req in enumerate(reqs):
        want = alone(engine, req)  # sampled ones too, load caps on or off: seeded samples
        if seen[i].get("cancelled"):
            assert want[: len(seen[i]["ids"])] == seen[i]["ids"]
        else:
            assert seen[i]["ids"] == want, (i, req["strategy"], req["adapter"])
            checked += 1
    assert checked >= 10
    assert seen[-1]["max_rows"] >= 4 and len(seen[-1]["adapters"]) >= 3  # really mixed batches
    assert scheduler.active() == 0 and scheduler.kv.rows == 0 and scheduler.reserved == 0
    if cost is _linear_cost:  # from cap_from_rows rows on, drafts are cut to nothing
        assert 0 in seen[-1]["caps"]


def test_bf16_batched_rows_differ_from_alone_only_at_ties(tiny_llama, tokenizer, random_drafter):
    """The batched path in bf16 (row attention, ragged cache, batched LoRA, drafters): greedy
    outputs equal each request alone except at numerical ties within the measured tolerance."""
    from specserve.engine import ties

    model = with_adapters(copy.deepcopy(tiny_llama(1, init_range=0.1)).bfloat16(), ADAPTERS)
    drafters = {
        "medusa": random_drafter(model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(model, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    engine = Engine(model, tokenizer, frozenset(), drafters=drafters)
    reqs = [r | {"temperature": 0.0, "cancel_at": None} for r in requests(5, 12)]
    scheduler = Scheduler(engine, BatchSettings(max_batch=6, prefill_chunk=16))
    seen = run(engine, scheduler, reqs)
    rng = random.Random(0)
    sequences = [prompt(rng, 40) for _ in range(3)]
    tolerance = max(ties.measure_tolerance(model, sequences, adapter=a).tolerance for a in ADAPTERS)
    assert 0 < tolerance < 0.1
    identical = 0
    for i, req in enumerate(reqs):
        want = alone(engine, req)
        check = ties.check_outputs(
            model, {i: req["prompt"]}, {i: want}, {i: seen[i]["ids"]}, tolerance, req["adapter"]
        )
        assert check.all_ties, (i, req["strategy"], req["adapter"], check)
        identical += check.identical
    assert identical >= len(reqs) // 2
    assert seen[-1]["max_rows"] >= 4


def _start(engine, n_prompt=8, max_new=6, strategy="ar", adapter=None, seed=0):
    ids = prompt(random.Random(seed), n_prompt)
    return engine.start(ids, SamplingParams(max_new_tokens=max_new), strategy, None, None, adapter)


def _sink(log: list, name: str):
    return lambda result, finished: log.append((name, result, finished))


def test_queue_bounds_refuse_at_once(engine):
    scheduler = Scheduler(engine, BatchSettings(max_batch=1, max_queue=3, max_queue_per_tenant=2))
    log: list = []
    for i in range(2):
        scheduler.submit(_start(engine), "a", True, _sink(log, f"a{i}"))
    with pytest.raises(QueueFull, match="for a"):
        scheduler.submit(_start(engine), "a", True, _sink(log, "a2"))
    scheduler.submit(_start(engine), "b", True, _sink(log, "b0"))
    with pytest.raises(QueueFull, match="3 requests waiting"):
        scheduler.submit(_start(engine), "c", True, _sink(log, "c0"))
    with pytest.raises(ValueError, match="KV positions"):
        Scheduler(engine, BatchSettings(kv_tokens=50)).submit(
            _start(engine, max_new=40), "a", True, _sink(log, "big")
        )


def test_claims_hold_places_for_requests_being_prepared(engine):
    """A claim is a place taken before the request exists: free batch rows first, then the
    queue; claims count as waiting for everyone; submit(claimed=True) uses the claim up (no
    second check), unclaim gives it back, a failed claimed submit still uses it up."""
    settings = BatchSettings(max_batch=1, max_queue=2, max_queue_per_tenant=2)
    scheduler = Scheduler(engine, settings)
    log: list = []
    for _ in range(3):  # one free row + two queue places
        scheduler.claim("a")
    with pytest.raises(QueueFull, match="queue full: 2"):
        scheduler.claim("b")
    with pytest.raises(QueueFull):  # a plain submit sees the claims too
        scheduler.submit(_start(engine), "b", True, _sink(log, "b0"))
    scheduler.unclaim("a")
    scheduler.submit(_start(engine), "a", True, _sink(log, "a0"), claimed=True)
    scheduler.submit(_start(engine), "a", True, _sink(log, "a1"), claimed=True)
    assert dict(scheduler.claims) == {} and scheduler.stats().waiting == 2
    scheduler.claim("c")  # the row is still free (the loop has not admitted anyone)
    with pytest.raises(QueueFull):
        scheduler.claim("d")
    with pytest.raises(ValueError, match="KV positions"):
        small = Scheduler(engine, BatchSettings(kv_tokens=50))
        small.claim("a")
        try:
            small.submit(_start(engine, max_new=40), "a", True, _sink(log, "big"), claimed=True)
        finally:
            assert dict(small.claims) == {}


def test_kv_budget_makes_requests_wait_and_memory_stays_bounded(engine):
    settings = BatchSettings(max_batch=8, kv_tokens=2 * (8 + 6 + 4), draft_reserve=4)
    scheduler = Scheduler(engine, settings)
    log: list = []
    for i in range(5):
        scheduler.submit(_start(engine, seed=i), f"t{i}", True, _sink(log, str(i)))
    peak = 0
    while scheduler.active():
        scheduler.step()
        peak = max(peak, len(scheduler.prefilling) + len(scheduler.decoding))
        assert scheduler.reserved <= settings.kv_tokens
    assert peak == 2 and sum(1 for _, _, done in log if done) == 5


def test_stats_account_decode_steps_rows_and_prefill_tokens(engine):
    """The loop's cumulative figures (what `specserve loadtest` reads per level): every decode
    step with the rows it held, every prompt token prefilled (chunked: 4 per step here)."""
    scheduler = Scheduler(engine, BatchSettings(max_batch=3, prefill_chunk=4))
    states = [_start(engine, seed=i, max_new=5) for i in range(3)]
    for i, state in enumerate(states):
        scheduler.submit(state, f"t{i}", True, _sink([], str(i)))
    steps = rows = 0
    while scheduler.active():
        decoding = len(scheduler.decoding)
        scheduler.step()
        steps, rows = steps + (decoding > 0), rows + decoding
    stats = scheduler.stats()
    assert (stats.decode_steps, stats.decode_rows) == (steps, rows) and rows > steps > 0
    assert stats.prefill_tokens == sum(s.prompt_len for s in states)
    assert stats.decode_seconds > 0 and stats.prefill_seconds > 0
    assert set(LOOP_TOTALS) <= set(stats.model_dump())  # what the replica reports of them


def test_one_tenants_burst_does_not_starve_another(engine):
    """Admission is round-robin over tenants: b's single request is admitted right after the
    first of a's ten, not after all of them."""
    scheduler = Scheduler(engine, BatchSettings(max_batch=2))
    log: list = []
    for i in range(10):
        scheduler.submit(_start(engine, seed=i), "a", True, _sink(log, f"a{i}"))
    scheduler.submit(_start(engine, seed=99), "b", True, _sink(log, "b"))
    while scheduler.active():
        scheduler.step()
    finished = [name for name, _, done in log if done]
    assert finished.index("b") <= 2


def test_cancelled_row_leaves_the_batch_at_the_next_step(engine):
    scheduler = Scheduler(engine, BatchSettings(max_batch=4))
    log: list = []
    tickets = [
        scheduler.submit(_start(engine, seed=i, max_new=50), "t", True, _sink(log, str(i)))
        for i in range(3)
    ]
    while len(scheduler.decoding) < 3:
        scheduler.step()
    columns = scheduler.kv.columns
    scheduler.cancel(tickets[1])
    scheduler.step()
    assert [t.id for t in scheduler.decoding] == [tickets[0].id, tickets[2].id]
    assert ("1", None, True) in log and scheduler.reserved == 2 * tickets[0].reserve
    freed = tickets[1].row
    assert scheduler.kv.free == [freed] and not scheduler.kv.visible[freed].any()
    assert scheduler.kv.columns <= columns + 2
    # the next request reuses the free slot: no new row, no whole-cache copy
    scheduler.submit(_start(engine, seed=7, max_new=50), "t", True, _sink(log, "3"))
    while len(scheduler.decoding) < 3:
        scheduler.step()
    assert scheduler.kv.rows == 3 and scheduler.slots[freed].id == 4 and not scheduler.kv.free


def test_loop_thread_serves_submissions_and_calls(engine):
    """The loop thread runs calls and requests; it (and so the compute threads it starts) runs
    `niceness` lower than its creator, which keeps its own."""
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    scheduler = Scheduler(engine, BatchSettings(niceness=3)).start()
    try:
        loop = scheduler.call(threading.get_native_id).result(timeout=10)
        assert os.getpriority(os.PRIO_PROCESS, loop) == min(19, mine + 3)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
        done = __import__("threading").Event()
        ids: list[int] = []

        def sink(result, finished):
            if result is not None:
                ids.extend(result.new_ids)
            if finished:
                done.set()

        state = _start(engine, max_new=9)
        assert scheduler.call(lambda: 41 + 1).result(timeout=10) == 42
        scheduler.submit(state, "t", True, sink)
        assert done.wait(timeout=60)
        req = {
            "prompt": state.tokens[: state.prompt_len],
            "strategy": "ar",
            "adapter": None,
            "max_new": 9,
            "temperature": 0.0,
            "seed": 0,
        }
        assert ids == alone(engine, req)
    finally:
        scheduler.stop()
    assert not scheduler.running


def test_a_failing_step_ends_the_running_requests_and_the_loop_goes_on(engine):
    """A forward that raises ends the requests it held with the error; the loop keeps serving."""
    scheduler = Scheduler(engine, BatchSettings(max_batch=2)).start()
    try:
        import threading

        events = {name: threading.Event() for name in ("bad", "good")}
        tickets = {}

        def sink_for(name):
            return lambda result, finished: finished and events[name].set()

        original = scheduler._decode
        scheduler._decode = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
        tickets["bad"] = scheduler.submit(_start(engine, max_new=20), "t", True, sink_for("bad"))
        assert events["bad"].wait(timeout=30)
        assert isinstance(tickets["bad"].error, RuntimeError) and scheduler.kv.rows == 0
        scheduler._decode = original
        tickets["good"] = scheduler.submit(_start(engine, max_new=5), "t", True, sink_for("good"))
        assert events["good"].wait(timeout=30) and tickets["good"].error is None
        assert tickets["good"].state.output_ids and scheduler.reserved == 0
    finally:
        scheduler.stop()


def test_heartbeat_tracks_the_loop_and_its_pending_work(engine):
    scheduler = Scheduler(engine, BatchSettings(max_batch=2))
    beat = scheduler.heartbeat()
    assert (beat.started, beat.alive, beat.pending) == (False, False, False)
    scheduler.submit(_start(engine), "a", True, _sink([], "a"))
    assert scheduler.heartbeat().pending  # queued, no loop yet
    scheduler.start()
    done = threading.Event()
    scheduler.submit(_start(engine), "a", True, lambda result, finished: finished and done.set())
    assert done.wait(timeout=30)
    for _ in range(100):  # the first request may still be leaving the batch
        if not scheduler.heartbeat().pending:
            break
        threading.Event().wait(0.05)
    beat = scheduler.heartbeat()
    assert beat.started and beat.alive and not beat.pending and beat.since_beat_s < 2.0
    scheduler.stop()
    assert not scheduler.heartbeat().alive and scheduler.heartbeat().started
