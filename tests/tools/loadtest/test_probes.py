"""Tests for specserve.tools.loadtest.probes: Prometheus figures, engine share, drains."""

from specserve.tools.loadtest import probes

PROM = """\
# HELP specserve_replica_batch A replica's engine loop
# TYPE specserve_replica_batch gauge
specserve_replica_batch{base_model="m",figure="decoding",replica="m/0"} 3.0
specserve_replica_batch{base_model="m",figure="waiting",replica="m/0"} 2.0
specserve_replica_batch{base_model="m",figure="prefilling",replica="m/0"} 1.0
specserve_replica_batch{base_model="m",figure="kv_reserved_tokens",replica="m/0"} 640.0
specserve_replica_batch{base_model="m",figure="draft_cap",replica="m/0"} -1.0
specserve_replica_batch{base_model="m",figure="decoding",replica="m/1"} 4.0
specserve_replica_batch{base_model="m",figure="waiting",replica="m/1"} -1.0
specserve_replica_batch{base_model="m",figure="kv_reserved_tokens",replica="m/1"} 900.0
specserve_replica_ongoing{base_model="m",replica="m/0"} 3.0
specserve_requests_total{base_model="m",note="say \\"hi\\", ok"} 7.0
specserve_store_up 1.0
"""


def test_prom_values_filters_by_name_and_label_subset():
    decoding = probes.prom_values(PROM, "specserve_replica_batch", {"figure": "decoding"})
    assert decoding == [3.0, 4.0]
    only_m0 = {"figure": "decoding", "replica": "m/0"}
    assert probes.prom_values(PROM, "specserve_replica_batch", only_m0) == [3.0]
    assert probes.prom_values(PROM, "specserve_replica_ongoing") == [3.0]
    assert probes.prom_values(PROM, "specserve_store_up") == [1.0]
    assert probes.prom_values(PROM, "specserve_replica") == []  # a prefix is not a match
    quoted = {"note": 'say "hi", ok'}
    assert probes.prom_values(PROM, "specserve_requests_total", quoted) == [7.0]


def test_batch_active_and_kv_reserved_skip_unknown_figures():
    assert probes.batch_active(PROM) == 3.0 + 2.0 + 1.0 + 4.0  # waiting -1 on m/1 skipped
    assert probes.kv_reserved(PROM) == 900.0
    assert probes.kv_reserved("specserve_store_up 1.0\n") is None
    assert probes.batch_active("") == 0


def _engine_prom(steps, rows, decode_s, tokens, prefill_s, replica="m/0") -> str:
    figures = {
        "decode_steps": steps,
        "decode_rows": rows,
        "decode_seconds": decode_s,
        "prefill_tokens": tokens,
        "prefill_seconds": prefill_s,
    }
    return "".join(
        f'specserve_replica_batch{{base_model="m",figure="{f}",replica="{replica}"}} {v}\n'
        for f, v in figures.items()
    )


def test_engine_share_of_a_level_from_figures_scraped_around_it():
    before = probes.engine_figures(_engine_prom(10, 100, 1.0, 500, 1.0))
    after = probes.engine_figures(
        _engine_prom(60, 500, 7.0, 2000, 2.0) + _engine_prom(50, 700, 6.0, 2000, 3.5, "m/1")
    )
    assert after == {
        "decode_steps": 110.0,
        "decode_rows": 1200.0,
        "decode_seconds": 13.0,
        "prefill_tokens": 4000.0,
        "prefill_seconds": 5.5,
    }
    # two replicas over 20 s: 100 decode steps of 11 rows in 12 s, 3,500 prompt tokens in 4.5 s
    share = probes.engine_share(before, after, 20.0)
    assert share == {
        "busy_fraction": 0.825,
        "decode_steps": 100,
        "rows_per_step": 11.0,
        "decode_ms_per_step": 120.0,
        "prefill_ms_per_token": 1.29,
        "prefill_fraction": 0.225,
    }
    idle = probes.engine_share(after, after, 5.0)
    assert idle["decode_steps"] == 0 and idle["rows_per_step"] is None
    assert idle["prefill_ms_per_token"] is None and idle["busy_fraction"] == 0.0


def test_engine_figures_unknown_when_a_figure_is_missing():
    assert probes.engine_figures(None) is None
    assert probes.engine_figures(PROM) is None  # an older server: no engine figures
    assert probes.engine_share(None, {}, 1.0) is None


def test_seconds_to_zero_per_probe_and_gives_up():
    readings = iter([2, 1, 0])
    out = probes.seconds_to_zero(
        {"drains": lambda: next(readings), "stuck": lambda: None}, poll_s=0.01, limit_s=0.1
    )
    assert out["drains"] is not None and 0.015 <= out["drains"] < 0.1
    assert out["stuck"] is None
