"""The serving core without Ray: policy choice, variants, exact output, streaming, turn-taking."""

from __future__ import annotations

import asyncio
import copy
import time

import pytest
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec
from specserve.engine.sampling import SamplingParams
from specserve.engine.tuning.cost import CostCurve
from specserve.models.load import LoadedModel
from specserve.platform.events import Delta, Done, Usage
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.service import ModelService, Overloaded
from specserve.policies.router import DrafterView
from specserve.policies.settings import PolicySettings

PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9"


@pytest.fixture
def service(tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    loaded = LoadedModel(base, WordTokenizer(), "tiny", None, None, frozenset())
    adapters = ResidentAdapters(base, ["tiny-llama"], AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings(), clock=lambda: 1e6)
    yield service
    service.stop()


def _run(service, request):
    async def collect():
        return [event async for event in service.generate(request)]

    return asyncio.run(collect())


def _request(target=None, strategy=None, max_new=20):
    return GenerateRequest(
        target=target or Target(),
        prompt=PROMPT,
        params=SamplingParams(max_new_tokens=max_new),
        strategy=strategy,
    )


def test_base_request_streams_the_engine_output(service, tiny_llama):
    events = _run(service, _request())
    deltas, done = events[:-1], events[-1]
    expected = Engine(
        copy.deepcopy(tiny_llama(1, init_range=0.1)), WordTokenizer(), frozenset()
    ).generate([5, 9, 14, 3, 5, 9, 14, 7, 5, 9], SamplingParams(max_new_tokens=20))
    assert all(isinstance(e, Delta) for e in deltas) and isinstance(done, Done)
    assert "".join(e.text for e in deltas) == expected.text
    assert done.usage == Usage(prompt_tokens=10, completion_tokens=20, total_tokens=30)
    assert done.specserve.strategy == "lookahead" and done.specserve.reason
    assert done.specserve.replica is None and "replica" not in done.model_dump()["specserve"]


def test_variant_request_equals_merged_adapter(service, make_adapter, merge_adapter, tiny_llama):
    base = tiny_llama(1, init_range=0.1)
    path = make_adapter("v", base, seed=7)
    target = Target(name="v", version=1, adapter_path=str(path), version_times=[1e6 - 10])
    events = _run(service, _request(target))
    merged = Engine(merge_adapter(base, path), WordTokenizer(), frozenset())
    expected = merged.generate([5, 9, 14, 3, 5, 9, 14, 7, 5, 9], SamplingParams(max_new_tokens=20))
    assert "".join(e.text for e in events[:-1]) == expected.text
    done = events[-1].specserve
    assert (done.variant, done.version, done.strategy) == ("v", 1, "lookahead")
    assert "changing" in done.reason
    assert service.adapters.names == ["v@1"]


def test_busy_replica_gets_limited_config(service):
    service.ongoing = service.policy.busy_ongoing
    decision, config, _ = service.choose(_request(Target(version_times=[1e6])))
    assert decision.max_draft_tokens == service.policy.busy_max_draft_tokens
    assert (config.window + config.guesses) * (config.ngram - 1) <= decision.max_draft_tokens


def test_the_targets_policy_settings_apply_and_cross_the_wire_typed(service):
    stable = Target(name="v", version=1, adapter_path="/a", version_times=[0.0])
    decision, _, _ = service.choose(_request(stable))
    assert decision.train_kind == "eagle"  # the server's own policy trains stable variants
    quiet = stable.model_copy(update={"policy": PolicySettings(auto_train=False)})
    decision, _, _ = service.choose(_request(quiet))
    assert decision.train_kind is None and decision.strategy == "lookahead"
    drafter = DrafterView(kind="eagle", state="running", tau=None, artifact_dir=None)
    target = quiet.model_copy(update={"drafters": [drafter]})
    request = _request(target)
    again = GenerateRequest.model_validate(request.model_dump())  # as through a Ray handle
    assert again == request and isinstance(again.target.policy, PolicySettings)
    assert again.target.drafters == [drafter]


def test_concurrent_requests_take_turns_and_all_finish(service):
    async def both():
        async def one(strategy):
            start = time.perf_counter()
            first = None
            async for e in service.generate(_request(strategy=strategy, max_new=30)):
                if first is None:
                    first = time.perf_counter() - start
                last = e
            return first, last

        return await asyncio.gather(one("ar"), one("prompt_lookup"), one("lookahead"))

    results = asyncio.run(both())
    texts = {r[1].specserve.strategy for r in results}
    assert texts == {"ar", "prompt_lookup", "lookahead"} and service.ongoing == 0


def test_cancelled_consumer_frees_the_request(service):
    async def cancel_early():
        agen = service.generate(_request(max_new=60))
        await agen.__anext__()
        assert service.ongoing == 1
        await agen.aclose()
        return service.ongoing

    assert asyncio.run(cancel_early()) == 0 and service.cancelled == 1


def test_prompt_too_long_is_a_value_error(service):
    request = GenerateRequest(
        target=Target(), prompt="w1 " * 1020, params=SamplingParams(max_new_tokens=10)
    )
    with pytest.raises(ValueError, match="prompt"):
        _run(service, request)


def _save_drafter(random_drafter, model, out, adapter_sha, kind_spec):
    """A randomly initialized drafter saved as an artifact for `model` (+ adapter fingerprint)."""
    from specserve.engine.drafters.artifact import base_weights_sha256, save_drafter

    drafter = random_drafter(model, kind_spec, seed=3, scale=0.3)
    manifest = drafter.manifest.model_copy(
        update={
            "base_model_id": "tiny",
            "base_weights_sha256": base_weights_sha256(model),
            "adapter_sha256": adapter_sha,
        }
    )
    save_drafter(out, manifest, drafter.module, drafter.draft_vocab)
    return out


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_stable_variant_with_winning_drafter_is_served_with_it_exactly(
    kind, service, tiny_llama, make_adapter, merge_adapter, random_drafter, tmp_path
):
    from specserve.adapters.fingerprint import adapter_sha256
    from specserve.engine.drafters.modules import EagleSpec, MedusaSpec

    base = tiny_llama(1, init_range=0.1)
    path = make_adapter("stable", base, seed=4)
    sha = adapter_sha256(path)
    service.ensure_variant(Target(name="stable", version=1, adapter_path=str(path)))
    spec = EagleSpec() if kind == "eagle" else MedusaSpec(heads=3, topk=4)
    artifact = _save_drafter(random_drafter, service.adapters.model, tmp_path / kind, sha, spec)
    drafters = [DrafterView(kind=kind, state="succeeded", tau=4.0, artifact_dir=str(artifact))]
    target = Target(
        name="stable",
        version=1,
        adapter_path=str(path),
        adapter_sha256=sha,
        version_times=[0.0],
        drafters=drafters,
    )
    events = _run(service, _request(target))
    done = events[-1].specserve
    assert done.strategy == kind and "beats lookahead" in done.reason
    merged = Engine(merge_adapter(base, path), WordTokenizer(), frozenset())
    expected = merged.generate([5, 9, 14, 3, 5, 9, 14, 7, 5, 9], SamplingParams(max_new_tokens=20))
    assert "".join(e.text for e in events[:-1]) == expected.text


def test_drafter_of_another_version_is_refused_and_lookahead_serves(
    service, tiny_llama, make_adapter, random_drafter, tmp_path
):
    from specserve.adapters.fingerprint import adapter_sha256
    from specserve.engine.drafters.modules import EagleSpec

    base = tiny_llama(1, init_range=0.1)
    v1, v2 = make_adapter("v1", base, seed=1), make_adapter("v2", base, seed=2)
    service.ensure_variant(Target(name="s", version=2, adapter_path=str(v2)))
    artifact = _save_drafter(
        random_drafter, service.adapters.model, tmp_path / "eagle", adapter_sha256(v1), EagleSpec()
    )
    drafters = [DrafterView(kind="eagle", state="succeeded", tau=4.0, artifact_dir=str(artifact))]
    target = Target(
        name="s",
        version=2,
        adapter_path=str(v2),
        adapter_sha256=adapter_sha256(v2),
        version_times=[0.0],
        drafters=drafters,
    )
    decision, _, drafter = service.choose(_request(target))
    assert decision.strategy == "lookahead" and drafter is None
    assert "refused" in decision.reason and "adapter differs" in decision.reason


def test_requested_speculation_beats_the_policy_and_a_force_and_decodes_exactly(
    service, tiny_llama, make_adapter, merge_adapter, random_drafter, tmp_path
):
    """A changing variant forced to prompt_lookup, with a usable eagle drafter: each value the
    request may ask serves that strategy, says so and streams the merged model's tokens (greedy
    and seeded); a drafter it lacks is refused listing what it may ask; it crosses the wire."""
    from specserve.adapters.fingerprint import adapter_sha256
    from specserve.engine.drafters.modules import EagleSpec

    base = tiny_llama(1, init_range=0.1)
    path = make_adapter("asked", base, seed=5)
    sha = adapter_sha256(path)
    service.ensure_variant(Target(name="asked", version=1, adapter_path=str(path)))
    artifact = _save_drafter(
        random_drafter, service.adapters.model, tmp_path / "eagle", sha, EagleSpec()
    )
    drafters = [DrafterView(kind="eagle", state="succeeded", tau=4.0, artifact_dir=str(artifact))]
    target = Target(
        name="asked",
        version=1,
        adapter_path=str(path),
        adapter_sha256=sha,
        version_times=[1e6 - 10],
        drafters=drafters,
        forced_strategy="prompt_lookup",
    )
    merged = Engine(merge_adapter(base, path), WordTokenizer(), frozenset())
    for params in (
        SamplingParams(max_new_tokens=20),
        SamplingParams(max_new_tokens=20, temperature=0.8, seed=3),
    ):
        expected = merged.generate(_prompt_ids(), params).output_ids
        for asked, strategy in [("off", "ar"), ("eagle", "eagle"), ("lookahead", "lookahead")]:
            request = GenerateRequest(
                target=target, prompt=PROMPT, params=params, speculation=asked
            )
            assert request.load_aware and request.requested_strategy == strategy
            events = _run(service, request)
            assert [t for e in events[:-1] for t in e.token_ids] == expected, (asked, params)
            done = events[-1].specserve
            assert done.strategy == strategy
            assert done.reason.startswith(f"requested by the request: speculation={asked}")
    request = GenerateRequest(target=target, prompt=PROMPT, params=params, speculation="eagle")
    assert GenerateRequest.model_validate(request.model_dump()) == request  # as through Ray
    assert not _request(target).load_aware  # the admin's force, unasked: never cut
    with pytest.raises(
        ValueError, match="valid values: off, ar, eagle, hybrid, lookahead, prompt_lookup"
    ):
        GenerateRequest(target=target, prompt=PROMPT, params=params, speculation="medusa")


def _prompt_ids() -> list[int]:
    return [int(w[1:]) for w in PROMPT.split()]


def test_concurrent_variants_share_one_batch_and_each_equals_its_merged_model(
    service, make_adapter, merge_adapter, tiny_llama
):
    """Requests of three variants and the base run as rows of the same forwards, and each
    streams exactly what its own merged model decodes alone (greedy, fp32)."""
    base = tiny_llama(1, init_range=0.1)
    paths = {f"v{i}": make_adapter(f"v{i}", base, seed=10 + i) for i in range(3)}
    widths: list[int] = []
    decode = service.scheduler._decode
    service.scheduler._decode = lambda: (widths.append(len(service.scheduler.decoding)), decode())

    async def all_of_them():
        async def one(name, strategy):
            target = (
                Target()
                if name is None
                else Target(
                    name=name, version=1, adapter_path=str(paths[name]), version_times=[1e6 - 10]
                )
            )
            events = [e async for e in service.generate(_request(target, strategy, max_new=24))]
            return name, "".join(e.text for e in events[:-1])

        jobs = [
            ("v0", "ar"),
            ("v1", "lookahead"),
            ("v2", "prompt_lookup"),
            (None, "lookahead"),
            ("v0", "lookahead"),
            ("v2", "ar"),
        ]
        return await asyncio.gather(*(one(n, s) for n, s in jobs))

    results = asyncio.run(all_of_them())
    for name, text in results:
        model = base if name is None else merge_adapter(base, paths[name])
        expected = Engine(model, WordTokenizer(), frozenset()).generate(
            _prompt_ids(), SamplingParams(max_new_tokens=24)
        )
        assert text == expected.text, name
    assert max(widths) >= 4 and service.ongoing == 0 and service.scheduler.active() == 0


def _one_row_one_place(tiny_llama, adapter_root) -> ModelService:
    """A service with room for one request decoding and one waiting."""
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    loaded = LoadedModel(base, WordTokenizer(), "tiny", None, None, frozenset())
    adapters = ResidentAdapters(base, ["tiny-llama"], AdapterLimits(root=adapter_root))
    return ModelService(
        loaded,
        adapters,
        PoolBook(),
        PolicySettings(),
        clock=lambda: 1e6,
        batch=BatchSettings(max_batch=1, max_queue=1, max_queue_per_tenant=1),
    )


def test_overload_is_refused_fast_and_admitted_requests_complete(tiny_llama, adapter_root):
    """With room for one request decoding and one waiting, a burst of 8 gets 6 Overloaded
    answers, each within 100 ms; the admitted ones finish."""
    service = _one_row_one_place(tiny_llama, adapter_root)

    async def burst():
        async def one():
            start = time.perf_counter()
            try:
                events = [e async for e in service.generate(_request(strategy="ar", max_new=40))]
                return "ok", events[-1].usage.completion_tokens, 0.0
            except Overloaded:
                return "overloaded", 0, time.perf_counter() - start

        return await asyncio.gather(*(one() for _ in range(8)))

    try:
        results = asyncio.run(burst())
    finally:
        service.stop()
    admitted = sum(r[0] == "ok" for r in results)  # claims: the free row and the queue place
    assert admitted == 2 and sum(r[0] == "overloaded" for r in results) == 6
    assert all(r[1] == 40 for r in results if r[0] == "ok")
    assert max(r[2] for r in results) < 0.1
    assert service.ongoing == 0 and service.scheduler.active() == 0


def test_a_full_replica_refuses_without_waiting_for_the_engine_thread(tiny_llama, adapter_root):
    """Places are claimed before a request is prepared on the engine thread: with the queue
    full and the thread busy for a second (a long step), a new request is refused at once."""
    service = _one_row_one_place(tiny_llama, adapter_root)

    async def scenario():
        admitted = [service.generate(_request(strategy="ar", max_new=5)) for _ in range(2)]
        firsts = [asyncio.ensure_future(agen.__anext__()) for agen in admitted]
        await asyncio.sleep(0)  # both claimed their places (one row, one queue place)
        busy = service.scheduler.call(lambda: time.sleep(1.0))
        start = time.perf_counter()
        with pytest.raises(Overloaded):
            await anext(service.generate(_request(strategy="ar", max_new=5)))
        refused_s = time.perf_counter() - start
        for first, agen in zip(firsts, admitted, strict=True):
            await first
            rest = [e async for e in agen]
            assert rest[-1].usage.completion_tokens == 5
        await asyncio.wrap_future(busy)
        return refused_s

    try:
        refused_s = asyncio.run(scenario())
    finally:
        service.stop()
    assert refused_s < 0.1
    assert service.ongoing == 0 and not service.scheduler.claims


def test_twenty_streams_cut_early_leave_the_batch_within_a_step(service):
    """20 streams read 2 deltas each, then the clients go away: their rows leave at the next
    step, and the replica's active count returns to zero."""

    async def cut():
        streams = [service.generate(_request(strategy="ar", max_new=200)) for _ in range(20)]
        for agen in streams:
            await agen.__anext__()
        for agen in streams:
            await agen.__anext__()
        assert service.ongoing == 20
        steps = service.scheduler.steps
        for agen in streams:
            await agen.aclose()
        deadline = time.perf_counter() + 10
        while service.scheduler.active() and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        return service.scheduler.steps - steps

    steps_after = asyncio.run(cut())
    assert service.scheduler.active() == 0 and service.ongoing == 0 and service.cancelled == 20
    assert service.scheduler.kv.rows == 0 and service.scheduler.reserved == 0
    assert steps_after <= 2


def test_request_cancelled_while_being_prepared_releases_its_adapter(
    service, make_adapter, tiny_llama
):
    """A consumer that goes away while the engine thread is preparing its request (loading the
    adapter, taking its hold) leaves no hold behind once the preparation finishes (the dropped
    result's hold is closed when it is freed) and the loop keeps serving the variant."""
    import threading

    path = make_adapter("v", tiny_llama(1, init_range=0.1), seed=7)
    target = Target(name="v", version=1, adapter_path=str(path), version_times=[1e6 - 10])
    entered, gate = threading.Event(), threading.Event()
    ensure = service.ensure_variant

    def slow_ensure(t, prepared=None):
        name = ensure(t, prepared)
        entered.set()
        gate.wait(10)  # preparation is running when the consumer leaves
        return name

    service.ensure_variant = slow_ensure

    async def go():
        agen = service.generate(_request(target, max_new=4))
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.to_thread(entered.wait, 10)
        first.cancel()
        await asyncio.sleep(0.05)
        gate.set()
        service.ensure_variant = ensure
        # runs after the first preparation on the same engine thread, so after its hold closed
        return [e async for e in service.generate(_request(target, max_new=4))]

    events = asyncio.run(go())
    assert events[-1].usage.completion_tokens == 4
    assert all(r.holds == 0 for r in service.adapters._resident.values())
    assert service.ongoing == 0 and service.scheduler.active() == 0


def test_a_cold_adapter_loads_while_the_loop_keeps_decoding(service, make_adapter, tiny_llama):
    """Validation and conversion of a cold adapter run on a worker thread: the engine loop keeps
    decoding another request meanwhile (it would stand still if the load ran on it); only the
    hand-over to the store runs on the loop, between steps."""
    import threading
    import time

    path = make_adapter("cold", tiny_llama(1, init_range=0.1), seed=3)
    target = Target(name="cold", version=1, adapter_path=str(path), version_times=[1e6 - 10])
    prepare = service.adapters.prepare
    seen = {}

    def slow_prepare(name, adapter_path, sha256):
        seen["thread"] = threading.current_thread().name
        start, deadline = service.scheduler.steps, time.monotonic() + 20
        while service.scheduler.steps < start + 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        seen["steps"] = service.scheduler.steps - start
        return prepare(name, adapter_path, sha256)

    service.adapters.prepare = slow_prepare

    async def collect(request):
        return [e async for e in service.generate(request)]

    async def go():
        long = asyncio.ensure_future(collect(_request(strategy="ar", max_new=200)))
        while service.scheduler.stats().decoding == 0:
            await asyncio.sleep(0.005)
        cold = await collect(_request(target, strategy="ar", max_new=4))
        return await long, cold

    long_events, cold_events = asyncio.run(go())
    assert seen["steps"] >= 5 and seen["thread"] != service.scheduler._thread.name
    assert cold_events[-1].usage.completion_tokens == 4
    assert long_events[-1].usage.completion_tokens == 200
    assert service.adapters.names == ["cold@1"]


def test_release_variant_evicts_an_idle_adapter_and_keeps_a_held_one(
    service, make_adapter, tiny_llama
):
    """What Serve's multiplexing unload calls (app._Held): the router no longer places the
    variant here, so its adapter leaves the resident set, unless a request still holds it."""
    base = tiny_llama(1, init_range=0.1)
    for name in ("idle", "busy"):
        service.adapters.ensure(f"{name}@1", make_adapter(name, base, seed=len(name)))
    with service.adapters.hold("busy@1"):
        service.release_variant("busy@1")
        service.release_variant("idle@1")
        assert service.adapters.names == ["busy@1"]
        assert service.adapters.store.names == ["busy@1"]
    service.release_variant("gone@1")  # never resident: nothing to do
    adapters = service.stats().adapters
    assert adapters.resident == 1
    assert adapters.budget_bytes >= adapters.resident_bytes > 0


def test_serves_unload_then_the_objects_finalizer_release_once(service, make_adapter, tiny_llama):
    """Serve calls `_Held.__del__` when it drops a variant; Python calls it again when the object
    is freed, maybe after the variant came back: only the first call evicts."""
    from specserve.platform.rayserve.deployments import _Held

    path = make_adapter("back", tiny_llama(1, init_range=0.1), seed=2)
    service.adapters.ensure("back@1", path)
    held = _Held("back@1", service)
    held.__del__()  # Serve's unload
    assert "back@1" not in service.adapters
    service.adapters.ensure("back@1", path)  # routed here again: loaded again
    del held  # the finalizer of the old object
    assert "back@1" in service.adapters


def _queue_one(service):
    """Start a request on this thread and queue it to the engine loop (no consumer)."""
    (state,), _, hold = service._prepare(_request(max_new=5))
    service.scheduler.submit(state, "", False, lambda step, finished: None)
    return hold


def _wait_for(predicate, timeout_s: float = 10.0) -> float:
    """Seconds until `predicate()` held; fails after `timeout_s`."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "condition not reached"
        time.sleep(0.01)
    return time.monotonic() - start


def test_an_idle_loop_is_healthy_started_or_not(service):
    assert service.health(stall_s=0.05).ok  # not started yet: it starts on the first request
    service.start()
    time.sleep(0.3)  # idle far past the bound: nothing queued, so not a stall
    assert service.health(stall_s=0.05).ok
    assert _run(service, _request(max_new=3))[-1].usage.completion_tokens == 3
    assert service.health(stall_s=0.05).ok


def test_a_dead_engine_loop_is_unhealthy(service, monkeypatch):
    """The loop thread dies when even failing a broken step's requests fails."""
    import threading

    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)

    def broken(*args):
        raise RuntimeError("injected")

    monkeypatch.setattr(service.scheduler, "step", broken)
    monkeypatch.setattr(service.scheduler, "fail_running", broken)
    service.start()
    assert service.health(stall_s=60).ok
    hold = _queue_one(service)
    _wait_for(lambda: not service.scheduler.running)
    health = service.health(stall_s=60)
    assert not health.ok and health.reason == "engine loop thread is dead"
    assert [str(d.exc_value) for d in died] == ["injected"]
    hold.close()


def test_a_hung_engine_loop_with_work_is_unhealthy_after_the_bound(service, monkeypatch):
    import threading

    release = threading.Event()
    step = service.scheduler.step

    def hung():
        release.wait(timeout=30)
        return step()

    monkeypatch.setattr(service.scheduler, "step", hung)
    service.start()
    hold = _queue_one(service)
    assert service.health(stall_s=0.5).ok  # within the bound
    detected = _wait_for(lambda: not service.health(stall_s=0.5).ok)
    assert 0.3 < detected < 2.0
    assert service.health(stall_s=0.5).reason.startswith("engine loop stalled: no step for")
    release.set()
    _wait_for(lambda: service.scheduler.active() == 0)
    assert service.health(stall_s=0.5).ok
    hold.close()


def test_hybrid_merges_the_variants_drafter_and_says_so(
    service, tiny_llama, make_adapter, merge_adapter, random_drafter, tmp_path
):
    """Under `hybrid: true` a stable variant with a usable eagle drafter is served by one hybrid
    tree holding it; one whose drafter is refused (another version's) drafts from n-grams alone
    instead of falling back to lookahead; both stream the merged model's tokens."""
    from specserve.adapters.fingerprint import adapter_sha256
    from specserve.engine.drafters.modules import EagleSpec

    base = tiny_llama(1, init_range=0.1)
    path, other = make_adapter("hy", base, seed=5), make_adapter("other", base, seed=6)
    sha = adapter_sha256(path)
    service.ensure_variant(Target(name="hy", version=1, adapter_path=str(path)))
    merged = Engine(merge_adapter(base, path), WordTokenizer(), frozenset())
    expected = merged.generate(
        [5, 9, 14, 3, 5, 9, 14, 7, 5, 9], SamplingParams(max_new_tokens=20)
    ).text
    for drafter_sha, says in ((sha, "eagle drafter loaded"), (adapter_sha256(other), "alone")):
        artifact = _save_drafter(
            random_drafter,
            service.adapters.model,
            tmp_path / drafter_sha[:8],
            drafter_sha,
            EagleSpec(),
        )
        usable = DrafterView(kind="eagle", state="succeeded", tau=1.2, artifact_dir=str(artifact))
        target = Target(
            name="hy",
            version=1,
            adapter_path=str(path),
            adapter_sha256=sha,
            version_times=[0.0],
            drafters=[usable],
            policy=PolicySettings(hybrid=True),
        )
        decision, _, drafter = service.choose(_request(target))
        assert decision.strategy == "hybrid" and says in decision.reason
        assert (drafter is not None) == (drafter_sha == sha)
        events = _run(service, _request(target))
        assert "".join(e.text for e in events[:-1]) == expected
        done = events[-1].specserve
        assert done.strategy == "hybrid" and set(done.accepted_by_source) <= {
            "eagle",
            "prompt",
            "pool",
        }


# relative(k) = k: a verify of k rows costs k 1-token forwards (easy to check by hand)
LINEAR_CURVE = CostCurve(
    model_id="tiny", device="cpu", dtype="f32", context=8, ms={1: 10.0, 64: 640.0}
)


@pytest.fixture
def costed_service(tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    loaded = LoadedModel(base, WordTokenizer(), "tiny", None, None, frozenset())
    adapters = ResidentAdapters(base, ["tiny-llama"], AdapterLimits(root=adapter_root))
    service = ModelService(
        loaded, adapters, PoolBook(), PolicySettings(), clock=lambda: 1e6, curve=LINEAR_CURVE
    )
    yield service
    service.stop()


def test_ar_costs_one_forward_a_token_and_speculation_its_verify_widths(costed_service):
    ar = _run(costed_service, _request(strategy="ar"))[-1].specserve
    assert ar.decode_tokens == 19 and ar.decode_cost == pytest.approx(19.0)  # 1.00x ar
    looked = _run(costed_service, _request(strategy="prompt_lookup"))[-1].specserve
    assert looked.decode_tokens == 19
    # every step verifies at least its root: cost >= steps, and wider steps cost their width
    assert looked.decode_cost >= looked.forwards - 1
    assert "decode_cost" in looked.model_dump()


def test_a_drafters_levels_are_priced_in(costed_service, random_drafter, tmp_path):
    artifact = _save_drafter(
        random_drafter, costed_service.adapters.model, tmp_path / "e", None, EagleSpec()
    )
    drafters = [DrafterView(kind="eagle", state="succeeded", tau=3.0, artifact_dir=str(artifact))]
    target = Target(version_times=[0.0], drafters=drafters)
    _, _, level_cost = costed_service.drafter(target, "eagle")
    assert level_cost > 0
    done = _run(costed_service, _request(target, strategy="eagle"))[-1].specserve
    # cost = sum of widths + levels x level_cost, and every step drafts at least one level
    assert done.decode_cost >= (done.forwards - 1) * (1 + level_cost)
