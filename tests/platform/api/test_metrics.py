from specserve.platform.api.metrics import Metrics
from specserve.platform.events import Done, DoneInfo, Usage


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


def test_replica_batch_figures_render():
    m = Metrics()
    stats = {
        "batch_waiting": 3,
        "batch_decoding": 16,
        "batch_prefilling": 1,
        "batch_kv_reserved_tokens": 5000,
        "batch_draft_cap": None,
        "batch_decode_steps": 40,
        "batch_decode_seconds": 6.5,
    }
    m.observe_replica("smol", "r1", stats)
    text = m.render().decode()
    assert 'specserve_replica_batch{base_model="smol",figure="decoding",replica="r1"} 16.0' in text
    assert 'specserve_replica_batch{base_model="smol",figure="waiting",replica="r1"} 3.0' in text
    assert 'specserve_replica_batch{base_model="smol",figure="draft_cap",replica="r1"} -1.0' in text
    assert 'figure="decode_steps",replica="r1"} 40.0' in text
    assert 'figure="decode_seconds",replica="r1"} 6.5' in text
    assert 'figure="prefill_tokens",replica="r1"} -1.0' in text  # not reported: unknown


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
