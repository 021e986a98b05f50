"""Tests for specserve.tools.loadtest.levels and .stats: percentiles, summaries, the task mix."""

from specserve.tools.loadtest import levels
from specserve.tools.loadtest.levels import Level, Sample, summarize
from specserve.tools.loadtest.stats import percentile


def test_percentile_nearest_rank_against_reference():
    assert percentile([1, 2, 3, 4], 0.5) == 2 and percentile([1, 2, 3, 4], 0.99) == 4
    assert percentile([], 0.5) is None
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]
    for q in (0.1, 0.25, 0.5, 0.9, 0.99):
        ordered = sorted(values)
        reference = next(v for i, v in enumerate(ordered, 1) if i / len(ordered) >= q)
        assert percentile(values, q) == reference


def test_summarize_counts_failures_and_throughput():
    level = Level(
        [
            Sample(True, 10, 0.5, 0.1, 2.0),
            Sample(True, 30, 1.5, 0.2, 3.0),
            Sample(False, error="x"),
        ],
        4.0,
    )
    out = summarize(level)
    assert out["throughput_tok_s"] == 10.0 and out["failed"] == 1 and out["tau"] == 2.5
    assert (out["ttft_p50_s"], out["ttft_p99_s"]) == (0.5, 1.5)


def test_interleave_tasks_takes_each_task_in_turn():
    rows = [
        {"task": t, "turns": [f"{t}{i}"]}
        for t, i in [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    ]
    assert levels.interleave_tasks(rows) == ["a0", "b0", "c0", "a1", "c1"]


def test_level_requests_rounds_up_to_whole_task_cycles():
    """Every level gets whole cycles of the interleaved tasks (the same mix at every level)."""
    assert levels.level_requests(8, 3, 1, 6) == 12
    assert levels.level_requests(8, 3, 16, 6) == 48
    assert levels.level_requests(8, 3, 32, 6) == 96
    assert levels.level_requests(5, 1, 2, 1) == 5
    assert levels.level_requests(0, 0, 1, 0) == 1
