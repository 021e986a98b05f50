"""Figures of a report: nearest-rank percentiles, rounded the way every report rounds them."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile. Example: [1, 2, 3, 4] at 0.5 -> 2; at 0.99 -> 4."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def rounded(value: float | None, digits: int = 4) -> float | None:
    """`value` to `digits` places; None stays None (a figure that was not measured)."""
    return None if value is None else round(value, digits)


def spread(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 of `values`, rounded; None when there are none."""
    return {"p50": rounded(percentile(values, 0.5)), "p99": rounded(percentile(values, 0.99))}
