"""The registry's records (pydantic, frozen): what an admin registers, each version, drafter status
(with its retrains from traffic), acceptance figures, a variant's traffic capture settings, and
`VariantState`, the one read of a variant that gateway and admin share.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specserve.adapters.variants import VariantKey
from specserve.engine.drafters.specs import KindName as DrafterKind
from specserve.policies.router import DrafterView, VariantView
from specserve.training.traffic import HeldoutFigures

DrafterState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
RetrainState = Literal["queued", "running", "replaced", "kept", "failed"]
RetrainTrigger = Literal["admin", "policy"]
MAX_RETRAINS = 10  # retrain records a drafter status keeps, newest last
HintValue = str | int | float | bool

_BASE_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_name(name: str) -> str:
    """A variant name by VariantKey's rules (1-64 letters, digits, '_' or '-'); ValueError if not."""
    VariantKey(name, 1)
    return name


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VariantSpec(_Record):
    """What an admin registers: every registration of a name is its next version."""

    name: str
    base_model: str
    adapter_path: str = Field(min_length=1, max_length=4096)
    adapter_sha256: str
    hints: dict[str, HintValue] = Field(default_factory=dict, description="policy hints")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("base_model")
    @classmethod
    def _base(cls, v: str) -> str:
        if not _BASE_MODEL.fullmatch(v):
            raise ValueError(f"base model {v!r}: 1-128 letters, digits, '_', '.' or '-'")
        return v

    @field_validator("adapter_sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not _SHA256.fullmatch(v):
            raise ValueError("adapter_sha256: 64 lowercase hex digits")
        return v

    @field_validator("hints")
    @classmethod
    def _hints(cls, v: dict[str, HintValue]) -> dict[str, HintValue]:
        long = any(len(k) > 64 or (isinstance(x, str) and len(x) > 256) for k, x in v.items())
        if len(v) > 32 or long:
            raise ValueError("hints: at most 32, keys up to 64 characters, strings up to 256")
        return v


class VersionRecord(VariantSpec):
    """One registered version. Reads ignore fields they do not know (written by newer code)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int = Field(ge=1)
    created_at: float = Field(description="registration time, seconds since the epoch")

    @property
    def key(self) -> VariantKey:
        return VariantKey(self.name, self.version)


class CaptureSettings(_Record):
    """Traffic capture of one variant (all its versions), set by the admin; off by default."""

    enabled: bool = False
    max_samples: int = Field(200, ge=1, le=10_000, description="the newest kept, older dropped")
    retention_s: float = Field(
        7 * 86400.0, gt=0, le=90 * 86400.0, description="a sample is dropped this old"
    )
    max_chars: int = Field(
        8000, ge=1, le=100_000, description="prompt and answer each cut to this many characters"
    )


class RetrainRecord(_Record):
    """One retrain of a drafter from the variant's traffic: the candidate revision, the held-out
    figures of the current drafter and the candidate on the same recent requests, and the
    decision with its reason (`replaced`: the candidate serves now; `kept`: it did not beat)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    revision: int = Field(ge=1, description="the candidate drafter's revision")
    state: RetrainState
    trigger: RetrainTrigger = "admin"
    progress: float = Field(0.0, ge=0.0, le=1.0)
    reason: str = ""
    samples: int = Field(0, ge=0, description="captured requests it read")
    heldout: int = Field(0, ge=0, description="of those, the most recent, held out")
    current: HeldoutFigures | None = None
    candidate: HeldoutFigures | None = None
    started_at: float = 0.0
    finished_at: float | None = None


class DrafterStatus(_Record):
    """Drafter training for one variant@version and kind, as the training job reports it; the
    serving fields (state, artifact_dir, tau, revision) change only when a drafter is installed.
    Unknown fields are ignored (records written by newer code stay readable)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: DrafterKind
    state: DrafterState
    progress: float = Field(0.0, ge=0.0, le=1.0)
    artifact_dir: str | None = None
    tau: float | None = Field(None, ge=0.0, description="held-out tokens per target forward")
    error: str | None = None
    updated_at: float = 0.0
    revision: int = Field(1, ge=1, description="which trained drafter serves (retrains count up)")
    retrains: list[RetrainRecord] = Field(default_factory=list, max_length=MAX_RETRAINS)

    @property
    def retrain(self) -> RetrainRecord | None:
        """The latest retrain from traffic, if any."""
        return self.retrains[-1] if self.retrains else None

    def with_retrain(self, record: RetrainRecord) -> DrafterStatus:
        """This status with `record` as its latest retrain (replacing the record of the same
        retrain, by its start time); the oldest records beyond MAX_RETRAINS are dropped."""
        kept = [r for r in self.retrains if r.started_at != record.started_at]
        return self.model_copy(update={"retrains": [*kept, record][-MAX_RETRAINS:]})


class Acceptance(_Record):
    """Accumulated figures of one strategy on one variant@version; `costed_tokens` decode tokens
    of requests served with a cost curve cost `cost_milli` thousandths of a 1-token forward."""

    tokens: int = 0
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    costed_tokens: int = 0
    cost_milli: int = 0

    def __add__(self, other: Acceptance) -> Acceptance:
        return Acceptance(
            **{f: getattr(self, f) + getattr(other, f) for f in Acceptance.model_fields}
        )

    @property
    def tau(self) -> float | None:
        """Tokens per target forward (None before any forward)."""
        return self.tokens / self.forwards if self.forwards else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def speedup(self) -> float | None:
        """Decode tokens per 1-token forward of cost: the measured speed against `ar` (1.0).
        Example: 800 tokens for 400,000 milli-forwards -> 2.0."""
        return self.costed_tokens * 1000 / self.cost_milli if self.cost_milli else None


class VariantInfo(_Record):
    """A variant's versions (oldest first), the current one, and its override."""

    name: str
    versions: list[VersionRecord]
    override: str | None = None

    @property
    def current(self) -> VersionRecord:
        return self.versions[-1]


class VariantState(VariantInfo):
    """A variant with one of its versions (`version`, the current one unless asked otherwise) and
    that version's drafters (kind -> status) and acceptance (strategy -> figures)."""

    version: int
    drafters: dict[str, DrafterStatus] = {}
    acceptance: dict[str, Acceptance] = {}
    broken: dict[int, str] = {}  # version -> why it may not be served (Registry.mark_broken)
    capture: CaptureSettings = CaptureSettings()

    @property
    def broken_reason(self) -> str | None:
        """Why this version may not be served; None: it may."""
        return self.broken.get(self.version)

    @property
    def record(self) -> VersionRecord:
        return next(v for v in self.versions if v.version == self.version)

    def policy_view(self) -> VariantView:
        """What the strategy policy reads of this version."""
        return VariantView(
            name=self.name,
            version=self.version,
            version_times=[v.created_at for v in self.versions],
            drafters=[
                DrafterView(kind=d.kind, state=d.state, tau=d.tau, artifact_dir=d.artifact_dir)
                for d in self.drafters.values()
            ],
            measured_tau={s: (a.tau or 0.0, a.tokens) for s, a in self.acceptance.items()},
            measured_speed={
                s: (a.speedup, a.costed_tokens) for s, a in self.acceptance.items() if a.speedup
            },
            forced_strategy=self.override,
        )


class VariantPage(_Record):
    """One page of variants (current versions) in name order: at most `limit` after the cursor,
    and whether more follow (pass the last name as the next cursor)."""

    variants: list[VariantState]
    has_more: bool
