"""What a conformance probe found for one architecture: admitted or not, the checks it passed,
the first failing check (name, step, expected vs got) and the LoRA projections it found.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PROBE_VERSION = 2  # bump when a check changes: cached results of older probes are not reused


class CheckFailure(BaseModel):
    """The first check that failed. `step`: the token, tree node or request index it failed at
    (None: it failed before decoding, e.g. the model could not be built)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: str
    step: int | None = None
    expected: str = ""
    got: str = ""
    detail: str = ""

    def describe(self) -> str:
        """Example: "tree verify at step 3: expected token 17, got 41 (max |logit diff| 0.2)"."""
        text = self.check + (f" at step {self.step}" if self.step is not None else "")
        if self.expected or self.got:
            text += f": expected {self.expected}, got {self.got}"
        return text + (f" ({self.detail})" if self.detail else "")


class ProbeResult(BaseModel):
    """One probe run, as cached on disk and shown by `specserve models show`."""

    model_config = ConfigDict(extra="forbid")

    architecture: str  # the causal-LM class (`Starcoder2ForCausalLM`) or the config class
    model_type: str
    transformers_version: str
    probe_version: int = PROBE_VERSION
    fingerprint: str = ""  # digest of the tiny config: the architecture's features
    admitted: bool
    passed: list[str] = Field(default_factory=list)  # checks passed, in order
    failure: CheckFailure | None = None
    lora_targets: list[str] = Field(default_factory=list)  # default: attention projections
    projections: list[str] = Field(default_factory=list)  # attention + MLP projections found
    lora_checked: list[str] = Field(default_factory=list)  # those the probe's LoRA was on
    seconds: float = 0.0

    def reason(self) -> str:
        """One line: why it is served or refused."""
        if self.admitted:
            return f"admitted by probe ({len(self.passed)} checks: {', '.join(self.passed)})"
        assert self.failure is not None
        return f"refused by probe: {self.failure.describe()}"
