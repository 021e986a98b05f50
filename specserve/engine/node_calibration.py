"""Calibration of draft-node scores, learned online per variant: how often a verified node with a
predicted acceptance probability p was accepted, per source and bin of p, as a factor on p.
Thread-safe: the requests of one variant share one object (beside the variant's pool).
"""

from __future__ import annotations

import math
import threading

BINS = 8  # bin i holds p in (2^-(i+1), 2^-i]; the last also everything below


def bin_of(p: float) -> int:
    """Example: 1.0 -> 0, 0.6 -> 0, 0.5 -> 1, 0.3 -> 1, 0.2 -> 2, 1e-9 -> 7."""
    if p <= 0:
        return BINS - 1
    return min(BINS - 1, max(0, math.floor(-math.log2(p))))


class NodeCalibration:
    """Per (source, bin): the sum of predicted probabilities of verified nodes and how many of
    them were accepted. `factor` = (accepted + prior) / (predicted + prior): 1 until measured,
    the measured ratio once many nodes were verified.

    Example (prior 2): ten "prompt" nodes predicted 0.6 each, three accepted: factor(0.6) =
    (3 + 2) / (6 + 2) = 0.625, so `calibrated(0.6)` = 0.375; a bin never verified keeps p.
    """

    def __init__(self, prior: float = 1.0) -> None:
        if prior <= 0:
            raise ValueError("prior must be > 0")
        self.prior = prior
        self._predicted: dict[tuple[str, int], float] = {}
        self._accepted: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def factor(self, source: str, p: float) -> float:
        key = (source, bin_of(p))
        with self._lock:
            predicted = self._predicted.get(key, 0.0)
            accepted = self._accepted.get(key, 0)
        return (accepted + self.prior) / (predicted + self.prior)

    def calibrated(self, source: str, p: float) -> float:
        """p times its bin's factor, at most 1."""
        return min(1.0, p * self.factor(source, p))

    def record(self, outcomes: list[tuple[str, float, bool]]) -> None:
        """One step's verified nodes: (source, predicted p before calibration, accepted)."""
        with self._lock:
            for source, p, accepted in outcomes:
                key = (source, bin_of(p))
                self._predicted[key] = self._predicted.get(key, 0.0) + p
                self._accepted[key] = self._accepted.get(key, 0) + int(accepted)

    def snapshot(self) -> dict[str, list[tuple[float, int]]]:
        """source -> per bin (predicted sum, accepted count)."""
        with self._lock:
            sources = {s for s, _ in self._predicted}
            return {
                s: [
                    (round(self._predicted.get((s, b), 0.0), 4), self._accepted.get((s, b), 0))
                    for b in range(BINS)
                ]
                for s in sorted(sources)
            }
