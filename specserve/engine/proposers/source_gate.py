"""When the hybrid proposer pays for a costly source (the EAGLE drafter; the Lookahead window's
rows): only while what the source's tokens add pays for its cost, both measured on this request.
Pure bookkeeping; the caller gives the costs (seconds, or relative forward costs).

Per step with the source: `gain` = accepted tokens it gave past what the other nodes reached,
`base` = the step's tokens without them (accepted - gain + the bonus). Per step: the source's
cost and the rest of the step's. The source runs while gain / base > cost / rest (the speed
with it beats the speed without), and every `explore`-th step regardless, to remeasure.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="skip a costly source on steps it does not pay for")
    explore: int = Field(4, ge=1, description="run it at least every this many steps")
    warmup: int = Field(4, ge=0, description="steps it always runs first (to measure)")
    decay: float = Field(0.8, gt=0, lt=1, description="weight of the past in each average")


class SourceGate:
    """Moving averages of gain, base, the source's cost and the rest of the step's.

    Example (decay 0.5, warm-up 1): a step with the drafter accepting 3 tokens of which 2 past
    the n-grams, the drafter taking 0.01 s of a 0.05 s step: gain 2, base 2 (1 + bonus), ratio
    1.0 > 0.01 / 0.04 = 0.25 -> run. Then steps where the n-grams alone reach the one token
    accepted pull gain toward 0: after three, gain 0.25, base 2 (0.125 < 0.25) -> skip.
    """

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self.gain: float | None = None
        self.base: float | None = None
        self.cost: float | None = None
        self.rest: float | None = None
        self.steps = 0
        self.since_run = 0
        self.skipped = 0

    def run_now(self) -> bool:
        """Whether this step should run the source (counts the step)."""
        self.steps += 1
        run = (
            not self.config.enabled
            or self.steps <= self.config.warmup
            or self.since_run + 1 >= self.config.explore
            or None in (self.gain, self.base, self.cost, self.rest)
            or self.gain / max(self.base, 1e-9) > self.cost / max(self.rest, 1e-9)
        )
        self.since_run = 0 if run else self.since_run + 1
        self.skipped += not run
        return run

    def record_tokens(self, accepted: int, gain: int) -> None:
        """A step that ran the source: `accepted` draft tokens, `gain` of them its own."""
        self.gain = self._mix(self.gain, gain)
        self.base = self._mix(self.base, accepted - gain + 1)

    def record_cost(self, cost: float, rest: float) -> None:
        """A step's cost of the source (0: skipped or free, not recorded) and the rest's."""
        if cost > 0:
            self.cost = self._mix(self.cost, cost)
        self.rest = self._mix(self.rest, rest)

    def _mix(self, average: float | None, value: float) -> float:
        if average is None:
            return float(value)
        return self.config.decay * average + (1 - self.config.decay) * value
