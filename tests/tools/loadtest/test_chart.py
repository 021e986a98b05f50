"""Tests for specserve.tools.loadtest.chart: the report's PNG."""

from specserve.tools.loadtest.chart import plot


def test_plot_writes_a_small_png(tmp_path):
    def level(tok_s, itl):
        return {"throughput_tok_s": tok_s, "itl_p50_s": itl}

    report = {
        "results": {
            "ar": {"1": level(20.0, 0.05), "2": level(35.0, 0.06), "4": level(50.0, 0.08)},
            "policy": {"1": level(30.0, 0.03), "4": level(70.0, None)},
        }
    }
    path = tmp_path / "load.png"
    plot(report, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000
