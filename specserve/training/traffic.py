"""A variant's served traffic as drafter training data (pydantic only, no heavy imports): a served
example, the held-out figures a drafter scores on recent traffic, and `replacement`, which decides
whether a retrained drafter replaces the current one (only when it beats it) and says why.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator


class ServedExample(BaseModel):
    """One served request: its prompt (raw text) or chat messages, and the text it was answered
    with (choice 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    output: str
    finish_reason: str = "stop"

    @model_validator(mode="after")
    def _one_prompt(self) -> ServedExample:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a served example has a prompt or messages, not both")
        return self


class HeldoutFigures(BaseModel):
    """A drafter decoding held-out prompts greedily: tokens per target forward (tau) and the
    share of drafted tokens accepted."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # tau, acceptance_rate: computed

    prompts: int = Field(ge=0)
    tokens: int = Field(ge=0)
    forwards: int = Field(ge=0)
    drafted: int = Field(ge=0)
    accepted: int = Field(ge=0)

    @computed_field
    @property
    def tau(self) -> float:
        return round(self.tokens / self.forwards, 4) if self.forwards else 0.0

    @computed_field
    @property
    def acceptance_rate(self) -> float:
        return round(self.accepted / self.drafted, 4) if self.drafted else 0.0


def replacement(
    current: HeldoutFigures | None, candidate: HeldoutFigures, min_gain: float
) -> tuple[bool, str]:
    """(replace, reason): the candidate replaces the current drafter only when its held-out tau
    beats the current one's by more than `min_gain`; with no current drafter it is installed.

    Example: current tau 1.20, candidate 1.45, min_gain 0 -> (True, "held-out tau on recent
    traffic 1.45 beats the current drafter's 1.20 (+0.25 > 0.00)").
    """
    if current is None:
        return True, f"no current drafter; held-out tau on recent traffic {candidate.tau:.2f}"
    gain = candidate.tau - current.tau
    verdict = "beats" if gain > min_gain else "does not beat"
    sign = ">" if gain > min_gain else "<="
    reason = (
        f"held-out tau on recent traffic {candidate.tau:.2f} {verdict} the current drafter's "
        f"{current.tau:.2f} ({gain:+.2f} {sign} {min_gain:.2f}; acceptance "
        f"{candidate.acceptance_rate:.2f} vs {current.acceptance_rate:.2f}, "
        f"{candidate.prompts} held-out prompts)"
    )
    return gain > min_gain, reason
