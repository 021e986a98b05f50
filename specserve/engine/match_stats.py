"""Measured acceptance of n-gram drafts per source and match length, learned online per variant.

`rate(source, depth)` is the probability that a draft token at `depth` is accepted given its
parent was: (accepted + a) / (tried + a + b), a Beta(a, b) prior that the first steps overrule.
Thread-safe: the requests of one variant share one object (it lives beside the variant's pool).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence


class MatchStats:
    """Counts per (source, depth). A source names where a chain came from and how it matched,
    e.g. "prompt:3" (a 3-token suffix found in the prompt or output) or "pool" (the pool).

    Example: with the prior (1, 1), after record("prompt:2", 3, 1) (three tokens verified, the
    first accepted): rate("prompt:2", 1) = (1 + 1) / (1 + 2) = 0.667, rate("prompt:2", 2) =
    (0 + 1) / (1 + 2) = 0.333, rate("prompt:2", 3) = 0.5 (never reached: the prior).
    """

    def __init__(self, prior: tuple[float, float] = (1.0, 1.0), max_depth: int = 64) -> None:
        self.prior = prior
        self.max_depth = max_depth
        self._tried: dict[str, list[int]] = {}
        self._accepted: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def rate(self, source: str, depth: int, prior: tuple[float, float] | None = None) -> float:
        """`prior`: this call's (a, b) in place of the object's (a source trusted less)."""
        a, b = prior or self.prior
        with self._lock:
            tried = self._tried.get(source)
            if not tried or depth > len(tried):
                return a / (a + b)
            return (self._accepted[source][depth - 1] + a) / (tried[depth - 1] + a + b)

    def rates(
        self, source: str, depths: int, prior: tuple[float, float] | None = None
    ) -> list[float]:
        return [self.rate(source, d, prior) for d in range(1, depths + 1)]

    def record(self, source: str, verified: int, matched: int) -> None:
        """One chain's outcome: its first `verified` tokens were verified, the first `matched`
        of them accepted. Depths 1..min(matched + 1, verified) were tried, 1..matched accepted."""
        verified = min(verified, self.max_depth)
        matched = min(matched, verified)
        reached = min(matched + 1, verified)
        if reached < 1:
            return
        with self._lock:
            tried = self._tried.setdefault(source, [])
            accepted = self._accepted.setdefault(source, [])
            if len(tried) < reached:
                tried.extend([0] * (reached - len(tried)))
                accepted.extend([0] * (reached - len(accepted)))
            for d in range(reached):
                tried[d] += 1
            for d in range(matched):
                accepted[d] += 1

    def snapshot(self) -> dict[str, tuple[list[int], list[int]]]:
        """source -> (tried per depth, accepted per depth)."""
        with self._lock:
            return {s: (list(t), list(self._accepted[s])) for s, t in self._tried.items()}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix. Example: [5, 6, 7], [5, 6, 9] -> 2."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
