"""Policy settings (specserve/configs/policy.yaml), a pydantic model passed to the router; unknown keys fail."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve.engine.drafters.specs import KIND_NAMES, KindName


class PolicySettings(BaseModel):
    """When a variant counts as changing or stable, when drafters win, and how load gates speculation."""

    model_config = ConfigDict(extra="forbid")

    stability_window_s: float = Field(
        3600.0, gt=0, description="look back this far for new versions"
    )
    changing_versions: int = Field(
        2, ge=1, description="this many versions inside the window = changing"
    )
    min_stable_age_s: float = Field(
        600.0, ge=0, description="a version younger than this is changing"
    )
    drafter_margin: float = Field(
        1.05, ge=1.0, description="a drafter must beat lookahead's tau by this factor"
    )
    lookahead_tau_prior: float = Field(
        1.5, gt=0, description="lookahead tau assumed until measured"
    )
    min_measured_tokens: int = Field(
        256, ge=0, description="live figures count once this many tokens"
    )
    auto_train: bool = Field(
        True, description="queue drafter training for stable variants without one"
    )
    train_kind: KindName = Field("eagle", description="drafter kind auto-training queues")
    drafter_kinds: list[KindName] = Field(
        default_factory=lambda: list(KIND_NAMES),
        description="drafter kinds the policy may pick (each a strategy that needs trained heads)",
    )
    retrain_on_drop: bool = Field(
        True,
        description="ask for a retrain from traffic when a drafter's measured tau drops (the "
        "platform retrains only variants that capture traffic)",
    )
    retrain_below: float = Field(
        0.8, gt=0, le=1, description="measured tau below this x held-out tau counts as a drop"
    )
    retrain_cooldown_s: float = Field(
        3600.0, ge=0, description="a policy retrain at most this often per variant and kind"
    )
    retrain_min_samples: int = Field(
        20, ge=2, description="captured requests a policy retrain needs"
    )
    hybrid: bool = Field(
        False,
        description="serve with the hybrid proposer: n-grams alone while a variant changes or "
        "has no drafter, with its drafter merged in once one is usable (off: lookahead or the "
        "drafter, chosen by tau; see docs/performance.md for where each wins)",
    )
    busy_ongoing: int = Field(
        4, ge=1, description="ongoing requests per replica at which drafts shrink"
    )
    busy_max_draft_tokens: int = Field(
        4, ge=0, description="draft tokens allowed per step when busy"
    )
    saturated_ongoing: int = Field(
        8,
        ge=1,
        description="ongoing requests per replica at which speculation stops (measured on 2 CPU "
        "cores: ar beats forced Lookahead from 8 streams; a GPU replica wants more)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PolicySettings:
        if self.saturated_ongoing <= self.busy_ongoing:
            raise ValueError("saturated_ongoing must be above busy_ongoing")
        if self.train_kind not in self.drafter_kinds:
            raise ValueError(
                f"train_kind {self.train_kind!r} must be one of drafter_kinds {self.drafter_kinds}"
            )
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> PolicySettings:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data.get("policy", data))
