"""The strategy policy: which lossless strategy serves a variant now, and why.

`decide(view, load, settings, now)` is pure: a forced strategy wins; saturation turns speculation
off; a changing variant gets lookahead; a stable one gets its best drafter if its measured speed
(acceptance priced by the cost curve; acceptance alone until measured) beats lookahead's, else
lookahead (and asks for training); a drafter whose measured tau fell below its held-out tau by
`retrain_below` asks for a retrain from traffic; a busy replica shortens drafts.
`requestable(view, strategies)`: which strategies a request may ask for itself on that variant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict

from specserve.engine.drafters.specs import KIND_NAMES
from specserve.policies.settings import PolicySettings


class DrafterView(BaseModel):
    """A trained drafter of one variant version, as the policy reads it (field names as the
    registry's drafter status; `artifact_dir` is where the model server loads it from)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str  # "eagle" | "medusa"
    state: str  # queued | running | succeeded | failed | cancelled
    tau: float | None = None  # held-out tokens per target forward
    artifact_dir: str | None = None


class VariantView(BaseModel):
    """What the policy reads about one variant version (None name = the base model itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    version: int = 0
    version_times: list[float] = []  # created_at of every version, seconds
    drafters: list[DrafterView] = []
    measured_tau: dict[str, tuple[float, int]] = {}  # strategy -> (tau, tokens)
    # strategy -> (decode tokens per 1-token forward of cost, i.e. speed against ar; tokens)
    measured_speed: dict[str, tuple[float, int]] = {}
    forced_strategy: str | None = None


@dataclass(frozen=True)
class Decision:
    strategy: str
    reason: str
    max_draft_tokens: int | None = None  # None: the strategy's own (device-tuned) size
    train_kind: str | None = None  # drafter training the platform should queue, if any
    retrain_kind: str | None = None  # drafter the platform should retrain from traffic, if any


def usable_drafters(view: VariantView) -> list[DrafterView]:
    """The variant's drafters that can serve now: trained and stored."""
    return [d for d in view.drafters if d.state == "succeeded" and d.artifact_dir]


def requestable(view: VariantView, strategies: Iterable[str]) -> list[str]:
    """The strategies among `strategies` a request may ask for on this variant now: each that
    drafts without training, and each drafter kind whose drafter is usable (trained, stored)."""
    usable = {d.kind for d in usable_drafters(view)}
    return [s for s in strategies if s not in KIND_NAMES or s in usable]


def decide(view: VariantView, ongoing: int, settings: PolicySettings, now: float) -> Decision:
    """Example: three versions registered in the last hour, window 1 h -> Decision("lookahead",
    "changing: 3 versions in the last 3600 s (>= 2); lookahead needs no training")."""
    if view.forced_strategy:
        return Decision(view.forced_strategy, f"forced by admin to {view.forced_strategy}")
    if ongoing >= settings.saturated_ongoing:
        return Decision(
            "ar",
            f"saturated: {ongoing} ongoing requests >= {settings.saturated_ongoing}; speculation off",
        )
    base = _by_lifecycle(view, settings, now)
    if ongoing >= settings.busy_ongoing and base.strategy != "ar":
        reason = f"{base.reason}; busy: {ongoing} ongoing >= {settings.busy_ongoing}, drafts cut to {settings.busy_max_draft_tokens} tokens"
        return replace(base, reason=reason, max_draft_tokens=settings.busy_max_draft_tokens)
    return base


def _by_lifecycle(view: VariantView, settings: PolicySettings, now: float) -> Decision:
    if settings.hybrid:
        return _hybrid(view, settings, now)
    changing = _changing_reason(view, settings, now)
    if changing:
        return Decision("lookahead", f"{changing}; lookahead needs no training")
    lookahead_tau = _tau(view, "lookahead", settings) or settings.lookahead_tau_prior
    ready = [
        d for d in view.drafters if d.state == "succeeded" and d.kind in settings.drafter_kinds
    ]
    by_speed = _by_speed(view, [d.kind for d in ready], settings)
    if by_speed is not None:
        drops = [(k, r) for d in ready if (r := _dropped(view, k := d.kind, settings))]
        if not drops:
            return by_speed
        kind, dropped = drops[0]
        return replace(by_speed, reason=f"{by_speed.reason}; {dropped}", retrain_kind=kind)
    scored = [(_tau(view, d.kind, settings) or d.tau or 0.0, d.kind) for d in ready]
    if scored:
        tau, kind = max(scored)
        dropped = _dropped(view, kind, settings)
        retrain = {"retrain_kind": kind} if dropped else {}
        if tau >= settings.drafter_margin * lookahead_tau:
            reason = (
                f"stable; {kind} tau {tau:.2f} beats lookahead {lookahead_tau:.2f} "
                "(speeds not measured yet)"
            )
            return Decision(kind, "; ".join(filter(None, [reason, dropped])), **retrain)
        reason = (
            f"stable; best drafter {kind} tau {tau:.2f} does not beat lookahead {lookahead_tau:.2f}"
            " (speeds not measured yet)"
        )
        return Decision("lookahead", "; ".join(filter(None, [reason, dropped])), **retrain)
    pending = [d.kind for d in view.drafters if d.state in ("queued", "running")]
    if pending:
        return Decision("lookahead", f"stable; {pending[0]} drafter training in progress")
    if settings.auto_train and view.name is not None:
        return Decision(
            "lookahead",
            f"stable without a drafter; queueing {settings.train_kind} training",
            train_kind=settings.train_kind,
        )
    return Decision("lookahead", "stable without a drafter")


def _hybrid(view: VariantView, settings: PolicySettings, now: float) -> Decision:
    """Hybrid never chooses between a drafter and n-grams: it merges what the variant has.

    Example: a stable variant with a usable eagle drafter -> Decision("hybrid", "stable; hybrid
    of n-grams and its eagle drafter"); the service then says whether the drafter loaded.
    """
    changing = _changing_reason(view, settings, now)
    if changing:
        return Decision("hybrid", f"{changing}; hybrid from n-grams alone (no training)")
    usable = [d.kind for d in usable_drafters(view) if d.kind == "eagle"]
    if usable:
        return Decision("hybrid", "stable; hybrid of n-grams and its eagle drafter")
    train = settings.auto_train and view.name is not None and not view.drafters
    reason = "stable without a drafter; hybrid from n-grams alone"
    if train:
        reason += f"; queueing {settings.train_kind} training"
    return Decision("hybrid", reason, train_kind=settings.train_kind if train else None)


def _changing_reason(view: VariantView, settings: PolicySettings, now: float) -> str | None:
    if not view.version_times:
        return None
    recent = [t for t in view.version_times if now - t <= settings.stability_window_s]
    if len(recent) >= settings.changing_versions and len(view.version_times) > 1:
        return f"changing: {len(recent)} versions in the last {settings.stability_window_s:.0f} s (>= {settings.changing_versions})"
    age = now - max(view.version_times)
    if age < settings.min_stable_age_s:
        return f"changing: version {view.version} is {age:.0f} s old (< {settings.min_stable_age_s:.0f} s)"
    return None


def _by_speed(view: VariantView, kinds: list[str], settings: PolicySettings) -> Decision | None:
    """Drafter or lookahead by measured speed (decode tokens per forward of cost, the cost curve
    pricing each verify width and draft level), once lookahead and a drafter both have one.
    Example: eagle 1.9x (tau 2.4), lookahead 1.5x (tau 1.7) -> Decision("eagle", "stable; eagle
    measured 1.90x ar (tau 2.40) beats lookahead 1.50x (tau 1.70)")."""
    lookahead = _speed(view, "lookahead", settings)
    measured = [(s, k) for k in kinds if (s := _speed(view, k, settings)) is not None]
    if lookahead is None or not measured:
        return None
    speed, kind = max(measured)
    figures = (
        f"{kind} measured {speed:.2f}x ar (tau {_tau(view, kind, settings) or 0:.2f}) "
        f"%s lookahead {lookahead:.2f}x (tau {_tau(view, 'lookahead', settings) or 0:.2f})"
    )
    if speed >= settings.drafter_margin * lookahead:
        return Decision(kind, "stable; " + figures % "beats")
    return Decision("lookahead", "stable; " + figures % "does not beat")


def _speed(view: VariantView, strategy: str, settings: PolicySettings) -> float | None:
    """Measured speed of a strategy against ar once it has served enough costed tokens."""
    speed, tokens = view.measured_speed.get(strategy, (0.0, 0))
    return speed if tokens >= settings.min_measured_tokens and speed > 0 else None


def _dropped(view: VariantView, kind: str, settings: PolicySettings) -> str | None:
    """Why `kind`'s drafter should be retrained from the variant's traffic (None: it should not):
    its measured tau fell below `retrain_below` x the tau it had on held-out data.

    Example: held-out tau 2.0, measured 1.4 over 300 tokens, retrain_below 0.8 -> "eagle measured
    tau 1.40 < 0.80 x held-out 2.00; asking for a retrain from traffic".
    """
    if not settings.retrain_on_drop or view.name is None:
        return None
    held = [d.tau for d in view.drafters if d.kind == kind and d.state == "succeeded" and d.tau]
    live = _tau(view, kind, settings)
    if not held or live is None or live >= settings.retrain_below * held[0]:
        return None
    return (
        f"{kind} measured tau {live:.2f} < {settings.retrain_below:.2f} x held-out "
        f"{held[0]:.2f}; asking for a retrain from traffic"
    )


def _tau(view: VariantView, strategy: str, settings: PolicySettings) -> float | None:
    """Live tau of a strategy once it has served enough tokens."""
    tau, tokens = view.measured_tau.get(strategy, (0.0, 0))
    return tau if tokens >= settings.min_measured_tokens and tau > 0 else None
