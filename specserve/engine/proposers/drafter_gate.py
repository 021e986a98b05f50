"""When the hybrid proposer runs its drafter: only while what the drafter's tokens add pays for
its time, both measured on this request. Pure bookkeeping; the caller gives the seconds.

Per step with the drafter: `gain` = accepted tokens past what the n-gram nodes alone reached,
`base` = the step's tokens without them (accepted - gain + the bonus). Per step: the drafter's
seconds and the rest of the step's. The drafter runs while gain / base > drafter / rest (the
speed with it beats the speed without), and every `explore`-th step regardless, to remeasure.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="skip the drafter on steps it does not pay for")
    explore: int = Field(4, ge=1, description="run it at least every this many steps")
    warmup: int = Field(4, ge=0, description="steps it always runs first (to measure)")
    decay: float = Field(0.8, gt=0, lt=1, description="weight of the past in each average")


class DrafterGate:
    """Moving averages of gain, base, drafter seconds and rest-of-step seconds.

    Example (decay 0.5, warm-up 1): a step with the drafter accepting 3 tokens of which 2 past
    the n-grams, the drafter taking 0.01 s of a 0.05 s step: gain 2, base 2 (1 + bonus), ratio
    1.0 > 0.01 / 0.04 = 0.25 -> run. Then steps where the n-grams alone reach the one token
    accepted pull gain toward 0: after three, gain 0.25, base 2 (0.125 < 0.25) -> skip.
    """

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self.gain: float | None = None
        self.base: float | None = None
        self.drafter_s: float | None = None
        self.rest_s: float | None = None
        self.steps = 0
        self.since_run = 0
        self.skipped = 0

    def run_now(self) -> bool:
        """Whether this step should run the drafter (counts the step)."""
        self.steps += 1
        run = (
            not self.config.enabled
            or self.steps <= self.config.warmup
            or self.since_run + 1 >= self.config.explore
            or None in (self.gain, self.base, self.drafter_s, self.rest_s)
            or self.gain / max(self.base, 1e-9) > self.drafter_s / max(self.rest_s, 1e-9)
        )
        self.since_run = 0 if run else self.since_run + 1
        self.skipped += not run
        return run

    def record_tokens(self, accepted: int, gain: int) -> None:
        """A step that ran the drafter: `accepted` draft tokens, `gain` of them past the
        n-gram nodes."""
        self.gain = self._mix(self.gain, gain)
        self.base = self._mix(self.base, accepted - gain + 1)

    def record_seconds(self, drafter_s: float, rest_s: float) -> None:
        """A step's drafter seconds (0 when skipped: not recorded) and the rest of its time."""
        if drafter_s > 0:
            self.drafter_s = self._mix(self.drafter_s, drafter_s)
        self.rest_s = self._mix(self.rest_s, rest_s)

    def _mix(self, average: float | None, value: float) -> float:
        if average is None:
            return float(value)
        return self.config.decay * average + (1 - self.config.decay) * value
