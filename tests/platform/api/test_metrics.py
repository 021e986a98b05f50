from specserve.engine.batch.stats import BatchStats
from specserve.platform.api.metrics import Metrics
from specserve.platform.events import Done, DoneInfo, Usage
from specserve.platform.replica_stats import AdapterFigures, Numerics, PoolStats, ReplicaStats


def _done(variant, strategy="lookahead"):
    return Done(
        finish_reason="length",
        usage=Usage(prompt_tokens=3, completion_tokens=12, total_tokens=15),
        specserve=DoneInfo(
            variant=variant,
            version=1,
            strategy=strategy,
            reason="test",
            tau=2.4,
            load_capped_steps=2,
            forwards=5,
            drafted_by_depth=[4, 3],
            accepted_by_depth=[3, 1],
            train_kind=None,
        ),
    )


def test_request_metrics_render():
    m = Metrics()
    m.observe_request("chat", "smollm2-135m", _done("support"), 1.5, 0.2, [0.05, 0.07])
    text = m.render().decode()
    assert (
        'specserve_generated_tokens_total{base_model="smollm2-135m",strategy="lookahead",variant="support"} 12.0'
        in text
    )
    assert (
        'specserve_accepted_steps_total{base_model="smollm2-135m",position="2",strategy="lookahead",variant="support"} 1.0'
        in text
    )
    assert "specserve_itl_seconds_count" in text and "specserve_ttft_seconds_bucket" in text
    assert (
        'specserve_load_capped_steps_total{base_model="smollm2-135m",strategy="lookahead",variant="support"} 2.0'
        in text
    )


def test_variant_labels_are_bounded():
    m = Metrics(max_variants=2)
    labels = [m.variant_label(f"v{i}") for i in range(5)]
    assert labels == ["v0", "v1", "other", "other", "other"]
    assert m.variant_label("v0") == "v0" and m.variant_label(None) == "base"


def test_separate_instances_do_not_share_state():
    a, b = Metrics(), Metrics()
    a.observe_error("chat", 404, "model_not_found")
    assert "model_not_found" in a.render().decode() and "model_not_found" not in b.render().decode()


def _replica_stats(**update) -> ReplicaStats:
    batch = BatchStats(
        waiting=3,
        prefilling=1,
        decoding=16,
        kv_reserved_tokens=5000,
        kv_columns=6000,
        steps=44,
        decode_steps=40,
        decode_rows=600,
        decode_seconds=6.5,
        prefill_tokens=900,
        shared_prefill_tokens=0,
        prefill_seconds=1.25,
        calls_seconds=0.5,
        draft_cap=None,
    )
    adapters = AdapterFigures(
        resident=2, resident_bytes=10, budget_bytes=40, loads=5, evictions=3, load_seconds_total=1
    )
    numerics = Numerics(dtype="torch.float32", invariant=False, invariant_reason="test")
    stats = ReplicaStats(ongoing=7, cancelled=1, batch=batch, adapters=adapters, numerics=numerics)
    return stats.model_copy(update=update)


def test_replica_batch_figures_render():
    m = Metrics()
    m.observe_replica("smol", "r1", _replica_stats())
    text = m.render().decode()
    assert 'specserve_replica_batch{base_model="smol",figure="decoding",replica="r1"} 16.0' in text
    assert 'specserve_replica_batch{base_model="smol",figure="waiting",replica="r1"} 3.0' in text
    assert 'specserve_replica_batch{base_model="smol",figure="draft_cap",replica="r1"} -1.0' in text
    assert 'figure="decode_steps",replica="r1"} 40.0' in text
    assert 'figure="decode_seconds",replica="r1"} 6.5' in text
    assert 'figure="prefill_tokens",replica="r1"} 900.0' in text


def test_replica_adapter_and_pool_figures_render():
    m = Metrics()
    m.observe_replica("smol", "r1", _replica_stats())  # no Serve cache, no pool sync: local
    text = m.render().decode()
    assert (
        'specserve_replica_adapters{base_model="smol",figure="resident",replica="r1"} 2.0' in text
    )
    assert 'figure="variant_cache_size"' not in text
    assert 'specserve_adapter_evictions{base_model="smol",replica="r1"} 3.0' in text
    assert 'specserve_pool_sync_degraded{replica="r1"} 0.0' in text
    adapters = _replica_stats().adapters.model_copy(update={"variant_cache_size": 4})
    m.observe_replica(
        "smol", "r2", _replica_stats(adapters=adapters, pools=PoolStats(sync_ok=False))
    )
    text = m.render().decode()
    assert 'figure="variant_cache_size",replica="r2"} 4.0' in text
    assert 'specserve_pool_sync_degraded{replica="r2"} 1.0' in text


def test_accepted_tokens_by_source_render_and_stay_out_of_the_response_when_empty():
    done = _done("support", "hybrid")
    info = done.specserve.model_copy(update={"accepted_by_source": {"prompt": 3, "pool": 1}})
    m = Metrics()
    m.observe_request("chat", "smollm2-135m", done.model_copy(update={"specserve": info}), 1, 0, [])
    text = m.render().decode()
    assert (
        'specserve_accepted_tokens_by_source_total{base_model="smollm2-135m",source="prompt",strategy="hybrid",variant="support"} 3.0'
        in text
    )
    assert "accepted_by_source" not in _done("support").model_dump()["specserve"]
    assert info.model_dump()["accepted_by_source"] == {"prompt": 3, "pool": 1}
